// Registration and exit lines, rate-limited (see client_lifecycle_log.h).
#include "server/client_lifecycle_log.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/config.h"

namespace orion::server {

ClientLifecycleLog::ClientLifecycleLog(Sink sink, uint32_t lines_per_second, size_t exited_kept)
    : sink_(std::move(sink)), lines_per_second_(lines_per_second), exited_kept_(exited_kept) {
  if (!sink_) {
    sink_ = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  }
}

std::string ClientLifecycleLog::Who(const ClientView& v) {
  const std::string name = v.pod.empty() ? (v.process_name.empty() ? "?" : v.process_name)
                                         : absl::StrCat(v.ns, "/", v.pod);
  return absl::StrCat(name, " (pid ", v.host_pid, ")");
}

void ClientLifecycleLog::Registered(const ClientView& v, uint64_t now_ns) {
  std::string limit = "no memory limit";
  if (v.policy.memory_limit_bytes != 0) {
    limit = absl::StrFormat("memory limit %.0f MiB", v.policy.memory_limit_bytes / 1048576.0);
  }
  Emit(absl::StrCat("orion-server: client ", v.client_id, " registered: ", Who(v), ", uid ",
                    v.uid, ", GPU ", v.gpu, ", ", PriorityName(v.policy.priority), ", ", limit),
       now_ns);
}

void ClientLifecycleLog::Exited(const ClientView& v, uint64_t now_ns) {
  Emit(absl::StrFormat("orion-server: client %u exited: %s, GPU %u, %s, %u kernels, %.3f s held "
                       "at the gate",
                       v.client_id, Who(v), v.gpu, PriorityName(v.policy.priority),
                       v.kernels_launched, v.throttled_ns / 1e9),
       now_ns);
  if (exited_kept_ == 0) return;
  if (exited_.size() == exited_kept_) exited_.pop_front();
  exited_.push_back(v);
  exited_.back().exited = true;
}

void ClientLifecycleLog::Emit(const std::string& line, uint64_t now_ns) {
  if (!window_open_ || now_ns - window_start_ns_ >= 1000000000) {
    window_open_ = true;
    if (suppressed_ > 0) {
      sink_(absl::StrCat("orion-server: ", suppressed_, " registration/exit line(s) left out (",
                         lines_per_second_, " a second at most)"));
      suppressed_ = 0;
    }
    window_start_ns_ = now_ns;
    lines_in_window_ = 0;
  }
  if (lines_in_window_ >= lines_per_second_) {
    ++suppressed_;
    return;
  }
  ++lines_in_window_;
  sink_(line);
}

}  // namespace orion::server
