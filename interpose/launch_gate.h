// Client side of the Orion-style launch gate: decides, per best-effort kernel launch, whether it
// may go now or must wait for the GPU's high-priority clients, using only shared memory: the
// board (read-only: knobs, priorities) and the GPU's gate area (words shared by its clients).
//
// The decision functions are pure over those (unit-tested with both in plain memory);
// WaitAtGate() adds the spin-then-futex wait. High-priority launches never come here.
//
// Usage (best-effort launch, gate mode != kPassThrough):
//   GateTicket t = WaitAtGate(board, gate, slot_index, BestEffortLaunch{blocks, estimate_ns, cls});
//   launch...;  if (t.budget_ns) remember to give t.budget_ns back at completion.
#pragma once

#include <stdint.h>
#include <time.h>

#include <algorithm>
#include <atomic>

#include "contract/gate_rules.h"
#include "contract/kernel_class.h"
#include "contract/orion_contract.h"

namespace orion::interpose {

// CLOCK_MONOTONIC in ns, read through `read` (clock_gettime, or a copy of its address).
inline uint64_t MonotonicNs(int (*read)(clockid_t, timespec*) = ::clock_gettime) {
  timespec ts;
  read(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline constexpr uint64_t kMaxFutexWaitNs = 2'000'000;  // re-check knobs and staleness
// Without a server heartbeat for this long the gate opens (fail open: a dead server must not
// stall best-effort work forever).
inline constexpr uint64_t kServerHeartbeatTimeoutNs = 2'000'000'000;

// What the gate sees of a GPU's high-priority clients at one instant.
struct HighPriorityView {
  bool busy = false;  // some HP client (not us) is busy, see HighPriorityBusy
  // Class (board encoding) of the last kernel a busy HP client launched; 0 = unknown.
  uint32_t kernel_class = 0;
  // When every busy HP client is only inside its grace period: the earliest instant the grace of
  // all of them has run out (a waiter need not look again before). 0 if some HP work is in flight.
  uint64_t grace_ends_ns = 0;
  // Identity of the current busy period: the sum of the busy HP clients' busy_seq.
  uint64_t period = 0;
  // Every busy HP client launches CUDA graphs (its last launch was one): a request is queued on
  // the GPU whole, with no CPU gaps for best-effort work to fill.
  bool graphs_only = true;
  // When the earliest busy period of the busy HP clients began (their SlotGate::busy_start_ns,
  // none after now; 0: none known): the high-priority side has been busy since then at least.
  uint64_t busy_since_ns = 0;

  // Between the graphs of graph services: busy, but none in flight, only their grace left.
  bool BetweenGraphs() const { return busy && graphs_only && grace_ends_ns != 0; }
};

// Calls fn(slot index) for each client marked high priority on this GPU but `own_slot`, until fn
// returns false; false when it stopped there.
template <typename Fn>
inline bool ForEachOtherHighPriority(const contract::GpuState& gpu, uint32_t own_slot, Fn&& fn) {
  for (uint32_t w = 0; w < contract::kMaxSlots / 64; ++w) {
    uint64_t mask = gpu.hp_slot_mask[w].load(std::memory_order_relaxed);
    while (mask != 0) {
      const uint32_t index = w * 64 + static_cast<uint32_t>(__builtin_ctzll(mask));
      mask &= mask - 1;
      if (index != own_slot && !fn(index)) return false;
    }
  }
  return true;
}

// Whether another client marked high priority on this GPU is busy, by the contract's rule
// (HighPriorityActivityOf in contract/gate_rules.h; a server that left hp_stale_ns at 0 gets the
// default). Slots not in hp_slot_mask, and our own slot, never count.
inline HighPriorityView HighPriorityBusy(const contract::GateArea& gate,
                                         const contract::GpuState& gpu, uint32_t own_slot,
                                         uint64_t now_ns) {
  uint64_t stale_ns = gpu.hp_stale_ns.load(std::memory_order_relaxed);
  if (stale_ns == 0) stale_ns = contract::kDefaultHpStaleNs;
  const uint64_t grace_ns = gpu.hp_grace_ns.load(std::memory_order_relaxed);
  HighPriorityView view;
  bool in_flight = false;
  ForEachOtherHighPriority(gpu, own_slot, [&](uint32_t index) {
    const contract::SlotGate& slot = gate.slots[index];
    uint64_t age = 0;
    switch (contract::HighPriorityActivityOf(slot, now_ns, stale_ns, grace_ns, &age)) {
      case contract::HighPriorityActivity::kIdle:
        return true;
      case contract::HighPriorityActivity::kInFlight:
        in_flight = true;
        break;
      case contract::HighPriorityActivity::kInGrace:
        if (const uint64_t ends = now_ns - age + grace_ns; ends > view.grace_ends_ns) {
          view.grace_ends_ns = ends;
        }
        break;
    }
    // Several busy HP clients running different classes: nothing complements them all.
    const uint32_t kclass = slot.hp_kernel_class.load(std::memory_order_relaxed);
    view.kernel_class = !view.busy || view.kernel_class == kclass
                            ? kclass
                            : contract::KernelClassToBoard(contract::KernelClass::kMixed);
    view.busy = true;
    view.period += slot.busy_seq.load(std::memory_order_relaxed);
    if (const uint64_t start = slot.busy_start_ns.load(std::memory_order_relaxed);
        start != 0 && start <= now_ns && (view.busy_since_ns == 0 || start < view.busy_since_ns)) {
      view.busy_since_ns = start;
    }
    if (slot.launches_graphs.load(std::memory_order_relaxed) == 0) view.graphs_only = false;
    return true;
  });
  if (in_flight) view.grace_ends_ns = 0;
  return view;
}

inline bool ServerAlive(const contract::Board& board, uint64_t now_ns) {
  const uint64_t beat = board.header.server_heartbeat_ns.load(std::memory_order_relaxed);
  return beat >= now_ns || now_ns - beat < kServerHeartbeatTimeoutNs;
}

enum class GateDecision {
  kGoIdle,    // nothing to protect (no HP client, pass-through, server gone): go, uncharged
  kGoBudget,  // within the best-effort budget: go, charged until completion
  kWait,      // hold back
};

// A best-effort launch as the gate sees it.
struct BestEffortLaunch {
  uint64_t blocks = 1;       // grid x*y*z (one CUDA graph counts as its largest need: unknown)
  uint64_t estimate_ns = 0;  // expected GPU time, charged to be_outstanding_ns
  uint32_t kernel_class = 0;  // contract::KernelClass, board encoding; 0 = unknown
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
inline bool TryChargeBudget(contract::GateArea& gate, uint64_t estimate_ns, uint64_t cap,
                            bool admit_alone) {
  std::atomic<uint64_t>& word = gate.words.be_outstanding_ns;
  uint64_t outstanding = word.load(std::memory_order_relaxed);
  for (;;) {
    const bool fits = outstanding <= cap && estimate_ns <= cap - outstanding;
    if (!fits && !(admit_alone && outstanding == 0)) return false;
    if (word.compare_exchange_weak(outstanding, outstanding + estimate_ns,
                                   std::memory_order_acq_rel)) {
      return true;
    }
  }
}

// Gives back a charge at completion, never below zero (the server may reset the counter).
inline void ReleaseBudget(contract::GateArea& gate, uint64_t estimate_ns) {
  std::atomic<uint64_t>& word = gate.words.be_outstanding_ns;
  uint64_t seen = word.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t next = seen > estimate_ns ? seen - estimate_ns : 0;
    if (word.compare_exchange_weak(seen, next, std::memory_order_acq_rel)) return;
  }
}

// Charges estimate_ns to the best-effort time admitted during HP busy period `period` if the
// period's total stays within `cap` (a new period starts from zero).
inline bool TryChargePeriod(contract::GateArea& gate, uint64_t period, uint64_t estimate_ns,
                            uint64_t cap) {
  constexpr uint64_t kNsMask = (1ull << 40) - 1;
  const uint64_t id = period & ((1ull << 24) - 1);
  uint64_t word = gate.words.be_period.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t used = (word >> 40) == id ? (word & kNsMask) : 0;
    if (used > cap || estimate_ns > cap - used) return false;
    const uint64_t next = (id << 40) | ((used + estimate_ns) & kNsMask);
    if (gate.words.be_period.compare_exchange_weak(word, next, std::memory_order_acq_rel)) {
      return true;
    }
  }
}

// A busy period of a high-priority client that has ended, to report as kBusyPeriod.
struct BusyPeriod {
  uint64_t start_ns = 0;
  uint64_t duration_ns = 0;
};

// A high-priority launch is followed to completion (counted in its SlotGate's inflight until its event
// completes) only while best-effort clients share its GPU and the gate may hold them: otherwise
// nobody reads what its completion would tell, and following it costs the service CPU.
inline bool FollowHighPriority(const contract::GpuState& gpu) {
  return gpu.be_clients.load(std::memory_order_relaxed) != 0 &&
         gpu.mode.load(std::memory_order_relaxed) !=
             static_cast<uint32_t>(contract::GateMode::kPassThrough);
}

// Whether one high-priority launch is followed to its completion. A launch that is not followed
// keeps its client busy for the grace period after it (NoteHighPriorityLaunch), which covers it
// when the GPU finishes it well within the grace; only launches that may outlast it need an
// event. So, per process and GPU, `queue_end_ns` models when the GPU finishes the high-priority
// work launched so far: each launch starts at the later of its launch time and that end (plus,
// on a time-sliced GPU, the best-effort work in flight ahead of it) and runs its estimate. A
// launch is followed when that end lies half a grace or more after it, and always when it is a
// CUDA graph or a kernel never measured yet (`estimate_ns` 0: its length is not known).
// An eager service's short kernels, launched from a CPU-bound thread, keep the modeled queue
// near empty and are not followed: following each of them recorded an event on every launch
// and kept the poller looking (an eager ResNet50 pinned to one core, under MPS beside a
// trainer, H100: its service time 1.40x alone followed, 1.14x not; round 12). A GPU-bound
// burst, a long kernel or a graph is followed as before. `now_ns` is the launch's time, read
// before the driver call (the launch path reads it there wherever following is possible).
inline bool FollowHighPriorityLaunch(const contract::GpuState& gpu, contract::GateArea& gate,
                                     std::atomic<uint64_t>& queue_end_ns, uint64_t now_ns,
                                     uint64_t estimate_ns, bool graph) {
  if (!FollowHighPriority(gpu)) return false;
  uint64_t start = queue_end_ns.load(std::memory_order_relaxed);
  const uint64_t grace = gpu.hp_grace_ns.load(std::memory_order_relaxed);
  // Not measured yet: modeled at a whole grace (followed, and what follows it queues behind).
  const uint64_t length = estimate_ns != 0 ? estimate_ns : grace;
  if (gpu.mode.load(std::memory_order_relaxed) ==
      static_cast<uint32_t>(contract::GateMode::kPriority)) {
    const uint64_t be_queued = gate.words.be_outstanding_ns.load(std::memory_order_relaxed);
    start = std::max(start, now_ns + be_queued);
  }
  start = std::max(start, now_ns);
  const uint64_t end = start + length;
  queue_end_ns.store(end, std::memory_order_relaxed);  // racing launch threads: a model
  return graph || estimate_ns == 0 || end - now_ns >= grace / 2;
}

// The high-priority client's own bookkeeping at each launch (own slot only: no lock, no system
// call): before the driver call where best-effort clients may be held for it
// (FollowHighPriority), else once it returned. A launch that finds nothing in flight and the
// grace period over starts a new busy period; the previous one is returned in *ended (true) for
// the caller to report. A `followed` launch is counted in slot.inflight until
// NoteHighPriorityCompletion; one that is not keeps the client busy for the grace period after
// it, like any launch.
inline bool NoteHighPriorityLaunch(contract::SlotGate& slot, const contract::GpuState& gpu,
                                   uint64_t now_ns, BusyPeriod* ended, bool followed = true) {
  bool report = false;
  if (slot.inflight.load(std::memory_order_relaxed) == 0) {
    const uint64_t last = slot.last_progress_ns.load(std::memory_order_relaxed);
    const uint64_t start = slot.busy_start_ns.load(std::memory_order_relaxed);
    const uint64_t grace = gpu.hp_grace_ns.load(std::memory_order_relaxed);
    // A completion the poller stamped after the caller read its clock lies just ahead of now_ns:
    // the GPU was busy then, so the busy period goes on. Far ahead is no such stamp: start anew.
    const uint64_t apart = now_ns >= last ? now_ns - last : last - now_ns;
    if (start == 0 || last < start || apart >= grace) [[unlikely]] {
      if (start != 0 && last > start) {
        *ended = BusyPeriod{start, last - start};
        report = true;
      }
      slot.busy_start_ns.store(now_ns, std::memory_order_relaxed);
      slot.busy_seq.fetch_add(1, std::memory_order_relaxed);
    }
  }
  const uint64_t last = slot.last_progress_ns.load(std::memory_order_relaxed);
  if (now_ns > last || last - now_ns >= gpu.hp_grace_ns.load(std::memory_order_relaxed)) {
    slot.last_progress_ns.store(now_ns, std::memory_order_relaxed);  // moves back only from afar
  }
  if (followed) slot.inflight.fetch_add(1, std::memory_order_acq_rel);
  return report;
}

// The class a high-priority launch publishes for the MPS gate: the launch's own, except that a
// graph (mixed) still in flight is not hidden by a kernel launched after it. Call before
// NoteHighPriorityLaunch.
inline void NoteHighPriorityClass(contract::SlotGate& slot, uint32_t kclass) {
  const uint32_t mixed = contract::KernelClassToBoard(contract::KernelClass::kMixed);
  if (kclass != mixed && slot.inflight.load(std::memory_order_relaxed) != 0 &&
      slot.hp_kernel_class.load(std::memory_order_relaxed) == mixed) {
    return;
  }
  slot.hp_kernel_class.store(kclass, std::memory_order_relaxed);
}

// At the GPU completion of a followed high-priority launch, known to have completed at or after
// `done_after_ns` (the last time it was seen pending: the completion tracker looks lazily while
// nobody waits, and stamping the time it looked would stretch the busy period by that delay).
// Progress never moves back. True when nothing is left in flight (the caller opens the gate).
inline bool NoteHighPriorityCompletion(contract::SlotGate& slot, uint64_t done_after_ns) {
  uint64_t last = slot.last_progress_ns.load(std::memory_order_relaxed);
  while (last < done_after_ns &&
         !slot.last_progress_ns.compare_exchange_weak(last, done_after_ns,
                                                      std::memory_order_relaxed)) {
  }
  const uint32_t before = slot.inflight.load(std::memory_order_relaxed);
  return before != 0 && slot.inflight.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

// Whether a timed launch's measurement may hold another process's time slice: on a time-sliced
// GPU (priority mode), best-effort work admitted beside a high-priority client, or high-priority
// work beside a best-effort one, was in flight. An eager service's kernel of 2 us measured 94 us
// that way (H100, beside a trainer): such a sample is the kernel's and the wait's.
inline bool OtherWorkInFlight(const contract::GateArea& gate, const contract::GpuState& gpu,
                              uint32_t own_slot, bool high, uint64_t now_ns) {
  if (gpu.mode.load(std::memory_order_relaxed) !=
      static_cast<uint32_t>(contract::GateMode::kPriority)) {
    return false;
  }
  if (high) return gate.words.be_outstanding_ns.load(std::memory_order_relaxed) != 0;
  return HighPriorityBusy(gate, gpu, own_slot, now_ns).busy;
}

// One best-effort launch's decision. Gate off, server gone, or no high-priority client on the
// GPU: go. Otherwise, by mode:
//  - priority (time-sliced GPU: contexts of different processes never run kernels together, so
//    what delays a high-priority kernel is the best-effort work queued ahead of it, whatever its
//    size; the SM threshold does not apply):
//      HP busy: go while the best-effort work admitted during this busy period (one request of
//      the service, its CPU gaps included) stays within the budget (be_budget_ns), unless every
//      busy HP client launches CUDA graphs: a graph is queued whole and leaves no CPU gaps to
//      fill, so nothing goes while one is in flight, and between graphs (grace only) the GPU
//      counts as idle;
//      HP idle: go while the queued best-effort work stays within the budget; one kernel longer
//      than the budget may run alone.
//    So a high-priority request is delayed by at most what was queued when it arrived (the
//    budget, or that one kernel), plus the budget for an eager one, while best-effort work fills
//    the GPU time a CPU-bound service leaves idle. A DDP job's rank (held on the CPU, gpu_hold.h)
//    beside a ResNet50 graph service on two H200s: with a budget admitted mid-graph, p50 1.52x,
//    the job at 0.32 of its speed alone (7 rounds); with this rule 1.30x, 0.34 (3 rounds); with
//    nothing admitted in the grace either, 1.26x to 1.31x but the job at 0.25 to 0.31 (6 rounds).
//  - mps (kernels of different processes co-run in space; the best-effort share of SMs is capped
//    by MPS itself):
//      HP busy: go if not of the same known class as the running HP kernel (compute next to
//      memory-bound, Orion's rule) and that is not a CUDA graph, within the budget (best-effort
//      work in flight), and, when sm_threshold is set (not 0), with at most that many blocks;
//      HP idle: as in priority mode, go while the queued best-effort work stays within the
//      budget. Unbounded, a trainer queues up to a whole training step, and a request that
//      arrives shares the SMs with all of it, however the gate then holds new launches (a CUDA
//      graph service beside GPT-2-large-like training: p99 4.5x alone unbounded, 1.6x bounded).
// `wake_by_ns`, if not null, receives when a kWait should be re-examined at the latest (the end
// of the HP clients' grace period), or 0 if only a completion can change the answer.
inline GateDecision DecideBestEffort(const contract::Board& board, const contract::GpuState& gpu,
                                     contract::GateArea& gate, uint32_t own_slot, uint64_t now_ns,
                                     const BestEffortLaunch& launch,
                                     uint64_t* wake_by_ns = nullptr) {
  if (wake_by_ns != nullptr) *wake_by_ns = 0;
  const auto mode = static_cast<contract::GateMode>(gpu.mode.load(std::memory_order_relaxed));
  if (mode == contract::GateMode::kPassThrough || !ServerAlive(board, now_ns) ||
      !HighPriorityPresent(gpu, own_slot)) {
    return GateDecision::kGoIdle;
  }
  const uint64_t budget = gpu.be_budget_ns.load(std::memory_order_relaxed);
  const HighPriorityView hp = HighPriorityBusy(gate, gpu, own_slot, now_ns);
  // Between the graphs of graph services (none in flight, only their grace left) the GPU is as
  // idle as after the grace: nothing of a request is left to fill the CPU gaps of.
  const bool between_graphs = hp.BetweenGraphs() && mode != contract::GateMode::kMps;
  if (!hp.busy || between_graphs) {
    if (TryChargeBudget(gate, launch.estimate_ns, budget, /*admit_alone=*/true)) {
      return GateDecision::kGoBudget;
    }
    return GateDecision::kWait;  // a completion gives charges back and wakes us
  }
  if (mode != contract::GateMode::kMps) {
    if (!hp.graphs_only && TryChargePeriod(gate, hp.period, launch.estimate_ns, budget)) {
      gate.words.be_outstanding_ns.fetch_add(launch.estimate_ns, std::memory_order_acq_rel);
      return GateDecision::kGoBudget;
    }
  } else if (const uint32_t threshold = gpu.sm_threshold.load(std::memory_order_relaxed);
             threshold == 0 || launch.blocks <= threshold) {
    const auto mine = contract::KernelClassFromBoard(launch.kernel_class);
    const auto theirs = contract::KernelClassFromBoard(hp.kernel_class);
    // Nothing co-runs beside a high-priority CUDA graph: a GPU-bound service's graph slowed
    // down 1.9x beside a trainer's GEMMs on the other half of the SMs (H100).
    const bool fits = theirs != contract::KernelClass::kMixed &&
                      (mine == contract::KernelClass::kUnknown ||
                       theirs == contract::KernelClass::kUnknown ||
                       contract::Complementary(mine, theirs));
    if (fits && TryChargeBudget(gate, launch.estimate_ns, budget, /*admit_alone=*/false)) {
      return GateDecision::kGoBudget;
    }
  }
  if (wake_by_ns != nullptr) *wake_by_ns = hp.grace_ends_ns;
  return GateDecision::kWait;
}

struct GateTicket {
  uint64_t budget_ns = 0;  // charged to be_outstanding_ns; release at completion
  uint64_t waited_ns = 0;  // time held at the gate (0 if it went at once), paused time included
  uint64_t paused_ns = 0;  // of which the client was paused
  uint64_t go_ns = 0;      // the clock when the gate let the launch go; 0 where it read none
  bool wait_published = false;  // the wait is the client's published one: end it with EndWait
};

// Blocks the calling thread until the launch may go: while the slot is paused, and for a
// best-effort client while the gate says kWait. Counts itself in gate_waiters from the first
// kWait to the end (the 0 -> 1 step wakes the clients' completion trackers through tracker_seq),
// spins up to gpu.spin_ns (at most spin_cap_ns: 0 in a process with less than two CPUs, see
// cpu_limits.h), then futex-waits on gate_seq (or the slot's wake_seq when paused) at most
// kMaxFutexWaitNs at a time, or until the high-priority clients' grace period ends.
// With `counters`, a wait publishes its start there (contract::PublishWaitStart) unless another
// thread's wait is published: the caller then ends it with contract::EndWait.
GateTicket WaitAtGate(const contract::Board& board, contract::GateArea& gate, uint32_t slot_index,
                      const BestEffortLaunch& launch, uint64_t spin_cap_ns = contract::kMaxSpinNs,
                      contract::ClientArea::Counters* counters = nullptr);

// Wakes best-effort threads of every process waiting on this GPU's gate.
void OpenGate(contract::GateArea& gate);

// A wait held for the high-priority clients (a launch at the gate, a hold keeper) is counted in
// gate_waiters while it lasts; the 0 -> 1 step wakes the clients' completion trackers through
// tracker_seq, so they follow completions closely only while somebody waits.
void CountGateWaiter(contract::GateArea& gate);
inline void UncountGateWaiter(contract::GateArea& gate) {
  gate.words.gate_waiters.fetch_sub(1, std::memory_order_acq_rel);
}

// How long such a wait sleeps on gate_seq before it looks again: until `wake_by_ns` (the end of
// the high-priority clients' grace) where that is sooner than kMaxFutexWaitNs.
inline uint64_t GateSleepNs(uint64_t now_ns, uint64_t wake_by_ns) {
  return wake_by_ns > now_ns && wake_by_ns - now_ns < kMaxFutexWaitNs ? wake_by_ns - now_ns
                                                                       : kMaxFutexWaitNs;
}

}  // namespace orion::interpose
