// The server's account of clients coming and going, for people outside Kubernetes: one stderr
// line per registration and per exit naming the process (name, PID, user) and, for an exit, what
// it did; at most a few lines a second, the rest counted and reported in one line. It also keeps
// the last clients that exited, so timelines and `orion-ctl clients --exited` still name them.
//
// Usage (NodeState, under its mutex):
//   ClientLifecycleLog log;                        // writes to stderr
//   log.Registered(view, MonotonicNs());
//   log.Exited(view, MonotonicNs());               // kept in log.exited() (view.exited = true)
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "server/node_views.h"

namespace orion::server {

class ClientLifecycleLog {
 public:
  using Sink = std::function<void(const std::string& line)>;
  static constexpr uint32_t kDefaultLinesPerSecond = 20;
  static constexpr size_t kDefaultExitedKept = 256;  // a board's worth of slots

  // sink receives whole lines without the newline; null writes them to stderr.
  explicit ClientLifecycleLog(Sink sink = nullptr,
                              uint32_t lines_per_second = kDefaultLinesPerSecond,
                              size_t exited_kept = kDefaultExitedKept);

  void Registered(const ClientView& v, uint64_t now_ns);
  void Exited(const ClientView& v, uint64_t now_ns);

  // The clients that exited, oldest first, at most exited_kept of them.
  const std::deque<ClientView>& exited() const { return exited_; }

  // "train (pid 4321)", or "ns/pod (pid 4321)" for a pod's process: how every line names it.
  static std::string Who(const ClientView& v);

 private:
  void Emit(const std::string& line, uint64_t now_ns);

  Sink sink_;
  const uint32_t lines_per_second_;
  const size_t exited_kept_;
  bool window_open_ = false;
  uint64_t window_start_ns_ = 0;
  uint32_t lines_in_window_ = 0;
  uint64_t suppressed_ = 0;  // lines left out, counted in the next line written
  std::deque<ClientView> exited_;
};

}  // namespace orion::server
