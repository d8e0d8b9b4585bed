// Unix-socket registration listener: accepts interposed processes, identifies each peer from the
// kernel (SO_PEERCRED, /proc), admits it through NodeState, replies with its slot, and keeps the
// connection: when it closes (exit, crash, SIGKILL) the client is unregistered and its slot freed.
// One epoll thread; no per-client threads, so 300 processes registering at once cost 300 accepts.
// The thread also watches the socket's path: deleted or replaced, it binds a new socket there
// within about 250 ms (registered clients keep their connections) and counts the repair.
//
// Usage:
//   RegistrationListener listener(&state, "/run/orion/orion.sock", "/proc");
//   absl::Status st = listener.Start();   // binds, chmod 0666, starts the thread
//   ...
//   listener.Stop();                      // closes clients, removes the socket file
#pragma once

#include <sys/types.h>

#include <atomic>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/node_state.h"

namespace orion::server {

class RegistrationListener {
 public:
  RegistrationListener(NodeState* state, std::string socket_path, std::string proc_root);
  ~RegistrationListener();
  absl::Status Start();
  void Stop();
  size_t connected() const { return connected_.load(); }

 private:
  struct Conn {
    uint32_t client_id = 0;  // 0 until registered
    size_t have = 0;
    contract::RegisterRequest request{};
  };
  absl::StatusOr<int> BindSocket();  // sets bound_inode_
  void RepairSocketIfGone();
  void Loop();
  void OnReadable(int fd);
  void Close(int fd);
  void Reply(int fd, const contract::RegisterReply& reply);

  NodeState* state_;
  std::string socket_path_;
  std::string proc_root_;
  int listen_fd_ = -1;
  ino_t bound_inode_ = 0;
  uint64_t last_socket_check_ns_ = 0;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> connected_{0};
  std::unordered_map<int, Conn> conns_;  // loop thread only
  std::thread thread_;
};

}  // namespace orion::server
