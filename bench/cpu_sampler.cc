// liborion-cpu-sampler.so: where one thread's CPU time goes, by shared object and symbol, inside
// the process that spends it. Preloaded into a benchmark's process (cpu-tax --cpu-samples), it
// samples the thread that loaded it (the main thread) every ORION_CPU_SAMPLE_US microseconds of
// that thread's CPU time (default 1000): a CPU-time timer of the thread, whose signal records the
// instruction it interrupted, the thread's CPU time since the sample before (its weight: a
// CPU-time timer fires on the kernel's tick, so the period is at least a tick) and, where
// ORION_BENCH_SWITCH names the benchmark's switch file (contract::BenchSwitch), the switch's
// word then, so that one process serving two arms in turn gives each arm its own profile. No
// hardware counter is needed (hosts without a PMU for a process have none). At exit it writes
// ORION_CPU_SAMPLES.<pid>.jsonl, one line per switch word, object and symbol:
//   {"switch": 0, "object": "liborion_interpose.so", "symbol": "cuLaunchKernel", "samples": 812,
//    "cpu_ms": 3248.0, "period_us": 1000}
// A sample is its leaf function's: time in a library the interposer calls (the clock in the
// vDSO, the driver) reads as that library's. The symbol is the nearest dynamic symbol at or below
// the address (dladdr); where there is none (a hidden function), "?@0xOFFSET" in the object,
// which addr2line -f -e OBJECT OFFSET names (cpu-samples --resolve does). In the object that
// ORION_CPU_SAMPLE_DETAIL names (a basename: liborion_interpose.so), every symbol carries its
// sample's offset too ("cuLaunchKernel@0x1234"): a profile by source line, in place. Without
// ORION_CPU_SAMPLES it does nothing.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace {

constexpr size_t kMaxSamples = size_t{1} << 22;  // 4M samples: 70 minutes at 1 kHz

struct Sample {
  uintptr_t ip;
  uint32_t word;
  uint32_t cpu_us;  // the thread's CPU time since the sample before: this one's weight
};

Sample* g_samples = nullptr;
std::atomic<size_t> g_count{0};
const std::atomic<uint32_t>* g_switch = nullptr;
timer_t g_timer;
bool g_armed = false;
long g_period_us = 1000;
uint64_t g_last_cpu_ns = 0;  // the thread's CPU clock at the last sample

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uintptr_t InterruptedIp(const ucontext_t* uc) {
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

void OnTick(int, siginfo_t*, void* context) {
  const size_t i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMaxSamples) return;
  const uint64_t now = ThreadCpuNs();
  const uint64_t us = (now - g_last_cpu_ns) / 1000;
  g_last_cpu_ns = now;
  g_samples[i] = {InterruptedIp(static_cast<const ucontext_t*>(context)),
                  g_switch != nullptr ? g_switch->load(std::memory_order_relaxed) : 0,
                  static_cast<uint32_t>(std::min<uint64_t>(us, UINT32_MAX))};
}

void MapSwitch() {
  const char* path = getenv("ORION_BENCH_SWITCH");
  if (path == nullptr || *path == '\0') return;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  void* p = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p != MAP_FAILED) g_switch = static_cast<const std::atomic<uint32_t>*>(p);
}

