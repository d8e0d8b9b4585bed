// Holding best-effort work on the GPU instead of on the CPU (priority mode, knob gpu_hold): a
// best-effort launch goes to the driver at once, behind a stream wait on the gate area's
// gpu_hold word (cuStreamWaitValue32: run on once the word is 0). A high-priority launch sets
// the word (a CPU store: the best-effort kernels already queued stop at their next wait), and a
// hold keeper thread in each best-effort process clears it as soon as the GPU's high-priority
// clients are idle by the gate's own rule (HighPriorityBusy: nothing in flight, grace over), so
// the work the trainer queued meanwhile starts on the GPU with no CPU round trip to refill it. A
// process that cuts GEMMs waits on a second word, opened between graphs too (below).
//
// The word holds 0 (open) or the hold's epoch (never 0); a keeper opens only the epoch it saw
// held, so a hold set again in between stays. The keeper opens whatever the state of the
// server, the knob or the high-priority clients says nobody is to be protected: a dead server, a
// high-priority client that died holding it, or a tenant's bogus word never stall best-effort
// work for longer than the gate itself would.
//
// Ranks of a multi-GPU job are never held on the GPU: a process that launched a collective
// (ProcessState::runs_collectives) takes the gate on the CPU. Held on the GPU, a rank's compute
// and its never-held collectives wait on each other across GPUs (a DDP job beside a graph service
// on two H200s: the service 1,165x its p50 alone and the job stalled), while on the CPU its
// queued work drains before the gate holds the next launch (the same pair: 1.29x, job 0.34).
//
// GEMMs in pieces: a process that ran a long GEMM in pieces (hooks_blas.cc,
// ProcessState::splits_gemms) waits at the gate on the CPU, and what the gate admits goes behind
// a wait on the hold's second word, gpu_hold_admitted, which every hold takes with gpu_hold and
// that process's keeper opens between graphs, when its gate admits (and gpu_hold too, for a
// drain after its first cut: KeeperMayOpen). The CPU gate bounds what is queued to the budget
// (or one longer kernel alone), and the word stops what of it has not started when the
// service's next graph is launched. Measured with one word, which for one trainer acts as the
// two do once the drain is over. Beside a BERT graph service and an LLM-sized trainer (H200,
// the same rounds): p50 1.48x to 1.51x against 1.52x to 1.58x on the CPU alone, harvest 0.76
// to 0.79 against 0.77 to 0.79 (3 rounds); beside the ResNet50 graph 1.37x against 1.39x (1
// round). Held on the GPU alone, the pieces stalled the BERT graph service in every round: the
// GPU idle one whole time slice between two graphs, the service saturated, the hold never open,
// the service at 846x to 1,201x its p50 alone. A
// context blocked on a stream wait costs a service nothing (bench gpu-gate's blocked arms, a
// channel's queue full of waits included), so what takes the slice is in the trainer's process
// and not found; with the CPU gate in front, what waits behind the word stays within the
// budget, and no round stalled (6 arms, one trainer each). With one word for both, a trainer
// held on the GPU alone beside a process that cuts GEMMs ran between graphs too, uncharged: its
// whole queue could go. gpu_hold, the word such a trainer waits on, stays held through the grace
// (tests/blas_double/gemm_split_test.cc). The two words side by side, such a trainer beside
// one that cuts GEMMs (H200, 5 rounds beside two graph services): no stall, p50 as beside the
// second alone.
//
// The decision functions are pure over shared memory (tests/interpose/launch_gate_test.cc);
// QueueHoldWait and the keeper (gpu_hold.cc) talk to the driver.
//
// Usage:
//   high-priority launch beside best-effort clients (FollowHighPriority), before the call:
//                          NoteHighPriorityGraph(own, graph);  NoteHighPriorityLaunch(...);
//                          bool woke = graph && HoldGpu(gate);  launch;
//                          if (woke) WakeHoldKeepers(gate);
//   best-effort launch:    if (GpuHoldOn(gpu) && HoldsOnGpuFor(gate, gpu, own) &&
//                              QueueHoldWait(reg, stream, ptsz)) launch;  else the gate on the CPU
//                          (a process that cuts GEMMs: the gate on the CPU, then QueueHoldWait)
#pragma once

#include <stdint.h>

#include <algorithm>
#include <atomic>

#include "interpose/cuda_abi.h"
#include "interpose/launch_gate.h"

