// The views seam of the node's state: what NodeState answers the admin API and the agent with,
// and what they ask of it, as plain values. The gRPC adapter (server/admin_mapping.h) maps them
// to and from orion.v1 messages, so registration, ingest and policy carry no proto types.
//
// Usage:
//   for (const ClientView& c : state.ListClients({.pod = "serve-0"})) ...;
//   absl::StatusOr<TimelineView> v = state.TimelineWindow(gpu, since_ms, until_ms, max);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "contract/orion_contract.h"
#include "server/admission.h"
#include "server/gpu_policy.h"
#include "server/timeline.h"

namespace orion::server {

// The job a client is a rank of (server/jobs.h says how it is found).
struct JobIdentity {
  std::string key;   // unique on the node: what ListJobs names and job-wide actions take
  std::string ns;    // the pods' namespace; empty for standalone and unnamed pods
  std::string name;  // the job's (or pod's, or "pid-N") name, without the namespace
};

// A registered client: who it is (kernel-verified), what it may do, what its area counts.
struct ClientView {
  uint32_t client_id = 0, slot = 0, gpu = 0;
  uint32_t host_pid = 0, uid = 0;
  std::string process_name;
  std::string pod_uid, container_id;
  std::string pod, ns;  // empty until the agent names the pod (and always standalone)
  JobIdentity job;
  ClientPolicy policy;
  bool paused = false;
  // Client-written counters: shown, never trusted for decisions.
  uint64_t memory_used_bytes = 0, memory_peak_bytes = 0;
  uint64_t kernels_launched = 0, throttled_ns = 0, events_dropped = 0;
  uint64_t hold_releases = 0;  // GPU holds opened past their bound (interpose/gpu_hold.h)
  double gpu_busy_seconds = 0;  // its kernels' and graphs' GPU time (orion_client_gpu_busy_...)
  int64_t registered_unix_ms = 0;
  // CPUs the process may use (affinity, cgroup quota) in thousandths, as its interposer found
  // them at start; 0 = unknown or no limit. Informative: a one-CPU pod shows 1000.
  uint32_t usable_millicpus = 0;
  bool exited = false;  // a client that has gone, as it was when it left
  // Its ring's indices were written over repeatedly: its events are dropped unread (counted).
  bool quarantined = false;
  uint64_t events_quarantined = 0;
};

// Which clients ListClients returns; empty fields match all.
struct ClientFilter {
  std::optional<uint32_t> gpu;
  std::string ns, pod;
  bool include_exited = false;  // also the last clients that exited (ClientLifecycleLog)
};

// A job: its live ranks (clients) summed. priority is the ranks' (mixed_priority: they differ);
// paused: every rank is.
struct JobView {
  std::string key, ns, name;
  contract::Priority priority = contract::Priority::kBestEffort;
  bool mixed_priority = false, paused = false;
  uint32_t ranks = 0;
  std::map<uint32_t, uint32_t> ranks_per_gpu;  // board index -> its ranks there (its GPUs)
  std::vector<std::string> pods;     // pod names, distinct, ascending (none standalone)
  std::vector<uint32_t> client_ids;  // its ranks
  double held_seconds = 0;           // the ranks' time held at the gate or paused
  double busy_seconds = 0;           // the ranks' kernel and graph GPU time
  uint64_t memory_used_bytes = 0;
  // GPUs on which its best-effort ranks share the GPU with another job's high-priority clients.
  // Two or more: each rank is held for a different service, and a rank's collective spins on its
  // GPU while a peer is held (docs/design.md, "Multi-GPU jobs").
  uint32_t gpus_beside_services = 0;
};

struct GpuView {
  uint32_t index = 0;
  std::string uuid, node;
  contract::GateMode mode = contract::kDefaultGateMode;
  uint32_t clients = 0, high_priority_clients = 0;
  bool high_priority_busy = false;  // a high-priority client has work on the GPU now
  // Distinct pods with a high-priority client on the GPU (a process in no pod counts alone),
  // the policy's high_priority_per_gpu, and whether the first exceeds the second (a pod promoted
  // to high at run time beside another: the two wait for each other).
  uint32_t high_priority_pods = 0, high_priority_pods_allowed = 1;
  bool high_priority_overcommitted = false;
  double busy_seconds = 0;  // kernel time of every priority since the server started
};

// A client's learned kernel profile, most launched first, and the same in Orion's CSV format.
struct KernelProfileView {
  struct Kernel {
    std::string name;  // the kernel's, or func@0x... where it never reported one
    uint64_t launches = 0, samples = 0;
    double mean_duration_us = 0, p99_duration_us = 0;
    uint32_t max_blocks = 0, threads_per_block = 0;
    std::string kind;  // Orion's class: comp, mem, unknown
  };
  std::vector<Kernel> kernels;
  std::string orion_csv;
};

// The timeline recording window of one GPU, or all (Unix ms; until 0 = open).
struct RecordingChange {
  bool all_gpus = false;
  uint32_t gpu = 0;
  int64_t from_unix_ms = 0, until_unix_ms = 0;
};
struct RecordingWindow {
  uint32_t gpu = 0;
  int64_t from_unix_ms = 0, until_unix_ms = 0;
  uint64_t spans_recorded = 0;  // since the server started
};

// What an agent's pod sync did.
struct PodSync {
  uint32_t pods_known = 0;
  uint32_t clients_updated = 0;  // live clients whose priority or limits changed
};

// Timeline spans as the admin API shows them: each with its name resolved.
struct NamedSpan {
  Span span;
  std::string name;
};
struct TimelineView {
  std::vector<NamedSpan> spans;
  bool truncated = false;           // window: more spans than asked for (the newest kept)
  uint64_t cursor = 0, lost = 0;    // after a cursor: where to resume; spans already overwritten
  int64_t server_now_unix_ns = 0;
};

}  // namespace orion::server
