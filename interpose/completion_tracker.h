// Tracks GPU completion of launches the interposer must follow: high-priority launches (the
// slot's inflight count), best-effort launches that were charged to the gate's budget, and
// sampled launches timed with CUevents (profile + online duration estimate).
//
// The launch path takes a pooled record (lock-free queue, record_pool.h), records events on the
// launch's stream and hands the record to a background poller thread (completion_poller.cc); it
// makes no system call and takes no lock. The poller (completion_poller.h), started lazily on the
// first record, cuEventQuery's records and finishes the completed ones: the slot and the gate
// updated, the timed samples and NVTX ranges reported, the records recycled
// (completion_pipeline.h). With no record outstanding it sleeps until the next submission; with
// records, when completion_poll.h's schedule says (closely only while somebody is held at the
// gate).
//
// Usage:
//   PendingLaunch* p = AcquirePending(ctx, /*timed=*/true);   // may be null: pool exhausted
//   RecordStart(p, stream, ptsz); launch...; SubmitPending(p, stream, ptsz, launched_ns);
#pragma once

#include <stdint.h>

#include "interpose/client_state.h"
#include "interpose/cuda_abi.h"
#include "interpose/kernel_registry.h"

namespace orion::interpose {

struct PendingLaunch {
  // Owned events, created lazily in `ctx` and reused.
  // Every completion of a blocking-sync event wakes the driver's event thread, whether anybody
  // waits for it or not: followed with one, an eager service's every launch cost its one core
  // 158 ms of CPU a second in that thread beside a trainer (H100, round 11). So
  // `done` and the timing pair are plain events, only queried, and `done_sync` (blocking sync)
  // is used where the poller may wait in the driver: a followed launch long enough to sleep
  // for (a graph, a kernel of kDriverWaitMinNs or more).
  CUevent done = nullptr;       // CU_EVENT_DISABLE_TIMING: completion only
  CUevent done_sync = nullptr;  // CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC
  CUevent start = nullptr;      // timing pair for sampled launches
  CUevent end = nullptr;
  CUcontext ctx = nullptr;
  // Per use.
  Registration* reg = nullptr;
  KernelRecord* kernel = nullptr;
  uint64_t func = 0;
  uint64_t stream = 0;
  uint64_t budget_ns = 0;
  uint32_t grid[3] = {};
  uint32_t block[3] = {};
  bool high_priority = false;  // followed: counted in slot.inflight
  // The last time the record was known not complete: its submission, then each poller pass that
  // found it pending. Its completion happened after this.
  uint64_t pending_at_ns = 0;
  uint64_t launched_ns = 0;  // when the launch call returned (host clock)
  uint64_t start_recorded_ns = 0;  // when the start event's record call returned (timed only)
  bool timed = false;
  bool wait_in_driver = false;  // completes with done_sync: the poller may sleep on it
  bool warmup = false;  // one of a kernel's first launches (cold): a kWarmupSample
  bool high = false;    // launched at high priority (timed only)
  // Another process's work was in flight at the launch or at completion (OtherWorkInFlight):
  // a kContendedSample.
  bool contended = false;
  // Held on its stream from before the start event until the end event's record
  // (timing_hold.h): the start event ran right before the kernel.
  bool held = false;
  bool graph = false;  // a CUDA graph launch (`kernel` is its g_graphs record)
  // The stream handle names one stream of ctx (not a per-thread default stream), so records
  // with the same (ctx, stream) complete in submission order.
  bool ordered = false;
  // An NVTX range (nvtx_ranges.cc) instead of a launch: `start` was recorded at its push, `end`
  // at its pop; on completion it is reported as a kRange event.
  bool range = false;
  uint32_t depth = 0;
  uint64_t cpu_start_ns = 0;
  uint64_t cpu_end_ns = 0;
  char name[contract::kKernelNameBytes] = {};
};

// A followed high-priority launch at least this long (estimated) is waited for in the driver,
// asleep; a shorter one is polled past its client's grace (completion_poll.h).
inline constexpr uint64_t kDriverWaitMinNs = 200'000;

// The event a record completes with.
inline CUevent CompletionEvent(const PendingLaunch& p) {
  return p.timed ? p.end : p.wait_in_driver ? p.done_sync : p.done;
}

// A record whose events live in `ctx`, or null if the pool is exhausted or events cannot be
// created (the launch then goes untracked). `wait_in_driver`: an untimed record that completes
// with a blocking-sync event.
PendingLaunch* AcquirePending(CUcontext ctx, bool timed, bool wait_in_driver = false);
// Records the start event of a timed launch; returns false if timing is impossible.
bool RecordStart(PendingLaunch* p, CUstream stream, bool per_thread_stream);
// After a successful launch at `launched_ns`: records the completion event and hands the record
// to the poller. If recording fails the record completes at once.
void SubmitPending(PendingLaunch* p, CUstream stream, bool per_thread_stream, uint64_t launched_ns);
// Completion bookkeeping without the GPU (launch failed / event failed) and recycling.
void CompleteNow(PendingLaunch* p);
void ReleasePending(PendingLaunch* p);

void ResetCompletionTrackerAfterFork();

}  // namespace orion::interpose
