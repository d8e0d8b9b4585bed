// orion-server assembled: board and its areas, node state, registration listener, drain + policy
// thread, the board's heartbeat thread, gRPC admin and agent-sync services (with health and
// reflection), and Prometheus /metrics.
// main() and the integration tests both start the server through this class.
//
// Usage:
//   absl::StatusOr<std::unique_ptr<OrionServer>> s = OrionServer::Start(config, {});
//   (*s)->admin_port();  (*s)->metrics_port();   // real ports when the config asked for :0
//   (*s)->Shutdown();                           // also on destruction
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "prometheus/exposer.h"
#include "server/admin_service.h"
#include "server/config.h"
#include "server/metrics.h"
#include "server/node_state.h"
#include "server/registration_listener.h"

namespace orion::server {

struct ServerOptions {
  std::string proc_root = "/proc";
  bool discover_gpus = true;  // read /proc/driver/nvidia/gpus when the config lists none
};

// GPU UUIDs from /proc/driver/nvidia/gpus/*/information, in PCI order (no driver library needed).
std::vector<std::string> DiscoverGpuUuids(const std::string& driver_proc_dir);

// Makes the folder a socket goes in when it is missing (with missing parents), mode 0755 and
// owned by the server's user, so a fresh machine needs no mkdir. The error names the config key,
// the folder and what to do (run as root, or point the key elsewhere).
absl::Status EnsureSocketFolder(const std::string& socket_path, const char* key,
                                const std::string& source);
// Takes the server's lock (an flock on agent_socket + ".lock", making the agent socket's folder
// with mode 0700 if missing: *created_dir names it) before anything of a running server could
// be touched; returns the descriptor that holds it. A second server of the same config gets an
// error naming the lock.
absl::StatusOr<int> LockServerFiles(const ServerConfig& config, std::string* created_dir);

// Raises the soft RLIMIT_NOFILE to the hard one; returns the soft limit now in force (0 if
// unknown). Start() calls it.
uint64_t RaiseDescriptorLimit();

// True for 127.x.x.x, localhost, [::1] and unix: addresses.
bool IsLoopbackAddress(const std::string& host_port);

// The admin port's credentials: plaintext, or TLS with the configured certificate (and, with
// admin_auth.client_ca_file, client certificates required and verified). Errors name the key.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> AdminCredentials(
    const ServerConfig& config);

class OrionServer {
 public:
  static constexpr int kHeartbeatPeriodMs = 10;
  static absl::StatusOr<std::unique_ptr<OrionServer>> Start(ServerConfig config,
                                                            ServerOptions options);
  ~OrionServer();
  void Shutdown();

  int admin_port() const { return admin_port_; }
  int metrics_port() const { return metrics_port_; }
  NodeState& state() { return *state_; }
  // Connections on the registration socket, registered or not.
  size_t registration_connections() const { return listener_ ? listener_->connected() : 0; }

 private:
  OrionServer() = default;
  void DrainLoop();
  // Beats the board's heartbeat every kHeartbeatPeriodMs, taking no lock: however long a drain
  // pass takes, clients never find the server stale while it runs.
  void HeartbeatLoop();

  std::unique_ptr<NodeState> state_;
  std::unique_ptr<RegistrationListener> listener_;
  std::unique_ptr<AdminAuth> auth_;
  std::unique_ptr<AdminServiceImpl> admin_;
  std::unique_ptr<AgentSyncServiceImpl> agent_sync_;
  std::unique_ptr<grpc::Server> grpc_;        // admin API (TCP)
  std::unique_ptr<grpc::Server> agent_grpc_;  // AgentSync (Unix socket)
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<MetricsCollector> collector_;
  std::thread drain_thread_;
  std::thread heartbeat_thread_;
  absl::Notification stopping_;  // wakes the heartbeat thread at shutdown
  std::atomic<bool> stop_{false};
  int admin_port_ = 0;
  int metrics_port_ = 0;
  int lock_fd_ = -1;               // flock held for the server's life (LockServerFiles)
  std::string agent_socket_;
  std::string created_agent_dir_;  // the agent socket's folder, if this server made it
};

}  // namespace orion::server
