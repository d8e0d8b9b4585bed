// The launch gate's shared rules, defined once for the server and the interposer: the defaults of
// the knobs the server publishes on the board, and when a high-priority client counts as busy.
// Allocation-free and libstdc++-free at run time, like the rest of contract/.
//
// Usage:
//   const uint64_t grace = gpu.hp_grace_ns.load(...);
//   if (HighPriorityActivityOf(slot, now, stale_ns, grace) != HighPriorityActivity::kIdle) ...
#pragma once

#include <stdint.h>

#include "contract/orion_contract.h"

namespace orion::contract {

// Knob defaults (server config, board, admin API and the interposer's fallbacks all use these).
inline constexpr GateMode kDefaultGateMode = GateMode::kPriority;
// Best-effort GPU time allowed beside high-priority work, by mode: a time-sliced GPU runs queued
// best-effort work before a request's kernels, so that budget is small; under MPS it co-runs.
inline constexpr uint64_t DefaultBeBudgetNs(GateMode mode) {
  return mode == GateMode::kMps ? 5'000'000 : 500'000;
}
inline constexpr uint32_t kDefaultSmThreshold = 0;          // 0: no block limit (mps mode)
inline constexpr uint32_t kDefaultSpinNs = 20'000;          // spin before blocking at the gate
// The most the interposer spins, whatever the board says (a tenant can write the board).
inline constexpr uint32_t kMaxSpinNs = 1'000'000;
inline constexpr uint64_t kDefaultHpStaleNs = 1'000'000'000;  // HP work without progress: ignored
inline constexpr uint64_t kDefaultHpGraceNs = 500'000;      // CPU gaps inside one request
// Priority mode holds best-effort work on the GPU (interpose/gpu_hold.h): 3 H200 rounds of two
// CUDA-graph services beside an LM trainer, against the gate on the CPU: p50 1.48x vs 1.71x and
// 1.41x vs 1.55x, harvest 0.75 vs 0.56 and 0.82 vs 0.61 (docs/benchmarks.md).
inline constexpr bool kDefaultGpuHold = true;
// The longest a GPU hold lasts through one high-priority busy period (interpose/gpu_hold.h, "A
// hold that lasts"): 100 ms, some 100 requests with no gap of a grace for a BERT graph service
// at half its capacity. Measured on H200s (docs/benchmarks.md, "A bound on the GPU hold"): at
// 500 ms no stall, but a graph service started beside two trainers read p99 148 ms over the run
// (median of 8); at 100 ms, with a release that lasts 30 s (kDefaultGpuHoldReleaseNs), 18 to
// 24 ms (3 runs), and 33 ms against 152 ms in a matrix round.
inline constexpr uint64_t kDefaultGpuHoldMaxNs = 100'000'000;
inline constexpr uint64_t kMaxGpuHoldMaxNs = 60'000'000'000;  // the knob's range: 0 to 60 s
// How long a release past that bound lasts at least (GpuState::gpu_hold_release_ns): a trainer's
// start released the hold again and again once its service was idle (at 100 ms and released
// only until idle: 1 and 12 releases, p99 10 and 118 ms over the run; with 30 s, 1 or 2, p99 18
// to 24 ms). 0 to 600 s; 0: until the high-priority clients are idle.
inline constexpr uint64_t kDefaultGpuHoldReleaseNs = 30'000'000'000;
inline constexpr uint64_t kMaxGpuHoldReleaseNs = 600'000'000'000;

enum class HighPriorityActivity {
  kIdle,      // nothing in flight (or only stale work) and the grace period over
  kInFlight,  // GPU work in flight that made progress within stale_ns
  kInGrace,   // nothing in flight, but a launch or completion within grace_ns
};

// When a high-priority client counts as busy: work in flight that progressed within `stale_ns`
// (a hung or killed client stops counting), or a launch or completion within `grace_ns` (the CPU
// gaps between the kernels of one request). A progress stamp in the future (clock skew, a
// scribbled gate area) counts as now. *age_ns, if given, receives the time since the last progress.
inline HighPriorityActivity HighPriorityActivityOf(const SlotGate& slot, uint64_t now_ns,
                                                   uint64_t stale_ns, uint64_t grace_ns,
                                                   uint64_t* age_ns = nullptr) {
  const uint64_t progress = slot.last_progress_ns.load(std::memory_order_relaxed);
  const uint64_t age = progress >= now_ns ? 0 : now_ns - progress;
  if (age_ns != nullptr) *age_ns = age;
  if (slot.inflight.load(std::memory_order_acquire) != 0) {
    return age < stale_ns ? HighPriorityActivity::kInFlight : HighPriorityActivity::kIdle;
  }
  return age < grace_ns ? HighPriorityActivity::kInGrace : HighPriorityActivity::kIdle;
}

}  // namespace orion::contract
