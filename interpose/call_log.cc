// Log mode: the process's own call logs when no server answers (see call_log.h).
#include "interpose/glibc_compat.h"

#include "interpose/call_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace orion::interpose {
namespace {

constexpr size_t kBufferBytes = 64 * 1024;
constexpr size_t kMaxLineBytes = 512;
constexpr int kMaxCalls = 128;

struct CallStat {
  char call[48];
  uint64_t count;
  uint64_t total_ns;
};

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
std::atomic<uint32_t> g_active{0};
char g_dir[256];
char g_process_name[64];
bool g_quiet = false;
bool g_exit_hook = false;
int g_timeline_fd = -1;
int g_metrics_fd = -1;
char g_buffer[kBufferBytes];
size_t g_used = 0;
CallStat g_stats[kMaxCalls];
int g_num_stats = 0;

void Say(const char* what, const char* detail) {
  if (g_quiet) return;
  char line[512];
  const int n = snprintf(line, sizeof(line), "orion: call log %s %s\n", what,
                         detail != nullptr ? detail : "");
  if (n > 0) {
    ssize_t ignored = write(2, line, static_cast<size_t>(n) < sizeof(line) ? n : sizeof(line) - 1);
    (void)ignored;
  }
}

bool WriteAll(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

void StopLocked(const char* why) {
  g_active.store(0, std::memory_order_relaxed);
  Say("stopped:", why);
  g_used = 0;
}

// Opens this process's two files (the pid names them, so a fork child opens its own).
bool OpenLocked() {
  char path[400];
  const int pid = static_cast<int>(getpid());
  snprintf(path, sizeof(path), "%s/timeline.%d.log", g_dir, pid);
  g_timeline_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (g_timeline_fd < 0) {
    Say("not started:", strerror(errno));
    return false;
  }
  snprintf(path, sizeof(path), "%s/metrics.%d.log", g_dir, pid);
  g_metrics_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (g_metrics_fd < 0) {
    Say("not started:", strerror(errno));
    close(g_timeline_fd);
    g_timeline_fd = -1;
    return false;
  }
  char header[160];
  const int n = snprintf(header, sizeof(header), "# orion-call-log 1 pid=%d process=%s\n", pid,
                         g_process_name);
  return n > 0 && WriteAll(g_timeline_fd, header, static_cast<size_t>(n));
}

void FlushLocked() {
  if (g_timeline_fd < 0) return;
  if (g_used > 0 && !WriteAll(g_timeline_fd, g_buffer, g_used)) {
    StopLocked(strerror(errno));
    return;
  }
  g_used = 0;
  char text[kMaxCalls * 96 + 64];
  size_t at = 0;
  at += static_cast<size_t>(snprintf(text, sizeof(text), "# call count total_ns\n"));
  for (int i = 0; i < g_num_stats && at < sizeof(text); ++i) {
    const int n = snprintf(text + at, sizeof(text) - at, "%s %llu %llu\n", g_stats[i].call,
                           static_cast<unsigned long long>(g_stats[i].count),
                           static_cast<unsigned long long>(g_stats[i].total_ns));
    if (n > 0) at += static_cast<size_t>(n);
  }
  if (at > sizeof(text)) at = sizeof(text);
  if (pwrite(g_metrics_fd, text, at, 0) != static_cast<ssize_t>(at) ||
      ftruncate(g_metrics_fd, static_cast<off_t>(at)) != 0) {
    StopLocked(strerror(errno));
  }
}

void CountLocked(const char* call, uint64_t duration_ns) {
  for (int i = 0; i < g_num_stats; ++i) {
    if (strcmp(g_stats[i].call, call) == 0) {
      ++g_stats[i].count;
      g_stats[i].total_ns += duration_ns;
      return;
    }
  }
  if (g_num_stats == kMaxCalls) return;
  CallStat& s = g_stats[g_num_stats++];
  snprintf(s.call, sizeof(s.call), "%s", call);
  s.count = 1;
  s.total_ns = duration_ns;
}

const char* CopyKindName(contract::CopyDirection d) {
  switch (d) {
    case contract::CopyDirection::kHostToDevice: return "h2d";
    case contract::CopyDirection::kDeviceToHost: return "d2h";
    case contract::CopyDirection::kDeviceToDevice: return "d2d";
    case contract::CopyDirection::kHostToHost: return "h2h";
    case contract::CopyDirection::kUnknown: break;
  }
  return "unknown";
}

void FlushAtExit() { FlushCallLog(); }

}  // namespace

bool CallLogActive() { return g_active.load(std::memory_order_relaxed) != 0; }

uint64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool StartCallLog(const char* dir, const char* process_name, bool quiet) {
  pthread_mutex_lock(&g_mu);
  bool ok = g_active.load(std::memory_order_relaxed) != 0;
  if (!ok && dir != nullptr && dir[0] != '\0') {
    g_quiet = quiet;
    snprintf(g_dir, sizeof(g_dir), "%s", dir);
    snprintf(g_process_name, sizeof(g_process_name), "%s",
             process_name != nullptr ? process_name : "?");
    for (char* c = g_process_name; *c != '\0'; ++c) {
      if (*c == ' ' || *c == '\t' || *c == '\n') *c = '_';
    }
    mkdir(g_dir, 0755);  // may exist
    ok = OpenLocked();
    if (ok) {
      g_active.store(1, std::memory_order_release);
      if (!g_exit_hook) {
        g_exit_hook = true;
        atexit(FlushAtExit);
      }
      Say("writing to", g_dir);
    }
  }
  pthread_mutex_unlock(&g_mu);
  return ok;
}

void LogCall(const char* call, const char* name, uint64_t start_unix_ns, uint64_t duration_ns,
             uint64_t bytes, contract::CopyDirection direction, bool is_copy) {
  char line[kMaxLineBytes];
  int n = snprintf(line, sizeof(line), "%llu\t%llu\t%s\t", static_cast<unsigned long long>(start_unix_ns),
                   static_cast<unsigned long long>(duration_ns), call);
  if (n <= 0) return;
  size_t at = static_cast<size_t>(n);
  // The name, with tabs and newlines (never in a kernel name, but never trusted) made spaces.
  const char* src = (name != nullptr && name[0] != '\0') ? name : "-";
  for (; *src != '\0' && at + 64 < sizeof(line); ++src) {
    line[at++] = (*src == '\t' || *src == '\n' || *src == '\r') ? ' ' : *src;
  }
  n = snprintf(line + at, sizeof(line) - at, "\t%llu\t%s\n", static_cast<unsigned long long>(bytes),
               is_copy ? CopyKindName(direction) : "-");
  if (n <= 0) return;
  at += static_cast<size_t>(n);
  pthread_mutex_lock(&g_mu);
  if (g_active.load(std::memory_order_relaxed) != 0) {
    if (g_timeline_fd < 0 && !OpenLocked()) {  // a fork child's first call
      StopLocked("cannot open this process's files");
    } else {
      if (g_used + at > sizeof(g_buffer)) FlushLocked();
      if (g_active.load(std::memory_order_relaxed) != 0) {
        memcpy(g_buffer + g_used, line, at);
        g_used += at;
        CountLocked(call, duration_ns);
      }
    }
  }
  pthread_mutex_unlock(&g_mu);
}

void FlushCallLog() {
  pthread_mutex_lock(&g_mu);
  if (g_active.load(std::memory_order_relaxed) != 0) FlushLocked();
  pthread_mutex_unlock(&g_mu);
}

void ResetCallLogAfterFork() {
  pthread_mutex_init(&g_mu, nullptr);
  // The parent's buffered lines and counts are the parent's to write.
  g_used = 0;
  g_num_stats = 0;
  if (g_timeline_fd >= 0) close(g_timeline_fd);
  if (g_metrics_fd >= 0) close(g_metrics_fd);
  g_timeline_fd = -1;
  g_metrics_fd = -1;
}

}  // namespace orion::interpose
