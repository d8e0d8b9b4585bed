// Jobs: the ranks of one training job seen as one thing. Which job a client is a rank of comes
// from the kernel-verified identity and the agent, never from a process in a pod:
//
//   in a pod the agent named:  "<namespace>/<job>", the job the agent computed from the pod
//                              (orion/job annotation, JobSet or Kubeflow labels), else
//                              "<namespace>/<pod>": the pod alone is the job. Scoped by
//                              namespace, so a tenant cannot join another namespace's job.
//   in a pod not named (yet):  "pod-<uid>"
//   standalone:                the name orion-run --job asked for (when requests are trusted);
//                              else "pid-<parent pid>" when its parent is a launcher (such as
//                              torchrun; a shell, sudo, sshd, tmux or systemd is no launcher:
//                              PeerIdentity::launcher_pid), however many of its ranks are
//                              alive; else "pid-<pid>": the process alone. The key is fixed for
//                              a client's life: a key that moved from pid-<pid> to the
//                              launcher's as ranks came and went let a new rank out of a pause
//                              taken on the old key.
//
// A job's view sums its live ranks (ClientViews). Pure functions, no locks; NodeState calls
// them under its mutex.
//
// Usage:
//   JobIdentity j = PodJob(pod.ns, pod.name, pod.job);
//   std::vector<JobView> jobs = GroupJobs(state_clients);
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "contract/orion_contract.h"
#include "server/node_views.h"

namespace orion::server {

// OK, or INVALID_ARGUMENT naming `what` and why (contract::JobNameProblem).
absl::Status CheckJobName(const std::string& name, const std::string& what);

JobIdentity PodJob(const std::string& ns, const std::string& pod_name, const std::string& job);
JobIdentity UnnamedPodJob(const std::string& pod_uid);
// `requested`: a checked orion-run --job name or empty; `launcher`: the launcher's pid, 0 for
// none.
JobIdentity StandaloneJob(const std::string& requested, pid_t pid, pid_t launcher);

// The jobs of these clients (exited ones skipped), by key, each with the GPUs where its
// best-effort ranks meet another job's high-priority clients (JobView::gpus_beside_services).
std::vector<JobView> GroupJobs(const std::vector<ClientView>& clients);

}  // namespace orion::server
