// orion-server configuration: YAML file -> validated ServerConfig with documented defaults.
//
// Every key is optional; an unknown key, a wrong type or an out-of-range value fails with a message
// naming the file, the key path and what was expected, e.g.
//   /etc/orion/server.yaml: policy.be_budget_us: expected an integer in [0, 1000000], got "fast"
//
// Usage:
//   absl::StatusOr<ServerConfig> cfg = LoadServerConfig("/etc/orion/server.yaml");
//   absl::StatusOr<ServerConfig> cfg = ParseServerConfig(yaml_text, "<inline>");
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "contract/orion_contract.h"
#include "server/board.h"

namespace orion::server {

// The gate knobs' defaults are GateKnobs' (server/board.h), in the config's units.
struct PolicyConfig {
  contract::GateMode mode = GateKnobs{}.mode;
  uint64_t be_budget_us = GateKnobs{}.be_budget_ns / 1000;  // default by mode: DefaultBeBudgetUs
  bool be_budget_set = false;  // policy.be_budget_us was given (it then stays across mode changes)
  uint32_t sm_threshold = GateKnobs{}.sm_threshold;  // thread blocks (mps mode); a BE kernel
                                                     // with more waits for HP idle; 0: no limit
  uint32_t spin_us = GateKnobs{}.spin_ns / 1000;     // spin before blocking on the gate word
  uint32_t hp_stale_ms = static_cast<uint32_t>(GateKnobs{}.hp_stale_ns / 1000000);  // HP inflight
                                                     // older than this no longer holds the gate
  uint32_t hp_grace_us = static_cast<uint32_t>(GateKnobs{}.hp_grace_ns / 1000);  // HP idle this
                                                     // briefly still counts as busy (CPU gaps)
  bool gpu_hold = GateKnobs{}.gpu_hold;  // priority mode: hold best-effort work on the GPU
  uint32_t gpu_hold_max_ms = static_cast<uint32_t>(GateKnobs{}.gpu_hold_max_ns / 1000000);  // its
                                         // bound through one HP busy period; 0: no bound
  uint32_t gpu_hold_release_ms =         // past the bound, BE work waits on the CPU this long
      static_cast<uint32_t>(GateKnobs{}.gpu_hold_release_ns / 1000000);  // at least; 0: until idle
  bool adapt_budget = true;       // adapt be_budget_us to the HP latency target, or without
                                  // one (priority mode) size it to the HP service's requests
  uint64_t default_latency_target_us = 0;  // 0 = no target unless a pod or rule sets one
  // Who may be high priority, decided by the cluster admin rather than by the pods: namespaces
  // whose pods' orion/priority: high is honoured (empty: every namespace); elsewhere such a pod
  // runs best-effort. Latency targets a pod (or orion-run) asks for are raised to the floor, so
  // a tiny target cannot shrink the GPU's best-effort budget to nothing.
  std::vector<std::string> high_priority_namespaces;
  uint64_t min_latency_target_us = 5000;
  // High-priority pods one GPU may hold (the chart's highPriorityPerGpu, which is also the
  // number of orion.io/gpu-high devices the agent advertises per GPU). More than this on one GPU
  // (a pod promoted to high at run time) is flagged: orion_gpu_high_priority_pods above
  // orion_gpu_high_priority_pods_allowed, and high_priority_overcommitted in ListGpus.
  uint32_t high_priority_per_gpu = 1;
};

// Standalone (no Kubernetes) priority rule: first match wins.
struct PriorityRule {
  std::string process_glob;              // matches /proc/<pid>/comm or the file name of
                                         // /proc/<pid>/exe (never the request's name); "" = any
  std::optional<uint32_t> uid;           // unset = any
  contract::Priority priority = contract::Priority::kBestEffort;
  uint64_t memory_limit_bytes = 0;       // 0 = none
  uint64_t latency_target_us = 0;
  std::string exe_glob;                  // matches /proc/<pid>/exe's full path; "" = any. The
                                         // process cannot change it, unlike comm.
};

struct ServerConfig {
  std::string source = "<defaults>";   // file the config came from, for messages
  std::string node_name;                // default: $NODE_NAME, else hostname
  std::string socket_path = contract::kDefaultSocketPath;
  // Loopback by default: the admin API changes priorities, so it is reachable from elsewhere
  // only when configured so, and then with admin_tokens_file (see admin_auth.h).
  std::string admin_address = "127.0.0.1:50051";
  std::string admin_tokens_file;        // empty: no tokens, every caller may do everything
  std::string admin_tls_cert_file;      // TLS for the admin API (with the key); empty: plaintext
  std::string admin_tls_key_file;
  std::string admin_client_ca_file;     // set: callers must present a certificate it signed
  // ServiceAccount tokens ("namespace/name" per role), reviewed by the Kubernetes API server at
  // admin_kubernetes_api (empty: in cluster).
  std::vector<std::string> admin_service_account_operators, admin_service_account_readers;
  std::string admin_kubernetes_api;
  // orion.v1.AgentSync (the agent's pod priorities), apart from the admin API: a Unix socket
  // only root on the node can open, never in socket_path's folder (mounted into pods). Empty
  // in the file: DefaultAgentSocket(socket_path).
  std::string agent_socket;
  std::string metrics_address = "0.0.0.0:9464";
  // UUIDs in board order: the only GPUs clients may name. Empty: those found at start
  // (/proc/driver/nvidia), else added on demand (limits.unlisted_gpus per tenant).
  std::vector<std::string> gpus;
  PolicyConfig policy;
  bool trust_client_requests = true;    // standalone: honour orion-run's priority/limit requests
  std::vector<PriorityRule> rules;
  uint32_t timeline_spans_per_gpu = 200000;
  // NVTX ranges whose name starts with this are a client's requests: their latency (push to the
  // later of pop and the GPU's end of their work) feeds orion_client_request_latency_seconds.
  // Empty: no request histogram.
  std::string request_range_prefix = "request";
  uint32_t hp_latency_window = 2000;    // busy periods kept per HP client for the tail estimate
  std::vector<std::string> kernel_profiles;  // Orion CSV files loaded at start
  // What one tenant may take of the node (limits.*): client slots per pod (processes in a
  // Kubernetes pod, by the pod UID of their cgroup) and per uid (processes in no pod; root is
  // not counted), 0 = no cap; connections on socket_path that have not sent a whole request, and
  // how long one may take to send it.
  uint32_t max_clients_per_pod = 64;
  uint32_t max_clients_per_uid = 64;
  uint32_t max_pending_connections = 128;
  uint32_t request_timeout_ms = 1000;
  // With no gpus configured or found, GPUs a client names join the board on demand: at most
  // this many per tenant (pod, else uid; root not counted). 0 = no cap.
  uint32_t max_unlisted_gpus_per_tenant = 2;
};

absl::StatusOr<ServerConfig> ParseServerConfig(const std::string& yaml_text,
                                               const std::string& source_name);
absl::StatusOr<ServerConfig> LoadServerConfig(const std::string& path);

// agent.sock in a folder beside socket_path's, "<folder>-agent": /run/orion/orion.sock ->
// /run/orion-agent/agent.sock (the server makes the folder, mode 0700).
std::string DefaultAgentSocket(const std::string& socket_path);

// "8Gi", "512Mi", "1G", "1048576" -> bytes. Shared with orion-run and the agent's annotations.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);
absl::StatusOr<contract::Priority> ParsePriority(const std::string& text);
absl::StatusOr<contract::GateMode> ParseGateMode(const std::string& text);
const char* PriorityName(contract::Priority p);
const char* GateModeName(contract::GateMode m);

// The documented default config, as YAML (orion-server --print-default-config).
const char* DefaultConfigYaml();

}  // namespace orion::server
