// The launch path's clock: CLOCK_MONOTONIC nanoseconds, extrapolated from the CPU's time-stamp
// counter between readings of the kernel's clock.
//
// A launch stamps itself once (its event, its busy period, the heartbeat check). The kernel's
// clock there cost 56 ns a reading in place on an H100 host (28 ns in a loop): the vDSO orders
// its counter read behind every load before it, so the reading waits for the launch path's
// cache misses. An unordered counter read scaled by the thread's last anchor (a kernel reading
// and the counter beside it) costs a few nanoseconds. A thread reads the kernel's clock again
// when its anchor is kMaxExtrapolatedNs old, so a reading is off by at most the rate's error
// over that span: the rate is measured over a second of the process's own anchors and measured
// again every second, so an NTP slew (at most 500 ppm) moves a reading by at most 100 ns, and a
// steady rate by a few. Readings of two threads, or a launch's against the kernel's clock read
// elsewhere, may be that far apart in either direction: callers take differences both ways.
//
// Used only where the time-stamp counter ticks at a constant rate through sleep states
// (constant_tsc and nonstop_tsc) and the kernel keeps its own clock on it (clocksource tsc,
// kvm-clock or Hyper-V's TSC page), where reading it is cheap, on x86-64, and not with
// ORION_TSC_CLOCK=0. Anywhere else, and for the first 20 ms of a process (the first rate), it
// is the kernel's clock.
//
// Usage:
//   InitLaunchClock(config.tsc_clock);   // once, at process start
//   const uint64_t now = LaunchClockNs();  // a launch's stamp
#pragma once

#include <stdint.h>

#include "interpose/glibc_compat.h"
#include "interpose/launch_gate.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace orion::interpose {

// How long a thread extrapolates from one anchor.
inline constexpr uint64_t kMaxExtrapolatedNs = 200'000;
// The process's first rate is measured over this long, later ones over kRecalibrationNs.
inline constexpr uint64_t kFirstCalibrationNs = 20'000'000;
inline constexpr uint64_t kRecalibrationNs = 1'000'000'000;

// A counter reading and the kernel's clock at the same instant.
struct TickAnchor {
  uint64_t ticks = 0;
  uint64_t ns = 0;
};

// Nanoseconds a tick as 32.32 fixed point, from two anchors; 0 where that is no clock (it went
// back, or its rate lies outside 0.2 to 20 GHz).
inline uint64_t NsPerTickQ32(TickAnchor from, TickAnchor to) {
  if (to.ticks <= from.ticks || to.ns <= from.ns) return 0;
  const unsigned __int128 q =
      (static_cast<unsigned __int128>(to.ns - from.ns) << 32) / (to.ticks - from.ticks);
  if (q < (uint64_t{1} << 32) / 20 || q > (uint64_t{5} << 32)) return 0;
  return static_cast<uint64_t>(q);
}

// The anchor of a kernel reading `ns` taken between counter readings `before` and `after`: at
// their middle. False where they lie over 2 us apart at `rate` (10,000 ticks before the first
// rate): the thread was interrupted in between, and the pair may be microseconds apart (such a
// pair read 17 us off for an anchor's whole reach on an H100 host).
inline bool AnchorFromReadings(uint64_t before, uint64_t ns, uint64_t after, uint64_t rate,
                               TickAnchor* anchor) {
  const uint64_t spread = after - before;
  *anchor = TickAnchor{before + spread / 2, ns};
  if (after < before) return false;
  return rate != 0 ? ((spread * rate) >> 32) < 2'000 : spread < 10'000;
}

// One thread's anchor and the rate it extrapolates with.
struct ThreadClock {
  uint64_t base_ticks = 0;
  uint64_t base_ns = 0;
  uint64_t ns_per_tick_q32 = 0;
  uint64_t max_ticks = 0;  // 0: not extrapolating

  // Anchored at `anchor` with `rate` (0: read the kernel's clock every time).
  void Anchor(TickAnchor anchor, uint64_t rate) {
    base_ticks = anchor.ticks;
    base_ns = anchor.ns;
    ns_per_tick_q32 = rate;
    max_ticks = rate != 0 ? static_cast<uint64_t>(
                                (static_cast<unsigned __int128>(kMaxExtrapolatedNs) << 32) / rate)
                          : 0;
  }
  // The time at counter reading `ticks`, false where the anchor does not reach it (too old, or
  // behind it: a thread moved to a core whose counter is behind).
  bool Extrapolate(uint64_t ticks, uint64_t* ns) const {
    const uint64_t d = ticks - base_ticks;
    if (d >= max_ticks) return false;
    // d < 2^22 (200 us at 20 GHz) and the rate < 2^35: the product fits.
    *ns = base_ns + ((d * ns_per_tick_q32) >> 32);
    return true;
  }
};

// Whether /proc/cpuinfo's text (its first processor's flags) and the kernel's clocksource name
// allow the counter (pure: tested on sample texts).
bool CounterClockUsable(const char* cpuinfo, const char* clocksource);
// Decides, once, whether the counter may be used (`enabled`: ORION_TSC_CLOCK). Without a call
// the clock is the kernel's.
void InitLaunchClock(bool enabled);
// Whether readings are extrapolated now (the counter usable and its first rate measured).
bool LaunchClockExtrapolates();
// A new anchor for the calling thread; the kernel's reading.
uint64_t AnchorLaunchClock();

// constinit: no dynamic initialisation, so an access from another file is a plain TLS load.
extern constinit thread_local ThreadClock t_launch_clock ORION_INITIAL_EXEC_TLS;

inline uint64_t LaunchClockNs() {
#if defined(__x86_64__)
  const ThreadClock& clock = t_launch_clock;
  uint64_t ns;
  if (clock.max_ticks != 0 && clock.Extrapolate(__rdtsc(), &ns)) return ns;
  return AnchorLaunchClock();
#else
  return MonotonicNs();
#endif
}

}  // namespace orion::interpose
