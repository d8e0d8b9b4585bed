// The launch side of completion tracking (completion_tracker.h): a record taken from the pool
// (record_pool.h) with its events created in the launch's context, the start event recorded
// before a timed launch, the completion event after it, and the record handed to the poller
// (completion_poller.h), which it wakes only where the record needs it now.
#include "interpose/glibc_compat.h"

#include "interpose/completion_tracker.h"

#include <pthread.h>

#include "interpose/completion_poller.h"
#include "interpose/completion_pipeline.h"
#include "interpose/gpu_hold.h"
#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"
#include "interpose/record_pool.h"
#include "interpose/timing_hold.h"

namespace orion::interpose {

PendingLaunch g_pool[kPoolSize];
IndexQueue g_free;
IndexQueue g_submitted;

namespace {

pthread_once_t g_queues_once = PTHREAD_ONCE_INIT;

void InitQueues() {
  g_free.Reset(/*full=*/true);
  g_submitted.Reset(/*full=*/false);
}

void DestroyEvents(PendingLaunch* p) {
  auto destroy = ORION_DRIVER(cuEventDestroy_v2);
  for (CUevent* e : {&p->done, &p->done_sync, &p->start, &p->end}) {
    if (*e != nullptr && destroy != nullptr) destroy(*e);
    *e = nullptr;
  }
}

bool RecordOn(CUevent event, CUstream stream, bool per_thread_stream) {
  auto record = per_thread_stream ? ORION_DRIVER(cuEventRecord_ptsz) : ORION_DRIVER(cuEventRecord);
  return record != nullptr && record(event, stream) == CUDA_SUCCESS;
}

}  // namespace

PendingLaunch* AcquirePending(CUcontext ctx, bool timed, bool wait_in_driver) {
  pthread_once(&g_queues_once, InitQueues);
  uint32_t index;
  if (ctx == nullptr || !g_free.Pop(&index)) return nullptr;
  PendingLaunch* p = &g_pool[index];
  if (p->ctx != ctx) {
    DestroyEvents(p);
    p->ctx = ctx;
  }
  auto create = ORION_DRIVER(cuEventCreate);
  bool ok = create != nullptr;
  wait_in_driver = wait_in_driver && !timed;
  if (ok && !timed && !wait_in_driver && p->done == nullptr) {
    ok = create(&p->done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
  }
  if (ok && wait_in_driver && p->done_sync == nullptr) {
    ok = create(&p->done_sync, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC) == CUDA_SUCCESS;
  }
  if (ok && timed && p->start == nullptr) ok = create(&p->start, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
  // Timing events are only ever queried, never waited for: no blocking sync (its every
  // completion wakes the driver's event thread: 14 ms of CPU a second on a one-core H100
  // service timing 700 launches a second).
  if (ok && timed && p->end == nullptr) ok = create(&p->end, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
  if (!ok) {
    g_free.Push(index);
    return nullptr;
  }
  p->reg = nullptr;
  p->kernel = nullptr;
  p->func = 0;
  p->stream = 0;
  p->budget_ns = 0;
  p->high_priority = false;
  p->timed = timed;
  p->wait_in_driver = wait_in_driver;
  p->pending_at_ns = 0;
  p->launched_ns = 0;
  p->start_recorded_ns = 0;
  p->warmup = false;
  p->high = false;
  p->contended = false;
  p->ordered = false;
  p->range = false;
  p->depth = 0;
  p->cpu_start_ns = p->cpu_end_ns = 0;
  p->name[0] = '\0';
  return p;
}

bool RecordStart(PendingLaunch* p, CUstream stream, bool per_thread_stream) {
  if (!RecordOn(p->start, stream, per_thread_stream)) return false;
  p->start_recorded_ns = MonotonicNs();
  return true;
}

void SubmitPending(PendingLaunch* p, CUstream stream, bool per_thread_stream,
                   uint64_t launched_ns) {
  p->pending_at_ns = launched_ns;
  p->launched_ns = launched_ns;
  if (!RecordOn(CompletionEvent(*p), stream, per_thread_stream)) {
    // The events may belong to a destroyed context whose address was reused: recreate them on
    // the record's next use instead of failing forever.
    DestroyEvents(p);
    p->ctx = nullptr;
    FinishRecord(p, false);
    return;
  }
  // A per-thread default stream has one handle for many streams: no order between its records.
  p->ordered = stream != CU_STREAM_PER_THREAD && !(per_thread_stream && stream == nullptr);
  EnsurePoller();
  g_submitted.Push(IndexOf(p));
  WakePollerAfterSubmit(*p, launched_ns);
}

void CompleteNow(PendingLaunch* p) { FinishRecord(p, false); }

void ReleasePending(PendingLaunch* p) { g_free.Push(IndexOf(p)); }

void ResetCompletionTrackerAfterFork() {
  // The poller does not exist in the child and the parent's events are not valid there.
  for (auto& p : g_pool) p = PendingLaunch{};
  ResetCompletionPipelineAfterFork();
  ResetHoldAfterFork();
  ResetTimingHoldAfterFork();
  g_queues_once = PTHREAD_ONCE_INIT;
  ResetPollerAfterFork();
}

}  // namespace orion::interpose
