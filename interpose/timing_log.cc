// The GPU timing diagnostic's file (timing_log.h).
#include "interpose/glibc_compat.h"

#include "interpose/timing_log.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>

namespace orion::interpose {
namespace {

std::atomic<int> g_fd{-1};
pthread_mutex_t g_write_mutex = PTHREAD_MUTEX_INITIALIZER;

void WriteLine(const char* line, int n) {
  const int fd = g_fd.load(std::memory_order_acquire);
  if (fd < 0 || n <= 0) return;
  pthread_mutex_lock(&g_write_mutex);
  // A short or failed write loses a diagnostic line, never the application's work.
  ssize_t ignored = write(fd, line, static_cast<size_t>(n));
  (void)ignored;
  pthread_mutex_unlock(&g_write_mutex);
}

}  // namespace

void StartTimingLog(const char* dir) {
  if (dir == nullptr || dir[0] == '\0' || g_fd.load(std::memory_order_acquire) >= 0) return;
  char path[512];
  const int pid = static_cast<int>(getpid());
  if (snprintf(path, sizeof(path), "%s/timing.%d.log", dir, pid) >= static_cast<int>(sizeof(path))) {
    return;
  }
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  g_fd.store(fd, std::memory_order_release);
  char line[64];
  WriteLine(line, snprintf(line, sizeof(line), "# orion-timing-log 1 pid=%d\n", pid));
}

bool TimingLogActive() { return g_fd.load(std::memory_order_relaxed) >= 0; }

void LogTimingSample(uint64_t func, uint64_t gpu_elapsed_ns, uint64_t start_host_ns,
                     uint64_t end_host_ns, uint64_t launched_ns, uint64_t duration_ns,
                     bool clamped, bool warmup) {
  if (!TimingLogActive()) return;
  char line[256];
  WriteLine(line, snprintf(line, sizeof(line), "sample\t%#llx\t%llu\t%llu\t%llu\t%llu\t%llu\t%d\t%d\n",
                           static_cast<unsigned long long>(func),
                           static_cast<unsigned long long>(gpu_elapsed_ns),
                           static_cast<unsigned long long>(start_host_ns),
                           static_cast<unsigned long long>(end_host_ns),
                           static_cast<unsigned long long>(launched_ns),
                           static_cast<unsigned long long>(duration_ns), clamped ? 1 : 0,
                           warmup ? 1 : 0));
}

void LogAnchor(uint64_t ctx, uint64_t recorded_ns, uint64_t seen_ns, uint64_t chained_ns,
               uint64_t host_ns) {
  if (!TimingLogActive()) return;
  char line[192];
  WriteLine(line, snprintf(line, sizeof(line), "anchor\t%#llx\t%llu\t%llu\t%llu\t%llu\n",
                           static_cast<unsigned long long>(ctx),
                           static_cast<unsigned long long>(recorded_ns),
                           static_cast<unsigned long long>(seen_ns),
                           static_cast<unsigned long long>(chained_ns),
                           static_cast<unsigned long long>(host_ns)));
}

void ResetTimingLogAfterFork() {
  const int fd = g_fd.exchange(-1, std::memory_order_acq_rel);
  if (fd >= 0) close(fd);
}

}  // namespace orion::interpose
