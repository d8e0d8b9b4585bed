// The completion poller: one background thread (`orion-poller`) that takes the records launch
// threads submit, looks at their events (a pass of completion_poll.h) and finishes the completed
// ones (completion_pipeline.cc), and how it sleeps and who wakes it.
//
// It sleeps in three ways: with nothing outstanding, on its own word until a launch thread
// submits a record that needs it (WakePollerAfterSubmit); with only records nobody waits for
// (timing samples, NVTX ranges, budget charges while nobody is held), a lazy period on a GPU's
// tracker_seq, which a thread that starts to wait at that GPU's gate bumps; and, for followed
// high-priority work past its grace, in the driver (cuEventSynchronize on a blocking-sync event).
// At exit it looks closely until the records still outstanding are done (at most 100 ms).
//
// Usage (completion_tracker.cc, SubmitPending):
//   EnsurePoller();  g_submitted.Push(IndexOf(p));  WakePollerAfterSubmit(*p, launched_ns);
#pragma once

#include <stdint.h>

#include <atomic>

#include "interpose/client_state.h"
#include "interpose/completion_tracker.h"
#include "interpose/futex.h"
#include "interpose/record_pool.h"

namespace orion::interpose {

// Futex word (private): 1 while the poller waits with nothing outstanding. Hidden and declared
// so, like the record pool: the launch path reads it directly.
__attribute__((visibility("hidden"))) extern std::atomic<uint32_t> g_poller_sleeping;
// When the first record that nobody waits for (a timing sample, an NVTX range) was submitted to
// an idle poller without waking it; 0: none waiting.
__attribute__((visibility("hidden"))) extern std::atomic<uint64_t> g_lazy_since;

// Starts the poller thread on the first submission (signals blocked, the exit flush hooked).
void EnsurePoller();

// Ends the poller's lazy sleep if it is in one (on the tracker_seq of its GPU's gate area: other
// processes' pollers asleep on the same GPU wake too and look once).
void WakeLazyPoller();

// After `p`, submitted at `launched_ns`, was pushed to g_submitted: wakes the poller if `p`
// needs it now. The steady launch path makes no system call here.
inline void WakePollerAfterSubmit(const PendingLaunch& p, uint64_t launched_ns) {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with the poller's fence
  if (g_poller_sleeping.load(std::memory_order_seq_cst) == 0) {
    // Busy, maybe in a lazy sleep: end it only when records run short (one wake: the first
    // submitter takes the gate's pointer).
    if (RecordsRunningShort()) WakeLazyPoller();
    return;
  }
  // A timing sample or an NVTX range waits for the poller: waking an idle poller for each of
  // them cost a one-core service a context switch per sample. The first one starts the clock;
  // whatever is submitted once it is a lazy period old wakes the poller. Records the gate waits
  // for (high-priority work, best-effort budget) wake it at once, and so does any record once
  // three quarters of the pool are out: a profiled process that launches faster than that would
  // otherwise run out of records before the clock ran out, and with no record left to submit
  // nothing would wake the poller again (sampling stopped for good).
  const bool prompt = p.high_priority || p.budget_ns != 0 || RecordsRunningShort();
  if (!prompt) {
    uint64_t since = g_lazy_since.load(std::memory_order_relaxed);
    if (since == 0) {
      g_lazy_since.compare_exchange_strong(since, launched_ns, std::memory_order_relaxed);
      return;
    }
    if (launched_ns < since + Config().lazy_poll_ns) return;
  }
  if (g_poller_sleeping.exchange(0, std::memory_order_acq_rel) != 0) {
    // Only on the idle -> busy transition: the steady launch path makes no system call.
    FutexWakeOnePrivate(&g_poller_sleeping);
  }
}

// In a fork child: the poller does not exist there; the next submission starts one.
void ResetPollerAfterFork();

}  // namespace orion::interpose
