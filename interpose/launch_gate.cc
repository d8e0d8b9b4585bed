// Waiting at the launch gate: spin, then futex on the gate area's shared words.
#include "interpose/glibc_compat.h"

#include "interpose/launch_gate.h"

#include <algorithm>

#include "interpose/futex.h"

namespace orion::interpose {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

}  // namespace

void OpenGate(contract::GateArea& gate) {
  gate.words.gate_seq.fetch_add(1, std::memory_order_acq_rel);
  if (gate.words.gate_waiters.load(std::memory_order_acquire) > 0) {
    FutexWakeAll(&gate.words.gate_seq);
  }
}

void CountGateWaiter(contract::GateArea& gate) {
  if (gate.words.gate_waiters.fetch_add(1, std::memory_order_seq_cst) == 0) {
    gate.words.tracker_seq.fetch_add(1, std::memory_order_seq_cst);
    FutexWakeAll(&gate.words.tracker_seq);
  }
}

GateTicket WaitAtGate(const contract::Board& board, contract::GateArea& gate, uint32_t slot_index,
                      const BestEffortLaunch& launch, uint64_t spin_cap_ns,
                      contract::ClientArea::Counters* counters) {
  GateTicket ticket;
  const contract::ClientSlot& slot = board.slots[slot_index];
  auto& words = gate.words;
  uint64_t start = 0;
  // The wait starts: published, so that the client's held seconds show it before it ends.
  auto begin = [&](uint64_t now) {
    if (start != 0) return;
    start = now;
    if (counters != nullptr) ticket.wait_published = contract::PublishWaitStart(*counters, now);
  };
  uint64_t paused_since = 0;  // paused now, since then
  bool held = false;  // counted in gate_waiters
  for (;;) {
    // Paused: hold every launch, high priority included, until the server resumes us.
    if (slot.paused.load(std::memory_order_acquire) != 0) {
      const uint64_t now = MonotonicNs();
      begin(now);
      if (paused_since == 0) paused_since = now;
      if (!ServerAlive(board, now)) break;  // a dead server cannot resume us: fail open
      const uint32_t seq = slot.wake_seq.load(std::memory_order_acquire);
      if (slot.paused.load(std::memory_order_acquire) == 0) continue;
      FutexWait(&slot.wake_seq, seq, kMaxFutexWaitNs);
      continue;
    }
    if (paused_since != 0) {
      ticket.paused_ns += MonotonicNs() - paused_since;
      paused_since = 0;
    }
    const uint32_t gpu_index = slot.gpu.load(std::memory_order_relaxed);
    if (gpu_index >= contract::kMaxGpus) break;
    if (static_cast<contract::Priority>(slot.priority.load(std::memory_order_relaxed)) ==
        contract::Priority::kHigh) {
      break;
    }
    const contract::GpuState& gpu = board.gpus[gpu_index];
    const uint64_t now = MonotonicNs();
    const GateDecision decision = DecideBestEffort(board, gpu, gate, slot_index, now, launch);
    if (decision != GateDecision::kWait) {
      if (decision == GateDecision::kGoBudget) ticket.budget_ns = launch.estimate_ns;
      ticket.go_ns = now;
      break;
    }
    begin(now);
    if (!held) {
      // Held from here on: completion trackers of every client on this GPU follow closely now.
      held = true;
      CountGateWaiter(gate);
    }
    const uint64_t spin_ns =
        std::min<uint64_t>(gpu.spin_ns.load(std::memory_order_relaxed), contract::kMaxSpinNs);
    if (now - start < std::min(spin_ns, spin_cap_ns)) {
      for (int i = 0; i < 32; ++i) CpuRelax();
      continue;
    }
    // Counted as a waiter before the last check, so a completion that lands in between either is
    // seen by the check or changes gate_seq and makes FUTEX_WAIT return at once.
    const uint32_t seq = words.gate_seq.load(std::memory_order_acquire);
    const uint64_t checked = MonotonicNs();
    uint64_t wake_by = 0;
    const GateDecision again =
        DecideBestEffort(board, gpu, gate, slot_index, checked, launch, &wake_by);
    if (again == GateDecision::kWait) {
      // At the end of the HP clients' grace period: no completion will wake us then.
      FutexWait(&words.gate_seq, seq, GateSleepNs(checked, wake_by));
      continue;
    }
    if (again == GateDecision::kGoBudget) ticket.budget_ns = launch.estimate_ns;
    ticket.go_ns = checked;
    break;
  }
  if (held) UncountGateWaiter(gate);
  if (start != 0) {
    const uint64_t end = MonotonicNs();
    ticket.go_ns = end;
    ticket.waited_ns = end - start;
    if (paused_since != 0) ticket.paused_ns += end - paused_since;  // left while paused
    // Never held by the gate itself: the whole wait was the pause (and the look after it).
    if (!held && ticket.paused_ns != 0) ticket.paused_ns = ticket.waited_ns;
  }
  return ticket;
}

}  // namespace orion::interpose
