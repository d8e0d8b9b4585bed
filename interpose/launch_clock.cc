// The launch clock's anchors and the process's counter rate (launch_clock.h).
#include "interpose/glibc_compat.h"

#include "interpose/launch_clock.h"

#include <string.h>

#include <atomic>

#include "interpose/cpu_limits.h"

namespace orion::interpose {

constinit thread_local ThreadClock t_launch_clock ORION_INITIAL_EXEC_TLS;

namespace {

// kUnknown until InitLaunchClock decides; kOff keeps every reading on the kernel's clock.
enum : uint32_t { kUnknown = 0, kOn = 1, kOff = 2 };
std::atomic<uint32_t> g_counter_state{kUnknown};
// The process's rate (32.32 ns a tick), 0 until its first measurement.
std::atomic<uint64_t> g_rate_q32{0};
// The anchor the next rate is measured from; written by the thread that holds g_measuring.
TickAnchor g_rate_from;
std::atomic<bool> g_measuring{false};

// A counter reading beside the kernel's clock (AnchorFromReadings).
bool ReadAnchor(TickAnchor* anchor) {
#if defined(__x86_64__)
  const uint64_t before = __rdtsc();
  const uint64_t ns = MonotonicNs();
  const uint64_t after = __rdtsc();
  return AnchorFromReadings(before, ns, after, g_rate_q32.load(std::memory_order_relaxed), anchor);
#else
  *anchor = TickAnchor{0, MonotonicNs()};
  return false;
#endif
}

// Measures the process's rate again once its anchor is old enough; one thread at a time.
void MeasureRate(TickAnchor now) {
  if (g_measuring.exchange(true, std::memory_order_acquire)) return;
  const uint64_t rate = g_rate_q32.load(std::memory_order_relaxed);
  if (g_rate_from.ns == 0) {
    g_rate_from = now;
  } else if (now.ns - g_rate_from.ns >= (rate == 0 ? kFirstCalibrationNs : kRecalibrationNs)) {
    const uint64_t measured = NsPerTickQ32(g_rate_from, now);
    if (measured == 0) {
      // No constant clock after all (a counter that went back, a rate out of range): stop.
      g_counter_state.store(kOff, std::memory_order_relaxed);
      g_rate_q32.store(0, std::memory_order_relaxed);
    } else {
      g_rate_q32.store(measured, std::memory_order_relaxed);
    }
    g_rate_from = now;
  }
  g_measuring.store(false, std::memory_order_release);
}

// `word` appears in `line` (up to its end) as a whole word.
bool HasWord(const char* line, const char* word) {
  const size_t n = strlen(word);
  const char* end = strchr(line, '\n');
  for (const char* p = strstr(line, word); p != nullptr && (end == nullptr || p < end);
       p = strstr(p + 1, word)) {
    const bool starts = p == line || p[-1] == ' ' || p[-1] == '\t';
    const bool ends = p[n] == ' ' || p[n] == '\n' || p[n] == '\0';
    if (starts && ends) return true;
  }
  return false;
}

}  // namespace

bool CounterClockUsable(const char* cpuinfo, const char* clocksource) {
  const char* flags = strstr(cpuinfo, "\nflags");
  if (flags == nullptr) return false;
  flags = strchr(flags, ':');
  if (flags == nullptr || !HasWord(flags, "constant_tsc") || !HasWord(flags, "nonstop_tsc")) {
    return false;
  }
  char source[64] = {};
  strncpy(source, clocksource, sizeof(source) - 1);
  source[strcspn(source, " \n")] = '\0';
  return strcmp(source, "tsc") == 0 || strcmp(source, "kvm-clock") == 0 ||
         strcmp(source, "hyperv_clocksource_tsc_page") == 0;
}

void InitLaunchClock(bool enabled) {
  uint32_t state = kOff;
#if defined(__x86_64__)
  // The first processor's block holds its flags line well within 16 KiB.
  static char cpuinfo[16384];
  char clocksource[64];
  if (enabled && ReadSmallFile("/proc/cpuinfo", cpuinfo, sizeof(cpuinfo)) &&
      ReadSmallFile("/sys/devices/system/clocksource/clocksource0/current_clocksource",
                    clocksource, sizeof(clocksource)) &&
      CounterClockUsable(cpuinfo, clocksource)) {
    // A hypervisor that traps the counter makes each read microseconds: then the kernel's clock
    // is the cheaper one.
    constexpr int kReads = 64;
    uint64_t sink = 0;
    const uint64_t start = MonotonicNs();
    for (int i = 0; i < kReads; ++i) sink += __rdtsc();
    const uint64_t took = MonotonicNs() - start;
    if (sink != 0 && took < kReads * 40) state = kOn;
  }
#else
  (void)enabled;
#endif
  g_counter_state.store(state, std::memory_order_relaxed);
}

bool LaunchClockExtrapolates() {
  return g_counter_state.load(std::memory_order_relaxed) == kOn &&
         g_rate_q32.load(std::memory_order_relaxed) != 0;
}

uint64_t AnchorLaunchClock() {
  if (g_counter_state.load(std::memory_order_relaxed) != kOn) return MonotonicNs();
  TickAnchor now;
  // An interrupted pair anchors nothing: the thread's next reading reads the kernel's clock
  // again.
  const bool tight = ReadAnchor(&now);
  if (tight) MeasureRate(now);
  t_launch_clock.Anchor(now, tight && LaunchClockExtrapolates()
                                 ? g_rate_q32.load(std::memory_order_relaxed)
                                 : 0);
  return now.ns;
}

}  // namespace orion::interpose
