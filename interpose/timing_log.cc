// The GPU timing diagnostic's file (timing_log.h).
#include "interpose/glibc_compat.h"

#include "interpose/timing_log.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>

namespace orion::interpose {
namespace {

std::atomic<int> g_fd{-1};
pthread_mutex_t g_write_mutex = PTHREAD_MUTEX_INITIALIZER;

// One formatted line (at most 255 bytes); a short or failed write loses a diagnostic line,
// never the application's work.
__attribute__((format(printf, 1, 2))) void WriteLine(const char* format, ...) {
  const int fd = g_fd.load(std::memory_order_acquire);
  if (fd < 0) return;
  char line[256];
  va_list args;
  va_start(args, format);
  const int n = vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  if (n <= 0) return;
  pthread_mutex_lock(&g_write_mutex);
  ssize_t ignored = write(fd, line, static_cast<size_t>(n < 256 ? n : 255));
  (void)ignored;
  pthread_mutex_unlock(&g_write_mutex);
}

}  // namespace

void StartTimingLog(const char* dir, const StartLatency& latency) {
  if (dir == nullptr || dir[0] == '\0' || g_fd.load(std::memory_order_acquire) >= 0) return;
  char path[512];
  const int pid = static_cast<int>(getpid());
  if (snprintf(path, sizeof(path), "%s/timing.%d.log", dir, pid) >= static_cast<int>(sizeof(path))) {
    return;
  }
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  g_fd.store(fd, std::memory_order_release);
  WriteLine("# orion-timing-log 2 pid=%d kernel_start_ns=%llu queued_start_ns=%llu "
            "held_start_ns=%llu held_compute_start_ns=%llu\n",
            pid, static_cast<unsigned long long>(latency.idle_ns),
            static_cast<unsigned long long>(latency.queued_ns),
            static_cast<unsigned long long>(latency.held_ns),
            static_cast<unsigned long long>(latency.held_compute_ns));
}

bool TimingLogActive() { return g_fd.load(std::memory_order_relaxed) >= 0; }

using ull = unsigned long long;

void LogTimingSample(const TimingSample& s) {
  const SampleEvents& e = s.events;
  WriteLine("sample\t%#llx\t%llu\t%llu\t%llu\t%llu\t%llu\t%d\t%d\t%llu\t%u,%u,%u\t%u,%u,%u\t%d\t%d\t%d\n",
            ull{s.func}, ull{e.gpu_elapsed_ns}, ull{e.placed ? e.start_host_ns : 0},
            ull{e.placed ? e.end_host_ns : 0}, ull{e.launched_ns}, ull{s.timing.duration_ns},
            s.timing.idle_stream ? 1 : 0, s.warmup ? 1 : 0, ull{e.start_recorded_ns}, s.grid[0],
            s.grid[1], s.grid[2], s.block[0], s.block[1], s.block[2], s.contended ? 1 : 0,
            e.held ? 1 : 0, e.compute ? 1 : 0);
}

void LogAnchor(uint64_t ctx, uint64_t recorded_ns, uint64_t seen_ns, uint64_t chained_ns,
               uint64_t host_ns, double rate) {
  WriteLine("anchor\t%#llx\t%llu\t%llu\t%llu\t%llu\t%.2f\n", ull{ctx}, ull{recorded_ns},
            ull{seen_ns}, ull{chained_ns}, ull{host_ns}, (rate - 1.0) * 1e6);
}

void ResetTimingLogAfterFork() {
  const int fd = g_fd.exchange(-1, std::memory_order_acq_rel);
  if (fd >= 0) close(fd);
}

}  // namespace orion::interpose
