// The completion poller's thread (completion_poller.h): its loop over the submitted records, its
// sleeps (idle, lazy, in the driver) and the flush at exit.
#include "interpose/glibc_compat.h"

#include "interpose/completion_poller.h"

#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <atomic>

#include "interpose/completion_poll.h"
#include "interpose/completion_pipeline.h"
#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"

namespace orion::interpose {

std::atomic<uint32_t> g_poller_sleeping{0};
std::atomic<uint64_t> g_lazy_since{0};

namespace {

std::atomic<uint32_t> g_poller_started{0};
// At exit (FlushAtExit): the poller looks closely until nothing is outstanding, then sets
// g_flush_done (a private futex word) so that the last lazy period's samples and ranges are
// reported before the process is gone.
std::atomic<uint32_t> g_flush{0};
std::atomic<uint32_t> g_flush_done{0};
// The gate area whose tracker_seq the poller sleeps on during a lazy period, for WakeLazyPoller
// (a submission that finds records running short, the exit flush) to wake it; null while it
// sleeps elsewhere or not at all.
std::atomic<contract::GateArea*> g_lazy_gate{nullptr};
// The longest the process's exit waits for the poller's last pass.
constexpr uint64_t kExitFlushNs = 100'000'000;

void SleepNs(uint64_t ns) {
  timespec ts{0, static_cast<long>(ns)};
  nanosleep(&ts, nullptr);
}

// Nobody is held at the gate: sleeps up to `ns`, or until a best-effort thread that starts to
// wait at this GPU's gate bumps its tracker_seq (a shared futex: the waiter may be another
// process). The seq is read before gate_waiters, and the waiter bumps it after raising
// gate_waiters, so a waiter that arrives after the check changes the word and ends the wait.
// This process wakes it through the same word (WakeLazyPoller) when it runs short of records or
// exits: the poller announces the gate first and checks both after reading the seq, so a wake
// that comes after the check changes the word and ends the wait.
void SleepUnlessHeld(contract::GateArea& gate, uint64_t ns) {
  g_lazy_gate.store(&gate, std::memory_order_seq_cst);
  const uint32_t seq = gate.words.tracker_seq.load(std::memory_order_seq_cst);
  if (gate.words.gate_waiters.load(std::memory_order_seq_cst) == 0 &&
      g_flush.load(std::memory_order_seq_cst) == 0) {
    // Short of records (a burst, or work queued deep on the GPU): look again soon, not never.
    if (RecordsRunningShort()) ns = std::min<uint64_t>(ns, kHighPriorityPollNs);
    FutexWait(&gate.words.tracker_seq, seq, ns);
  }
  g_lazy_gate.store(nullptr, std::memory_order_relaxed);
}

// atexit: records that nobody waited for may sit for up to a lazy period (a short job's last
// timing samples and NVTX ranges, a profiled run's launches). Asks the poller to finish them now
// and waits for it at most kExitFlushNs; the work the application left on the GPU, if any, is
// not waited for longer than that.
void FlushAtExit() {
  if (g_poller_started.load(std::memory_order_acquire) == 0) return;  // none, or a fork child's
  g_flush_done.store(0, std::memory_order_relaxed);
  g_flush.store(1, std::memory_order_seq_cst);
  if (g_poller_sleeping.exchange(0, std::memory_order_seq_cst) != 0) {
    FutexWakeOnePrivate(&g_poller_sleeping);
  }
  WakeLazyPoller();
  const uint64_t deadline = MonotonicNs() + kExitFlushNs;
  for (uint64_t now = MonotonicNs(); now < deadline; now = MonotonicNs()) {
    if (g_flush_done.load(std::memory_order_acquire) != 0) return;
    FutexWaitPrivate(&g_flush_done, 0, deadline - now);
  }
}

void* PollerMain(void*) {
  // Named, so that `top -H` and /proc/PID/task/*/comm show what the interposer's thread costs
  // (prctl, not pthread_setname_np: that one binds to GLIBC_2.34, glibc_compat.h).
  prctl(PR_SET_NAME, "orion-poller", 0, 0, 0);
  // Outstanding records in submission order; a record completes when its event does.
  static PendingLaunch* outstanding[kPoolSize];
  uint32_t count = 0;
  CUcontext current = nullptr;
  auto query = ORION_DRIVER(cuEventQuery);
  auto sync = ORION_DRIVER(cuEventSynchronize);
  auto set_ctx = ORION_DRIVER(cuCtxSetCurrent);
  // cuEventQuery is a "potentially unsafe" call while another thread captures a graph in global
  // mode (PyTorch's default); relaxed mode keeps this thread from invalidating the capture.
  if (auto exchange = ORION_DRIVER(cuThreadExchangeStreamCaptureMode); exchange != nullptr) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    exchange(&mode);
  }
  for (;;) {
    uint32_t index;
    while (count < kPoolSize && g_submitted.Pop(&index)) outstanding[count++] = &g_pool[index];
    auto use_context = [&](const PendingLaunch& p) {
      if (p.ctx != current && set_ctx != nullptr) {
        set_ctx(p.ctx);
        current = p.ctx;
      }
    };
    auto finish = [](PendingLaunch* p, CUresult status) {
      FinishRecord(p, status == CUDA_SUCCESS);
    };
    PollSchedule schedule;
    count = PollPass(
        outstanding, count, MonotonicNs(), Config().lazy_poll_ns,
        [&](const PendingLaunch& p) {
          use_context(p);
          return query != nullptr ? query(CompletionEvent(p)) : CUDA_SUCCESS;
        },
        finish, &schedule);
    const bool flushing = g_flush.load(std::memory_order_seq_cst) != 0;
    if (count != 0 && flushing) {
      SleepNs(kBestEffortPollNs);  // exiting: look closely until the last record is done
      continue;
    }
    if (count != 0) {
      if (PendingLaunch* p = schedule.wait_for; p != nullptr && sync != nullptr) {
        use_context(*p);
        const CUresult status = sync(CompletionEvent(*p));
        p->pending_at_ns = MonotonicNs();  // it completed just now
        count = FinishThrough(outstanding, count, p, status, finish);
      } else if (p != nullptr) {
        SleepNs(kHighPriorityPollNs);
      } else if (schedule.lazy_gate != nullptr) {
        SleepUnlessHeld(*schedule.lazy_gate, schedule.sleep_ns);
      } else {
        SleepNs(schedule.sleep_ns);
      }
      continue;
    }
    if (flushing && g_submitted.Pop(&index)) {
      outstanding[count++] = &g_pool[index];
      continue;
    }
    if (flushing && g_flush_done.exchange(1, std::memory_order_release) == 0) {
      FutexWakeOnePrivate(&g_flush_done);
    }
    // Idle: sleep until a launch thread submits (it wakes us only when we announced sleeping).
    g_poller_sleeping.store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (g_submitted.Pop(&index)) {
      g_poller_sleeping.store(0, std::memory_order_relaxed);
      outstanding[count++] = &g_pool[index];
      continue;
    }
    // No timeout: with nothing outstanding there is nothing to look at until a launch submits
    // (records nobody waits for wake us when they are a lazy period old, see
    // WakePollerAfterSubmit).
    FutexWaitPrivate(&g_poller_sleeping, 1, kNoFutexTimeout);
    g_poller_sleeping.store(0, std::memory_order_relaxed);
    g_lazy_since.store(0, std::memory_order_relaxed);
  }
  return nullptr;
}

}  // namespace

void EnsurePoller() {
  if (g_poller_started.load(std::memory_order_acquire) != 0) return;
  if (g_poller_started.exchange(1, std::memory_order_acq_rel) != 0) return;
  if (StartQuietThread(PollerMain, nullptr)) {
    static bool exit_hook = false;  // once per process image (a fork child inherits it)
    if (!exit_hook) {
      exit_hook = true;
      atexit(FlushAtExit);
    }
  } else {
    g_poller_started.store(0, std::memory_order_release);
  }
}

void WakeLazyPoller() {
  contract::GateArea* gate = g_lazy_gate.exchange(nullptr, std::memory_order_seq_cst);
  if (gate == nullptr) return;
  gate->words.tracker_seq.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&gate->words.tracker_seq);
}

void ResetPollerAfterFork() {
  g_poller_started.store(0, std::memory_order_relaxed);
  g_poller_sleeping.store(0, std::memory_order_relaxed);
  g_lazy_since.store(0, std::memory_order_relaxed);
  g_flush.store(0, std::memory_order_relaxed);
  g_flush_done.store(0, std::memory_order_relaxed);
  g_lazy_gate.store(nullptr, std::memory_order_relaxed);
}

}  // namespace orion::interpose
