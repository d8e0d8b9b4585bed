// epoll loop of the registration socket (see registration_listener.h).
#include "server/registration_listener.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace orion::server {
namespace {

// At the pending cap, an unfinished connection that has sent nothing this long after its accept
// makes room for a new one.
constexpr uint64_t kIdleGraceNs = 10'000'000;

}  // namespace

RegistrationListener::RegistrationListener(NodeState* state, std::string socket_path,
                                           std::string proc_root)
    : state_(state), socket_path_(std::move(socket_path)), proc_root_(std::move(proc_root)) {}

RegistrationListener::~RegistrationListener() { Stop(); }

bool SocketAnswers(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

absl::StatusOr<int> RegistrationListener::BindSocket(bool check_live) {
  sockaddr_un addr{};
  if (socket_path_.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(socket_path_, ": socket path too long"));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  if (check_live && SocketAnswers(socket_path_)) {
    ::close(fd);
    return absl::AlreadyExistsError(absl::StrCat(
        socket_path_, ": another process listens on this socket (a running orion-server?); "
                      "not starting, and its socket is left alone"));
  }
  ::unlink(socket_path_.c_str());  // a stale socket of a previous server, or what replaced ours
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::PermissionDeniedError(
        absl::StrCat(socket_path_, ": cannot bind client socket: ", std::strerror(err)));
  }
  // Pods run as any user; identity comes from SO_PEERCRED, so everyone may connect.
  ::chmod(socket_path_.c_str(), 0666);
  if (::listen(fd, 1024) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("listen: ", std::strerror(err)));
  }
  struct stat st {};
  bound_inode_ = ::stat(socket_path_.c_str(), &st) == 0 ? st.st_ino : 0;
  return fd;
}

absl::Status RegistrationListener::Start() {
  absl::StatusOr<int> fd = BindSocket(/*check_live=*/true);
  if (!fd.ok()) return fd.status();
  listen_fd_ = *fd;
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void RegistrationListener::RepairSocketIfGone() {
  struct stat st {};
  const bool present = ::stat(socket_path_.c_str(), &st) == 0;
  if (present && S_ISSOCK(st.st_mode) && st.st_ino == bound_inode_) return;
  // Deleted (a cleanup script, a careless `rm -rf /run/orion/*`) or replaced by something else:
  // no new client could reach us. Registered clients keep their connections either way.
  const char* what = present ? "replaced" : "deleted";
  absl::StatusOr<int> fd = BindSocket(/*check_live=*/false);
  if (!fd.ok()) {
    std::fprintf(stderr, "orion-server: client socket %s was %s; binding a new one failed: %s\n",
                 socket_path_.c_str(), what, std::string(fd.status().message()).c_str());
    return;  // tried again on the next pass
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = *fd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, *fd, &ev);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  ::close(listen_fd_);
  listen_fd_ = *fd;
  state_->RecordRepair(absl::StrCat("socket-", what));
  std::fprintf(stderr, "orion-server: client socket %s was %s; listening on a new one\n",
               socket_path_.c_str(), what);
}

void RegistrationListener::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  thread_.join();
  for (auto& [fd, conn] : conns_) {
    if (conn.client_id) state_->Unregister(conn.client_id);
    if (conn.peer.ok() && conn.peer->pidfd >= 0) ::close(conn.peer->pidfd);
    ::close(fd);
  }
  conns_.clear();
  pending_.clear();
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  reserve_fd_ = -1;
  ::close(listen_fd_);
  ::close(epoll_fd_);
  ::close(wake_fd_);
  ::unlink(socket_path_.c_str());
}

