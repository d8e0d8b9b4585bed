// Admission: what a registering client gets. Checks a request read off the client socket, and
// decides its priority and limits from the kernel-verified identity, the pod's policy (from the
// agent), an admin override, the standalone rules and orion-run's request. Pure functions, no
// locks, no proto types; NodeState calls them under its mutex.
//
// Usage:
//   if (absl::Status s = ValidateRegisterRequest(request, n); !s.ok()) ...;
//   ClientPolicy p = DecidePolicy(peer, request, config, pod_or_null, override_or_null);
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "contract/orion_contract.h"
#include "server/config.h"
#include "server/peer_identity.h"

namespace orion::server {

// A pod's policy, as the agent reads it from the pod's annotations.
struct PodPolicy {
  std::string pod_uid;
  std::string name, ns;
  contract::Priority priority = contract::Priority::kBestEffort;  // orion/priority
  uint64_t memory_limit_bytes = 0;                                // orion/memory-limit, 0 = none
  uint64_t latency_target_us = 0;  // orion/latency-target-ms, 0 = the server's default
  // Set by AdmitPodPolicy: what the server's policy changed of the annotations.
  bool high_refused = false;            // annotated high in a namespace not allowed it
  uint64_t latency_raised_from_us = 0;  // annotated below policy.min_latency_target_ms
  // The GPUs the device plugin allocated to the pod (the agent's AgentSync); empty: not known,
  // the node's GPUs are allowed.
  std::vector<std::string> gpu_uuids;
  // Of gpu_uuids, those where the pod holds a high-priority device: with gpu_uuids known, a high
  // pod is high only there (PriorityOnGpu).
  std::vector<std::string> high_gpu_uuids;
  // The job the pod's ranks belong to, within its namespace (orion/job, JobSet, Kubeflow);
  // empty: the pod alone is the job (server/jobs.h).
  std::string job;
};

// The pod's priority for a client on `gpu_uuid`: its annotated priority, except that a high
// pod whose allocation is known is best-effort on a GPU where it holds no high-priority device
// (*source then says so).
contract::Priority PriorityOnGpu(const PodPolicy& pod, const std::string& gpu_uuid,
                                 std::string* source);

// What the server decided for a client at registration.
struct ClientPolicy {
  contract::Priority priority = contract::Priority::kBestEffort;
  std::string source = "default";  // pod-annotation, config-rule, orion-run, admin, default
  uint64_t memory_limit_bytes = 0;
  uint64_t latency_target_us = 0;
};

// Priority and limits for a client, strongest source first: an admin override of the pod, the
// pod's annotations (agent), a standalone rule, orion-run's request (standalone only and when
// trusted), the default. A process in a pod never gets its own request honoured. Standalone
// rules match what the kernel says of the peer (comm, exe), never the request's process_name.
// A pod whose high priority AdmitPodPolicy refused gets source "namespace-not-allowed".
ClientPolicy DecidePolicy(const PeerIdentity& peer, const contract::RegisterRequest& request,
                          const ServerConfig& config, const PodPolicy* pod,
                          const contract::Priority* pod_override);

// Applies the cluster admin's bounds to a pod's self-declared annotations: high priority only in
// policy.high_priority_namespaces (when set), latency targets no lower than
// policy.min_latency_target_us. Returns why it changed something ("" if it did not).
std::string AdmitPodPolicy(const PolicyConfig& policy, PodPolicy* pod);

// Checks magic, version, type, size and field ranges of a request read off the socket.
absl::Status ValidateRegisterRequest(const contract::RegisterRequest& request, size_t bytes_read);

// Copies a fixed-size char field that a client filled; never trusts the terminator.
template <size_t N>
std::string FixedString(const char (&field)[N]) {
  return std::string(field, strnlen(field, N));
}

}  // namespace orion::server
