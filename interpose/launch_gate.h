// Client side of the Orion-style launch gate: decides, per best-effort kernel launch, whether it
// may go now or must wait for the GPU's high-priority clients, using only the shared board.
//
// The decision functions are pure over the board (unit-tested with a board in plain memory);
// WaitAtGate() adds the spin-then-futex wait. High-priority launches never come here.
//
// Usage (best-effort launch, gate mode != kPassThrough):
//   GateTicket t = WaitAtGate(board, slot_index, blocks, estimate_ns);
//   launch...;  if (t.budget_ns) remember to give t.budget_ns back at completion.
#pragma once

#include <stdint.h>
#include <time.h>

#include "contract/orion_contract.h"

namespace orion::interpose {

inline uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Defaults for knobs a server left at 0.
inline constexpr uint64_t kDefaultHpStaleNs = 100'000'000;  // 100 ms without progress: ignored
inline constexpr uint64_t kMaxFutexWaitNs = 2'000'000;      // re-check knobs and staleness
// Without a server heartbeat for this long the gate opens (fail open: a dead server must not
// stall best-effort work forever).
inline constexpr uint64_t kServerHeartbeatTimeoutNs = 2'000'000'000;

// True if another client marked high priority on this GPU has work in flight that made
// progress recently. Slots not in hp_slot_mask, and our own slot, never count.
inline bool HighPriorityBusy(const contract::Board& board, const contract::GpuState& gpu,
                             uint32_t own_slot, uint64_t now_ns) {
  uint64_t stale_ns = gpu.hp_stale_ns.load(std::memory_order_relaxed);
  if (stale_ns == 0) stale_ns = kDefaultHpStaleNs;
  for (uint32_t w = 0; w < contract::kMaxSlots / 64; ++w) {
    uint64_t mask = gpu.hp_slot_mask[w].load(std::memory_order_relaxed);
    while (mask != 0) {
      const uint32_t bit = static_cast<uint32_t>(__builtin_ctzll(mask));
      mask &= mask - 1;
      const uint32_t index = w * 64 + bit;
      if (index == own_slot) continue;
      const contract::ClientSlot& slot = board.slots[index];
      if (slot.inflight.load(std::memory_order_acquire) == 0) continue;
      const uint64_t progress = slot.last_progress_ns.load(std::memory_order_relaxed);
      // progress in the future (clock skew, scribbles) counts as recent.
      if (progress >= now_ns || now_ns - progress < stale_ns) return true;
    }
  }
  return false;
}

inline bool ServerAlive(const contract::Board& board, uint64_t now_ns) {
  const uint64_t beat = board.header.server_heartbeat_ns.load(std::memory_order_relaxed);
  return beat >= now_ns || now_ns - beat < kServerHeartbeatTimeoutNs;
}

enum class GateDecision {
  kGoIdle,    // no high-priority client to protect: go
  kGoBudget,  // within the best-effort budget: go, charged until completion
  kWait,      // hold back
};

// True if a client other than us is marked high priority on this GPU (busy or not).
inline bool HighPriorityPresent(const contract::GpuState& gpu, uint32_t own_slot) {
  for (uint32_t w = 0; w < contract::kMaxSlots / 64; ++w) {
    uint64_t mask = gpu.hp_slot_mask[w].load(std::memory_order_relaxed);
    if (own_slot / 64 == w) mask &= ~(1ull << (own_slot % 64));
    if (mask != 0) return true;
  }
  return false;
}

// Atomically charges estimate_ns to be_outstanding_ns if the total stays within `cap`. With
// `admit_alone`, a launch is also admitted when nothing is outstanding, so a kernel longer than
// the cap still runs (alone).
inline bool TryChargeBudget(contract::GpuState& gpu, uint64_t estimate_ns, uint64_t cap,
                            bool admit_alone) {
  uint64_t outstanding = gpu.be_outstanding_ns.load(std::memory_order_relaxed);
  for (;;) {
    const bool fits = outstanding <= cap && estimate_ns <= cap - outstanding;
    if (!fits && !(admit_alone && outstanding == 0)) return false;
    if (gpu.be_outstanding_ns.compare_exchange_weak(outstanding, outstanding + estimate_ns,
                                                    std::memory_order_acq_rel)) {
      return true;
    }
  }
}

// Gives back a charge at completion, never below zero (the server may reset the counter).
inline void ReleaseBudget(contract::GpuState& gpu, uint64_t estimate_ns) {
  uint64_t seen = gpu.be_outstanding_ns.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t next = seen > estimate_ns ? seen - estimate_ns : 0;
    if (gpu.be_outstanding_ns.compare_exchange_weak(seen, next, std::memory_order_acq_rel)) return;
  }
}

// One best-effort launch's decision. `blocks` = grid x*y*z.
//  - gate off, server gone, or no high-priority client on the GPU: go.
//  - high-priority work in flight: go only if the kernel is small (blocks <= sm_threshold) and
//    its estimate fits the outstanding best-effort budget (be_budget_ns).
//  - high-priority clients idle: go while queued best-effort work stays within be_budget_ns (one
//    kernel always may run). A GPU runs queued kernels in order, so everything queued before a
//    high-priority request arrives delays it; this bounds that delay to the budget or one kernel.
inline GateDecision DecideBestEffort(contract::Board& board, contract::GpuState& gpu,
                                     uint32_t own_slot, uint64_t now_ns, uint64_t blocks,
                                     uint64_t estimate_ns) {
  if (static_cast<contract::GateMode>(gpu.mode.load(std::memory_order_relaxed)) ==
          contract::GateMode::kPassThrough ||
      !ServerAlive(board, now_ns) || !HighPriorityPresent(gpu, own_slot)) {
    return GateDecision::kGoIdle;
  }
  const uint64_t budget = gpu.be_budget_ns.load(std::memory_order_relaxed);
  if (!HighPriorityBusy(board, gpu, own_slot, now_ns)) {
    const bool admitted = TryChargeBudget(gpu, estimate_ns, budget, /*admit_alone=*/true);
    return admitted ? GateDecision::kGoBudget : GateDecision::kWait;
  }
  if (blocks <= gpu.sm_threshold.load(std::memory_order_relaxed) &&
      TryChargeBudget(gpu, estimate_ns, budget, /*admit_alone=*/false)) {
    return GateDecision::kGoBudget;
  }
  return GateDecision::kWait;
}

struct GateTicket {
  uint64_t budget_ns = 0;  // charged to be_outstanding_ns; release at completion
  uint64_t waited_ns = 0;  // time held at the gate (0 if it went at once)
};

// Blocks the calling thread until the launch may go: while the slot is paused, and for a
// best-effort client while the gate says kWait. Spins up to gpu.spin_ns, then futex-waits on
// gate_seq (or the slot's wake_seq when paused) at most kMaxFutexWaitNs at a time.
GateTicket WaitAtGate(contract::Board& board, uint32_t slot_index, uint64_t blocks,
                      uint64_t estimate_ns);

// Wakes best-effort threads of every process waiting on this GPU's gate.
void OpenGate(contract::GpuState& gpu);

}  // namespace orion::interpose