void RegistrationListener::Loop() {
  epoll_event events[128];
  // Woken at least every 100 ms: request deadlines are checked that often.
  while (!stop_) {
    int timeout_ms = 100;
    if (const uint64_t now = MonotonicNs(); listen_paused_until_ns_ > now) {
      timeout_ms = static_cast<int>(
          std::min<uint64_t>(100, (listen_paused_until_ns_ - now) / 1'000'000 + 1));
    }
    const int n = ::epoll_wait(epoll_fd_, events, 128, timeout_ms);
    const uint64_t now_ns = MonotonicNs();
    if (now_ns - last_socket_check_ns_ >= 250'000'000ull) {
      last_socket_check_ns_ = now_ns;
      RepairSocketIfGone();
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) continue;
      if (fd == listen_fd_) {
        Accept();
        continue;
      }
      OnReadable(fd);
    }
    ClosePendingPastDeadline(MonotonicNs());
    const size_t max_pending = std::max<uint32_t>(1, state_->config().max_pending_connections);
    if (listen_paused_until_ns_ != 0 &&
        (MonotonicNs() >= listen_paused_until_ns_ ||
         (paused_for_pending_ && pending_.size() < max_pending))) {
      listen_paused_until_ns_ = 0;
      paused_for_pending_ = false;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = listen_fd_;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    }
  }
}

void RegistrationListener::Accept() {
  const size_t max_pending = std::max<uint32_t>(1, state_->config().max_pending_connections);
  for (;;) {
    if (pending_.size() >= max_pending) {
      // At the cap, an idle unfinished connection (nothing sent, accepted kIdleGraceNs ago or
      // more) makes room: a tenant holding connections open cannot keep a new client from
      // registering. Connections whose request is waiting to be read, and young ones (an honest
      // process between connect and send), are not closed: then the rest wait in the kernel's
      // backlog until these register (300 processes starting at once).
      const uint64_t now = MonotonicNs();
      int victim = -1;
      for (const auto& [seq, entry] : pending_) {
        if (now - entry.second < kIdleGraceNs) break;  // accept order: the rest are younger
        int queued = 0;
        if (::ioctl(entry.first, FIONREAD, &queued) == 0 && queued == 0) {
          victim = entry.first;
          break;
        }
      }
      if (victim < 0) {
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        listen_paused_until_ns_ = now + kIdleGraceNs;
        paused_for_pending_ = true;
        return;
      }
      state_->RecordRegistrationFailure("pending-cap");
      Close(victim);
    }
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd_ >= 0) {
        // Out of descriptors: the connection would stay in the backlog and the listening socket
        // readable, so the loop would spin. Give up the reserve, take the connection and close
        // it (its client retries later), and take the reserve back.
        ::close(reserve_fd_);
        const int dropped = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (dropped >= 0) ::close(dropped);
        reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        state_->RecordRegistrationFailure("out-of-descriptors");
        const uint64_t now = MonotonicNs();
        if (now - last_exhausted_log_ns_ > 10'000'000'000ull) {
          last_exhausted_log_ns_ = now;
          std::fprintf(stderr,
                       "orion-server: out of file descriptors (%zu connections); closing new "
                       "registrations until some end (raise the limit, or lower "
                       "limits.pending_connections)\n",
                       conns_.size());
        }
        if (dropped >= 0) continue;
      }
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd_ < 0) {
        // No reserve to give up: stop watching the listening socket for a while instead of
        // spinning on it; Loop() watches it again once the pause is over.
        reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        listen_paused_until_ns_ = MonotonicNs() + 100'000'000ull;
        state_->RecordRegistrationFailure("out-of-descriptors");
      }
      break;  // EAGAIN: the backlog is empty (or an error that the next wake-up retries)
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev) != 0) {
      ::close(c);
      continue;
    }
    Conn conn;
    conn.peer = PinPeer(c, proc_root_);  // who connected, before the socket can change hands
    conn.pending_seq = next_pending_seq_++;
    pending_[conn.pending_seq] = {c, MonotonicNs()};
    conns_[c] = conn;
    ++connected_;
  }
}

void RegistrationListener::ClosePendingPastDeadline(uint64_t now_ns) {
  const uint64_t timeout_ns = state_->config().request_timeout_ms * 1'000'000ull;
  while (!pending_.empty() && now_ns - pending_.begin()->second.second > timeout_ns) {
    state_->RecordRegistrationFailure("request-timeout");
    Close(pending_.begin()->second.first);
  }
}

void RegistrationListener::Reply(int fd, const contract::RegisterReply& reply) {
  // The reply is small and the socket fresh: one send suffices unless the peer is gone.
  (void)!::send(fd, &reply, sizeof(reply), MSG_NOSIGNAL);
}

