// Unix-socket registration listener: accepts interposed processes, identifies each peer from the
// kernel when it connects (SO_PEERCRED, a pidfd, /proc: PinPeer in peer_identity.h), refuses a
// request whose connector has exited since, admits it through NodeState, replies with its slot,
// and keeps the connection: when it closes (exit, crash, SIGKILL) the client is unregistered and
// its slot freed.
// One epoll thread; no per-client threads, so 300 processes registering at once cost 300 accepts.
// A tenant cannot exhaust it: connections that have not sent a whole request are capped
// (limits.pending_connections: at the cap the oldest is closed) and closed after
// limits.request_timeout_ms; when the process runs out of descriptors (EMFILE, ENFILE), a
// reserve descriptor is given up to accept and close the waiting connection, so the loop never
// spins on a listening socket it cannot drain.
// The thread also watches the socket's path: deleted or replaced, it binds a new socket there
// within about 250 ms (registered clients keep their connections) and counts the repair.
//
// Usage:
//   RegistrationListener listener(&state, "/run/orion/orion.sock", "/proc");
//   absl::Status st = listener.Start();   // binds (refused if a live socket is there), chmod
//                                         // 0666, starts the thread
//   ...
//   listener.Stop();                      // closes clients, removes the socket file
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/node_state.h"
#include "server/peer_identity.h"

namespace orion::server {

// True if something accepts connections on the Unix socket at path.
bool SocketAnswers(const std::string& path);

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
    uint64_t pending_seq = 0;  // its key in pending_ while unregistered
    contract::RegisterRequest request{};
    absl::StatusOr<PinnedPeer> peer = absl::UnknownError("not accepted");  // pinned at accept
  };
  void Accept();
  // Closes unregistered connections older than the request timeout.
  void ClosePendingPastDeadline(uint64_t now_ns);
  // Sets bound_inode_. With check_live, a socket at the path that still answers a connect is
  // someone's (a running server's): an error, and nothing is unlinked.
  absl::StatusOr<int> BindSocket(bool check_live);
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
  // Unregistered connections in accept order: sequence -> (fd, accepted at). Loop thread only.
  std::map<uint64_t, std::pair<int, uint64_t>> pending_;
  uint64_t next_pending_seq_ = 1;
  int reserve_fd_ = -1;  // given up to accept (and close) a connection when out of descriptors
  uint64_t last_exhausted_log_ns_ = 0;
  uint64_t listen_paused_until_ns_ = 0;  // out of descriptors with no reserve: not watched
  // At the pending cap with no idle connection to close (a burst of honest clients): the
  // listening socket is not watched until one registers or kIdleGraceNs has passed.
  bool paused_for_pending_ = false;
  std::thread thread_;
};

}  // namespace orion::server
