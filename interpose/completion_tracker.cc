// Pooled completion records, the lock-free queues between launch threads and the poller, and
// the poller thread itself.
#include "interpose/glibc_compat.h"

#include "interpose/completion_tracker.h"
#include "interpose/completion_poll.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "interpose/futex.h"
#include "interpose/gpu_clock.h"
#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"
#include "interpose/sample_timing.h"
#include "interpose/timing_log.h"

namespace orion::interpose {
namespace {

constexpr uint32_t kPoolSize = 1024;  // power of two; also the queues' capacity

// Bounded MPMC queue of record indices (sequence-numbered cells): push and pop are a CAS each,
// never a lock. Capacity equals the pool size, so a push of a pool index cannot fail.
class IndexQueue {
 public:
  void Reset(bool full) {
    for (uint32_t i = 0; i < kPoolSize; ++i) {
      cells_[i].seq.store(full ? i + 1 : i, std::memory_order_relaxed);
      cells_[i].value = i;
    }
    head_.store(0, std::memory_order_relaxed);
    tail_.store(full ? kPoolSize : 0, std::memory_order_relaxed);
  }
  bool Push(uint32_t value) {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[pos & (kPoolSize - 1)];
      const uint64_t seq = cell.seq.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq) - static_cast<int64_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          cell.value = value;
          cell.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }
  // How many it holds, give or take the pushes and pops under way.
  uint64_t SizeApprox() const {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    return tail > head ? tail - head : 0;
  }
  bool Pop(uint32_t* value) {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[pos & (kPoolSize - 1)];
      const uint64_t seq = cell.seq.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq) - static_cast<int64_t>(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          *value = cell.value;
          cell.seq.store(pos + kPoolSize, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

 private:
  struct Cell {
    std::atomic<uint64_t> seq;
    uint32_t value;
  };
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  Cell cells_[kPoolSize] = {};
};

PendingLaunch g_pool[kPoolSize];
IndexQueue g_free;
IndexQueue g_submitted;
pthread_once_t g_queues_once = PTHREAD_ONCE_INIT;
std::atomic<uint32_t> g_poller_started{0};
std::atomic<uint32_t> g_poller_sleeping{0};  // futex word (private): 1 while idle-waiting
// When the first record that nobody waits for (a timing sample, an NVTX range) was submitted to
// an idle poller without waking it; 0: none waiting.
std::atomic<uint64_t> g_lazy_since{0};
// At exit (FlushAtExit): the poller looks closely until nothing is outstanding, then sets
// g_flush_done (a private futex word) so that the last lazy period's samples and ranges are
// reported before the process is gone.
std::atomic<uint32_t> g_flush{0};
std::atomic<uint32_t> g_flush_done{0};
// The gate area whose tracker_seq the poller sleeps on during a lazy period, for FlushAtExit to
// wake it; null while it sleeps elsewhere or not at all.
std::atomic<contract::GateArea*> g_lazy_gate{nullptr};
// The longest the process's exit waits for the poller's last pass.
constexpr uint64_t kExitFlushNs = 100'000'000;

void InitQueues() {
  g_free.Reset(/*full=*/true);
  g_submitted.Reset(/*full=*/false);
}

uint32_t IndexOf(const PendingLaunch* p) { return static_cast<uint32_t>(p - g_pool); }

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

constinit GpuClock g_gpu_clock;  // poller thread only

// Host times of a completed record's start and end events (the poller thread, its context
// current), or false.
bool HostTimes(PendingLaunch* p, uint64_t* start_ns, uint64_t* end_ns) {
  return g_gpu_clock.ToHost(p->ctx, p->start, start_ns) &&
         g_gpu_clock.ToHost(p->ctx, p->end, end_ns) && *end_ns >= *start_ns;
}

void Finish(PendingLaunch* p, bool measured_on_gpu) {
  Registration* reg = p->reg;
  if (p->range) {
    uint64_t start = 0, end = 0;
    if (!measured_on_gpu || !HostTimes(p, &start, &end)) start = end = 0;
    if (reg != nullptr && reg->StillOwned()) {
      ReportRange(reg, p->name, p->depth, p->cpu_start_ns, p->cpu_end_ns, start, end, p->stream);
    }
    ReleasePending(p);
    return;
  }
  if (reg != nullptr && reg->StillOwned()) {
    const uint64_t now = MonotonicNs();
    bool open_gate = false;
    if (p->high_priority && NoteHighPriorityCompletion(*reg->own_gate, p->pending_at_ns)) {
      open_gate = true;
    }
    if (p->budget_ns != 0) {
      ReleaseBudget(*reg->gate, p->budget_ns);
      open_gate = true;
    }
    if (open_gate) OpenGate(*reg->gate);
    if (p->timed && measured_on_gpu) {
      p->contended = p->contended ||
                     OtherWorkInFlight(*reg->gate, *reg->gpu, reg->slot_index, p->high, now);
      float ms = 0.0f;
      auto elapsed = ORION_DRIVER(cuEventElapsedTime_v2);
      if (elapsed != nullptr && elapsed(&ms, p->start, p->end) == CUDA_SUCCESS && ms >= 0.0f) {
        uint64_t ns = static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
        contract::Event e{};
        e.kind = contract::EventKind::kKernelTime;
        e.cpu_ns = now;
        SampleEvents events;
        events.gpu_elapsed_ns = ns;
        events.start_recorded_ns = p->start_recorded_ns;
        events.launched_ns = p->launched_ns;
        events.placed = HostTimes(p, &events.start_host_ns, &events.end_host_ns);
        const SampleTiming timing = TimeSample(events, Config().start_latency);
        ns = timing.duration_ns;
        if (events.placed) {
          e.cpu_ns = timing.start_ns;
          e.flags = contract::kOnHostClock;
        }
        if (TimingLogActive()) {
          TimingSample logged;
          logged.func = p->func;
          memcpy(logged.grid, p->grid, sizeof(logged.grid));
          memcpy(logged.block, p->block, sizeof(logged.block));
          logged.events = events;
          logged.timing = timing;
          logged.warmup = p->warmup;
          logged.contended = p->contended;
          LogTimingSample(logged);
        }
        if (p->warmup) e.flags |= contract::kWarmupSample;
        if (p->contended) e.flags |= contract::kContendedSample;
        // A contended sample does not teach the gate's estimate either.
        if (p->kernel != nullptr && !p->contended) p->kernel->AddSample(ns);
        e.func = p->func;
        e.stream = p->stream;
        e.duration_ns = ns;
        for (int i = 0; i < 3; ++i) {
          e.grid[i] = p->grid[i];
          e.block[i] = p->block[i];
        }
        PushEvent(reg, e);
      }
    }
  }
  ReleasePending(p);
}

void SleepNs(uint64_t ns) {
  timespec ts{0, static_cast<long>(ns)};
  nanosleep(&ts, nullptr);
}

// Fewer than a quarter of the records are free: a process that times launches faster than the
// poller looks (profiling) would run out and time nothing more until the next look.
bool RecordsRunningShort() { return g_free.SizeApprox() < kPoolSize / 4; }

// Ends the poller's lazy sleep if it is in one (on the tracker_seq of `gate`'s area: other
// processes' pollers asleep on the same GPU wake too and look once).
void WakeLazyPoller() {
  contract::GateArea* gate = g_lazy_gate.exchange(nullptr, std::memory_order_seq_cst);
  if (gate == nullptr) return;
  gate->words.tracker_seq.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&gate->words.tracker_seq);
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
    auto finish = [](PendingLaunch* p, CUresult status) { Finish(p, status == CUDA_SUCCESS); };
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
    // (records nobody waits for wake us when they are a lazy period old, see SubmitPending).
    FutexWaitPrivate(&g_poller_sleeping, 1, kNoFutexTimeout);
    g_poller_sleeping.store(0, std::memory_order_relaxed);
    g_lazy_since.store(0, std::memory_order_relaxed);
  }
  return nullptr;
}

void EnsurePoller() {
  if (g_poller_started.load(std::memory_order_acquire) != 0) return;
  if (g_poller_started.exchange(1, std::memory_order_acq_rel) != 0) return;
  // The application's signals must never land on our thread.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t thread;
  if (pthread_create(&thread, nullptr, PollerMain, nullptr) == 0) {
    pthread_detach(thread);
    static bool exit_hook = false;  // once per process image (a fork child inherits it)
    if (!exit_hook) {
      exit_hook = true;
      atexit(FlushAtExit);
    }
  } else {
    g_poller_started.store(0, std::memory_order_release);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
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
    Finish(p, false);
    return;
  }
  // A per-thread default stream has one handle for many streams: no order between its records.
  p->ordered = stream != CU_STREAM_PER_THREAD && !(per_thread_stream && stream == nullptr);
  EnsurePoller();
  g_submitted.Push(IndexOf(p));
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
  const bool prompt = p->high_priority || p->budget_ns != 0 || RecordsRunningShort();
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

void CompleteNow(PendingLaunch* p) { Finish(p, false); }

void ReportRange(Registration* reg, const char* name, uint32_t depth, uint64_t cpu_start_ns,
                 uint64_t cpu_end_ns, uint64_t gpu_start_ns, uint64_t gpu_end_ns, uint64_t stream) {
  contract::Event e{};
  e.kind = contract::EventKind::kRange;
  e.aux = depth;
  e.cpu_ns = cpu_start_ns;
  e.duration_ns = cpu_end_ns >= cpu_start_ns ? cpu_end_ns - cpu_start_ns : 0;
  if (gpu_start_ns != 0) {
    e.flags = contract::kOnHostClock;
    e.func = gpu_start_ns;
    e.bytes = gpu_end_ns;
  }
  e.stream = stream;
  CopyTruncated(e.name, sizeof(e.name), name);
  PushEvent(reg, e);
}

void ReleasePending(PendingLaunch* p) { g_free.Push(IndexOf(p)); }

void ResetCompletionTrackerAfterFork() {
  // The poller does not exist in the child and the parent's events are not valid there.
  for (auto& p : g_pool) p = PendingLaunch{};
  g_gpu_clock.Reset();
  g_queues_once = PTHREAD_ONCE_INIT;
  g_poller_started.store(0, std::memory_order_relaxed);
  g_poller_sleeping.store(0, std::memory_order_relaxed);
  g_lazy_since.store(0, std::memory_order_relaxed);
  g_flush.store(0, std::memory_order_relaxed);
  g_flush_done.store(0, std::memory_order_relaxed);
  g_lazy_gate.store(nullptr, std::memory_order_relaxed);
}

}  // namespace orion::interpose