void RegistrationListener::OnReadable(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  Conn& conn = it->second;
  if (conn.client_id != 0) {
    // Registered: the only thing a client sends later is Goodbye; anything or EOF ends it.
    char buf[256];
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    Close(fd);
    return;
  }
  auto* dst = reinterpret_cast<char*>(&conn.request) + conn.have;
  const ssize_t r = ::recv(fd, dst, sizeof(conn.request) - conn.have, 0);
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (r <= 0) {
    if (conn.have > 0) state_->RecordRegistrationFailure("truncated");
    Close(fd);
    return;
  }
  conn.have += static_cast<size_t>(r);
  // A wrong header is rejected at once instead of waiting for bytes that may never come.
  const contract::MessageHeader& h = conn.request.header;
  const bool header_bad =
      conn.have >= sizeof(contract::MessageHeader) &&
      (h.magic != contract::kWireMagic || h.version != contract::kWireVersion ||
       h.type != static_cast<uint32_t>(contract::MessageType::kRegister) ||
       h.bytes != sizeof(contract::RegisterRequest));
  if (!header_bad && conn.have < sizeof(contract::RegisterRequest)) return;

  contract::RegisterReply reply{};
  reply.header = contract::MakeHeader(contract::MessageType::kRegisterReply, sizeof(reply));
  const absl::Status valid = ValidateRegisterRequest(
      conn.request, header_bad ? sizeof(contract::RegisterRequest) : conn.have);
  auto fail = [&](contract::RegisterStatus status, const std::string& message,
                  const std::string& reason) {
    reply.status = static_cast<uint32_t>(status);
    std::snprintf(reply.message, sizeof(reply.message), "%s", message.c_str());
    state_->RecordRegistrationFailure(reason);
    Reply(fd, reply);
    Close(fd);
  };
  if (!valid.ok()) {
    fail(contract::RegisterStatus::kBadRequest, std::string(valid.message()), "bad-request");
    return;
  }
  if (!conn.peer.ok()) {
    fail(contract::RegisterStatus::kRefused, std::string(conn.peer.status().message()),
         "identity");
    return;
  }
  if (absl::Status alive = PinnedPeerAlive(*conn.peer, proc_root_); !alive.ok()) {
    std::fprintf(stderr, "orion-server: registration refused: %s\n",
                 std::string(alive.message()).c_str());
    fail(contract::RegisterStatus::kRefused, std::string(alive.message()), "connector-exited");
    return;
  }
  NodeState::Admission a = state_->Register(conn.peer->identity, conn.request);
  reply.status = static_cast<uint32_t>(a.status);
  if (a.status != contract::RegisterStatus::kOk) {
    std::snprintf(reply.message, sizeof(reply.message), "%s", a.message.c_str());
    Reply(fd, reply);
    Close(fd);
    return;
  }
  reply.client_id = a.client_id;
  reply.slot = a.slot;
  reply.generation = a.generation;
  reply.gpu = a.gpu;
  reply.priority = static_cast<uint32_t>(a.priority);
  reply.memory_limit_bytes = a.memory_limit_bytes;
  reply.server_epoch = state_->board().epoch();
  conn.client_id = a.client_id;
  pending_.erase(conn.pending_seq);
  // Its identity is taken; the connection's end now tells when it goes.
  if (conn.peer->pidfd >= 0) ::close(conn.peer->pidfd);
  conn.peer->pidfd = -1;
  // The client's view: the board (read-only), its GPU's gate area, its own area and its pod's
  // quota area.
  const int fds[contract::kRegisterFds] = {a.board_fd, a.gate_fd, a.area_fd, a.quota_fd};
  (void)contract::SendWithFds(fd, &reply, sizeof(reply), fds, contract::kRegisterFds);
}

void RegistrationListener::Close(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (it->second.client_id) state_->Unregister(it->second.client_id);
  pending_.erase(it->second.pending_seq);
  if (it->second.peer.ok() && it->second.peer->pidfd >= 0) ::close(it->second.peer->pidfd);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  conns_.erase(it);
  --connected_;
}

}  // namespace orion::server