namespace orion::interpose {

struct Registration;

// Priority mode with the gpu_hold knob on.
inline bool GpuHoldOn(const contract::GpuState& gpu) {
  return gpu.gpu_hold.load(std::memory_order_relaxed) != 0 &&
         gpu.mode.load(std::memory_order_relaxed) ==
             static_cast<uint32_t>(contract::GateMode::kPriority);
}

// The two words of the hold: kHeld (gpu_hold) for launches held on the GPU alone, opened once
// the high-priority clients are idle; kAdmitted (gpu_hold_admitted) for launches the gate on the
// CPU admitted first (a process that cuts GEMMs), opened also between graphs, as that gate
// admits. A hold takes both at one epoch.
enum class HoldWord : uint8_t { kHeld, kAdmitted };

inline std::atomic<uint32_t>& HoldWordOf(contract::GateArea& gate, HoldWord which) {
  return which == HoldWord::kHeld ? gate.words.gpu_hold : gate.words.gpu_hold_admitted;
}

// A high-priority launch, before it goes and after its notes say it is in flight: sets both
// words to a new epoch, held already or not, so that a keeper that decided to open the epoch it
// saw, on notes from before this launch, fails to. True when gpu_hold was open: wake the keepers
// asleep on it after the launch (a keeper that opened only gpu_hold_admitted is awake, following
// gpu_hold).
inline bool HoldGpu(contract::GateArea& gate) {
  uint32_t epoch = 0;
  while (epoch == 0) epoch = gate.words.hold_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  gate.words.gpu_hold_admitted.store(epoch, std::memory_order_seq_cst);
  return gate.words.gpu_hold.exchange(epoch, std::memory_order_seq_cst) == 0;
}

// Whether best-effort work is held on the GPU for this GPU's high-priority clients: some other
// client marked high priority launches CUDA graphs. An eager service's short kernels, launched
// one by one with CPU gaps between them, are not: best-effort work blocked on the GPU keeps its
// context runnable, and each gap lets the GPU switch to it and back (an eager ResNet50 service
// beside an LM trainer, H200: service time 1.12x, p50 1.71x, p99 2.51x held on the GPU against
// 1.01x, 1.12x and 1.26x held at the gate on the CPU, which drains what was queued first).
inline bool HoldsOnGpuFor(const contract::GateArea& gate, const contract::GpuState& gpu,
                          uint32_t own_slot) {
  return !ForEachOtherHighPriority(gpu, own_slot, [&gate](uint32_t index) {
    return gate.slots[index].launches_graphs.load(std::memory_order_relaxed) == 0;
  });
}

// A high-priority launch publishes whether it is a graph (a store only when that changes).
inline void NoteHighPriorityGraph(contract::SlotGate& slot, bool graph) {
  const uint32_t value = graph ? 1 : 0;
  if (slot.launches_graphs.load(std::memory_order_relaxed) != value) {
    slot.launches_graphs.store(value, std::memory_order_relaxed);
  }
}

// What the high-priority clients allow a keeper now: kOpen when the knob is off, the server is
// gone, no other client is high priority, or none of them is busy; kTooLong when they have been
// busy for longer than the GPU's gpu_hold_max_ns (0: no bound; below); kBetweenGraphs when the
// busy ones all launch graphs and have none in flight, only their grace left (as the gate on the
// CPU admits: DecideBestEffort); else kHeld. Unless kOpen or kTooLong, *wake_by_ns is when to
// look again at the latest (the end of their grace, or of the bound), 0 if only a completion can
// change the answer.
//
// A hold that lasts: the hold opens only in the high-priority clients' gaps, so a service that
// leaves none keeps it shut, and what is queued behind it stays queued. Twice in four runs of a
// BERT graph service started beside two trainers as the one that cuts GEMMs began its first step
// (H200; bench `timeline --together --trainer llm+resnet50`), the service ran 3.0 ms a request
// against 0.95 ms for minutes (the GPU idle a time slice before each graph, as with GEMM pieces
// held on the GPU, above), both trainers' work blocked on the word: saturated, it left no gap.
// What takes the slice is not found (with the driver alone, a blocked context, two, or copies
// behind the word cost a graph service nothing: bench gpu-gate). So a hold lasts at most the
// server's policy.gpu_hold_max_ms (100 ms by default) of a busy period, counted from the earliest
// SlotGate::busy_start_ns of the busy clients: past it, keepers open both words whenever held,
// and their processes' launches wait at the gate on the CPU, nothing queued behind a word
// (Registration::hold_released), for policy.gpu_hold_release_ms (30 s) and until those clients
// are idle. The trainers' queued work runs once beside the service, then the gate on the CPU
// admits between graphs within the budget, as it does beside eager services. At 500 ms none of
// 8 such runs stalled (H200), but in 5 of the 7 whose counts were kept the trainers were
// released in the service's first seconds, as `llm` began its first step, up to 10 times, and
// the service read p99 148 ms over the run (median); at 100 ms and released until idle, 1 and
// 12 releases, p99 10 and 118 ms; at 100 ms and 30 s, 1 or 2 releases, p99 18 to 24 ms. A
// service whose busy periods last that long by themselves (long bursts of graphs, or run past
// its capacity) takes that path in each of them.
enum class HoldAllows : uint8_t { kHeld, kBetweenGraphs, kOpen, kTooLong };

// The hold's bound through one busy period (the server's policy.gpu_hold_max_ms; 0: none), and
// how long a release past it lasts at least (policy.gpu_hold_release_ms; 0: until the
// high-priority clients are idle), each within the contract's range whatever the board says.
inline uint64_t HoldBoundNs(const contract::GpuState& gpu) {
  return std::min(gpu.gpu_hold_max_ns.load(std::memory_order_relaxed),
                  contract::kMaxGpuHoldMaxNs);
}
inline uint64_t HoldReleaseNs(const contract::GpuState& gpu) {
  return std::min(gpu.gpu_hold_release_ns.load(std::memory_order_relaxed),
                  contract::kMaxGpuHoldReleaseNs);
}
inline HoldAllows HoldAllowsNow(const contract::Board& board, const contract::GpuState& gpu,
                                const contract::GateArea& gate, uint32_t own_slot,
                                uint64_t now_ns, uint64_t* wake_by_ns) {
  *wake_by_ns = 0;
  if (!GpuHoldOn(gpu) || !ServerAlive(board, now_ns) || !HighPriorityPresent(gpu, own_slot)) {
    return HoldAllows::kOpen;
  }
  const HighPriorityView hp = HighPriorityBusy(gate, gpu, own_slot, now_ns);
  if (!hp.busy) return HoldAllows::kOpen;
  *wake_by_ns = hp.grace_ends_ns;
  const uint64_t bound = HoldBoundNs(gpu);
  if (bound != 0 && hp.busy_since_ns != 0) {  // busy_since_ns <= now_ns: no overflow
    const uint64_t bound_ends = hp.busy_since_ns + bound;
    if (now_ns >= bound_ends) return HoldAllows::kTooLong;
    if (*wake_by_ns == 0 || bound_ends < *wake_by_ns) *wake_by_ns = bound_ends;
  }
  return hp.BetweenGraphs() ? HoldAllows::kBetweenGraphs : HoldAllows::kHeld;
}

// The words a keeper opens now (`wake_by_ns` as HoldAllowsNow's): both once the high-priority
// clients are idle (or nobody is to be protected); between graphs, gpu_hold_admitted in a
// process that cuts GEMMs, and gpu_hold too while the waits it queued on gpu_hold before its
// first cut may still be pending (`draining`: for EnvConfig::hold_drain_ns after that cut, 5 s,
// far longer than a trainer queues ahead; none is queued after it, hooks_launch.cc, and one
// still queued later opens at the end of a grace, as any wait on gpu_hold). Held launches of
// other trainers wait on gpu_hold: it stays held through the grace, so that they do not run
// between graphs, uncharged, except during such a drain, when they do. The keeper of a process
// that cuts GEMMs follows gpu_hold through every grace, counted among the gate's waiters, so the
// service's completion trackers follow closely then too, as they do beside a trainer held on the
// GPU alone.
// Past the hold's bound (kTooLong), both, and `released`: the process's launches wait at the
// gate on the CPU until the busy period ends.
struct HoldOpening {
  bool held = false;
  bool admitted = false;
  bool released = false;
};
inline HoldOpening KeeperMayOpen(const contract::Board& board, const contract::GpuState& gpu,
                                 const contract::GateArea& gate, uint32_t own_slot,
                                 uint64_t now_ns, uint64_t* wake_by_ns, bool cuts_gemms,
                                 bool draining) {
  switch (HoldAllowsNow(board, gpu, gate, own_slot, now_ns, wake_by_ns)) {
    case HoldAllows::kOpen: return {true, true};
    case HoldAllows::kTooLong: return {true, true, true};
    case HoldAllows::kBetweenGraphs:
      return cuts_gemms ? HoldOpening{draining, true} : HoldOpening{};
    case HoldAllows::kHeld: break;
  }
  return {};
}

// Opens the hold of `epoch` on one word; false if it changed (opened, or held again since).
inline bool OpenGpuHold(contract::GateArea& gate, uint32_t epoch,
                        HoldWord which = HoldWord::kHeld) {
  return HoldWordOf(gate, which).compare_exchange_strong(epoch, 0, std::memory_order_seq_cst);
}

// Best-effort launch on `stream` of the registration's GPU, gpu_hold on: queues a stream wait
// on the word before it (every launch: what runs on after the word is set is then the kernel
// running at that moment and nothing more; a wait every 250 us of estimated work instead let
// that much run on and gave a BERT graph service beside an LM trainer p99 1.92x against 1.30x,
// one H200 round), and starts the process's keeper for the GPU. False where the GPU cannot hold
// (the word cannot be registered with the driver, no wait-value entry point, or the wait was
// refused): the caller holds the launch at the gate on the CPU instead. `which`: kAdmitted for a
// launch the gate on the CPU admitted.
bool QueueHoldWait(Registration* reg, CUstream stream, bool per_thread_stream,
                   HoldWord which = HoldWord::kHeld);

// A launch of the process is about to wait at the gate on the CPU (paused, cutting GEMMs from
// now on, or the GPU could not hold it): the time held on the GPU ends here, and that wait
// counts from now on, so that the two are never counted twice.
void EndHeldOnGpu(const Registration* reg);

// Wakes the keepers asleep on an open word (after a launch that took the hold).
void WakeHoldKeepers(contract::GateArea& gate);

// After fork(): the child has no keeper threads.
void ResetHoldAfterFork();

}  // namespace orion::interpose