__attribute__((constructor)) void StartSampling() {
  const char* out = getenv("ORION_CPU_SAMPLES");
  if (out == nullptr || *out == '\0') return;
  if (const char* us = getenv("ORION_CPU_SAMPLE_US"); us != nullptr && *us != '\0') {
    char* end = nullptr;
    const long v = strtol(us, &end, 10);
    if (*end != '\0' || v < 50 || v > 100'000) {
      fprintf(stderr, "orion-cpu-sampler: ORION_CPU_SAMPLE_US=%s: wants 50 to 100000; not "
                      "sampling\n", us);
      return;
    }
    g_period_us = v;
  }
  void* buf = mmap(nullptr, kMaxSamples * sizeof(Sample), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (buf == MAP_FAILED) return;
  g_samples = static_cast<Sample*>(buf);
  MapSwitch();
  struct sigaction sa {};
  sa.sa_sigaction = OnTick;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, nullptr) != 0) return;
  sigevent ev{};
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = SIGPROF;
  ev._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
  if (timer_create(CLOCK_THREAD_CPUTIME_ID, &ev, &g_timer) != 0) {
    fprintf(stderr, "orion-cpu-sampler: timer_create: %s; not sampling\n", strerror(errno));
    return;
  }
  const timespec period{g_period_us / 1'000'000, (g_period_us % 1'000'000) * 1000};
  const itimerspec spec{period, period};
  g_last_cpu_ns = ThreadCpuNs();
  g_armed = timer_settime(g_timer, 0, &spec, nullptr) == 0;
}

const char* Basename(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

// A JSON string's body: quotes and backslashes escaped, control bytes dropped.
std::string Escaped(const char* s) {
  std::string out;
  for (; *s != '\0'; ++s) {
    if (*s == '"' || *s == '\\') out += '\\';
    if (static_cast<unsigned char>(*s) >= 0x20) out += *s;
  }
  return out;
}

__attribute__((destructor)) void WriteSamples() {
  if (!g_armed) return;
  timer_delete(g_timer);
  g_armed = false;
  const size_t n = std::min(g_count.load(), kMaxSamples);
  if (n == 0) return;
  struct Weight {
    uint64_t samples = 0, cpu_us = 0;
  };
  std::map<std::pair<uint32_t, uintptr_t>, Weight> by_ip;
  for (size_t i = 0; i < n; ++i) {
    Weight& w = by_ip[{g_samples[i].word, g_samples[i].ip}];
    ++w.samples;
    w.cpu_us += g_samples[i].cpu_us;
  }
  const char* detail = getenv("ORION_CPU_SAMPLE_DETAIL");
  std::map<std::tuple<uint32_t, std::string, std::string>, Weight> by_symbol;
  for (const auto& [key, weight] : by_ip) {
    Dl_info info{};
    std::string object = "?", symbol = "?";
    if (key.second != 0 && dladdr(reinterpret_cast<void*>(key.second), &info) != 0) {
      if (info.dli_fname != nullptr && *info.dli_fname != '\0') object = Basename(info.dli_fname);
      const unsigned long offset =
          static_cast<unsigned long>(key.second - reinterpret_cast<uintptr_t>(info.dli_fbase));
      char at[32];
      snprintf(at, sizeof(at), "@0x%lx", offset);
      if (info.dli_sname != nullptr) {
        symbol = info.dli_sname;
        if (detail != nullptr && object == detail) symbol += at;
      } else if (info.dli_fbase != nullptr) {  // a hidden function: its offset, for addr2line
        symbol = std::string("?") + at;
      }
    }
    Weight& w = by_symbol[{key.first, object, symbol}];
    w.samples += weight.samples;
    w.cpu_us += weight.cpu_us;
  }
  const std::string path = std::string(getenv("ORION_CPU_SAMPLES")) + "." +
                           std::to_string(getpid()) + ".jsonl";
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) {
    fprintf(stderr, "orion-cpu-sampler: %s: %s\n", path.c_str(), strerror(errno));
    return;
  }
  for (const auto& [key, w] : by_symbol) {
    fprintf(f,
            "{\"switch\": %u, \"object\": \"%s\", \"symbol\": \"%s\", \"samples\": %llu, "
            "\"cpu_ms\": %.3f, \"period_us\": %ld}\n",
            std::get<0>(key), Escaped(std::get<1>(key).c_str()).c_str(),
            Escaped(std::get<2>(key).c_str()).c_str(), static_cast<unsigned long long>(w.samples),
            w.cpu_us / 1e3, g_period_us);
  }
  fclose(f);
}

}  // namespace
