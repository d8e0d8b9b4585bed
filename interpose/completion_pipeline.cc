// A finished completion record's steps (completion_pipeline.h), in the order FinishRecord lists
// them: released at the gate, placed on the host clock, reported, logged, back to the pool.
#include "interpose/glibc_compat.h"

#include "interpose/completion_pipeline.h"

#include <string.h>

#include "interpose/client_state.h"
#include "interpose/gpu_clock.h"
#include "interpose/launch_gate.h"
#include "interpose/nvtx_ranges.h"
#include "interpose/real_driver.h"
#include "interpose/sample_timing.h"
#include "interpose/timing_log.h"

namespace orion::interpose {
namespace {

constinit GpuClock g_gpu_clock;  // poller thread only

// Step 1: the gate's bookkeeping of a launch (ranges have none).
void ReleaseAtGate(Registration& reg, const PendingLaunch& p) {
  bool open_gate = false;
  if (p.high_priority && NoteHighPriorityCompletion(*reg.own_gate, p.pending_at_ns)) {
    open_gate = true;
  }
  if (p.budget_ns != 0) {
    ReleaseBudget(*reg.gate, p.budget_ns);
    open_gate = true;
  }
  if (open_gate) OpenGate(*reg.gate);
}

// Step 2: where the record's start and end events fall on the host clock.
struct Placement {
  bool placed = false;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

Placement PlaceOnHostClock(const PendingLaunch& p) {
  Placement at;
  at.placed = g_gpu_clock.ToHost(p.ctx, p.start, &at.start_ns) &&
              g_gpu_clock.ToHost(p.ctx, p.end, &at.end_ns) && at.end_ns >= at.start_ns;
  if (!at.placed) at.start_ns = at.end_ns = 0;
  return at;
}

// Step 3 for a timed launch seen complete at `now_ns`: its sample reported to `reg`, and its
// kernel's estimate taught unless another process's work was in flight. False where the driver
// cannot measure the events (nothing reported); else, where `sample` is not null (the timing log
// is on), *sample is what step 4 logs.
bool ReportSample(PendingLaunch* p, Registration* reg, const Placement& at, uint64_t now_ns,
                  TimingSample* sample) {
  p->contended =
      p->contended || OtherWorkInFlight(*reg->gate, *reg->gpu, reg->slot_index, p->high, now_ns);
  float ms = 0.0f;
  auto elapsed = ORION_DRIVER(cuEventElapsedTime_v2);
  if (elapsed == nullptr || elapsed(&ms, p->start, p->end) != CUDA_SUCCESS || ms < 0.0f) {
    return false;
  }
  SampleEvents events;
  events.gpu_elapsed_ns = static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
  events.start_recorded_ns = p->start_recorded_ns;
  events.launched_ns = p->launched_ns;
  events.held = p->held;
  events.compute = !p->graph && p->kernel != nullptr &&
                   p->kernel->kclass.load(std::memory_order_relaxed) ==
                       contract::KernelClassToBoard(contract::KernelClass::kCompute);
  events.placed = at.placed;
  events.start_host_ns = at.start_ns;
  events.end_host_ns = at.end_ns;
  SampleTiming timing = TimeSample(events, Config().start_latency);
  if (p->graph && p->kernel != nullptr && events.placed) {
    if (!timing.idle_stream && !p->contended && !p->warmup) {
      p->kernel->AddQueuedSample(timing.duration_ns);
    } else {
      timing = IdleGraphTiming(events, timing, Config().start_latency,
                               p->kernel->queued_ns.load(std::memory_order_relaxed));
    }
  }
  contract::Event e{};
  e.kind = contract::EventKind::kKernelTime;
  e.cpu_ns = now_ns;
  if (events.placed) {
    e.cpu_ns = timing.start_ns;
    e.flags = contract::kOnHostClock;
  }
  if (p->warmup) e.flags |= contract::kWarmupSample;
  if (ReportedContended(p->contended, events, timing)) e.flags |= contract::kContendedSample;
  // No sample taken beside another process's work teaches the gate's estimate (its kernels'
  // time alone).
  if (p->kernel != nullptr && !p->contended) p->kernel->AddSample(timing.duration_ns);
  e.func = p->func;
  e.stream = p->stream;
  e.duration_ns = timing.duration_ns;
  for (int i = 0; i < 3; ++i) {
    e.grid[i] = p->grid[i];
    e.block[i] = p->block[i];
  }
  PushEvent(reg, e);

  if (sample == nullptr) return true;
  sample->func = p->func;
  memcpy(sample->grid, p->grid, sizeof(sample->grid));
  memcpy(sample->block, p->block, sizeof(sample->block));
  sample->events = events;
  sample->timing = timing;
  sample->warmup = p->warmup;
  sample->contended = p->contended;
  return true;
}

// Step 4: the anchors placing this record renewed, then its sample (null: none).
void LogTiming(const GpuClock::Renewals& renewed, const TimingSample* sample) {
  for (int i = 0; i < renewed.count; ++i) {
    const GpuClock::Renewal& a = renewed.items[i];
    LogAnchor(a.ctx, a.recorded_ns, a.seen_ns, a.chained_ns, a.host_ns, a.rate);
  }
  if (sample != nullptr) LogTimingSample(*sample);
}

}  // namespace

void FinishRecord(PendingLaunch* p, bool measured_on_gpu) {
  Registration* reg = p->reg;
  const bool owned = reg != nullptr && reg->StillOwned();
  const bool placing = owned && measured_on_gpu && (p->range || p->timed);
  // A sample's "seen complete" time is read before the gate step, as it always was.
  const uint64_t now = placing && !p->range ? MonotonicNs() : 0;
  if (owned && !p->range) ReleaseAtGate(*reg, *p);                                // 1
  const Placement at = placing ? PlaceOnHostClock(*p) : Placement{};              // 2
  const bool logging = TimingLogActive();                                        // 3
  TimingSample sample;
  bool sampled = false;
  if (owned && p->range) {
    ReportRange(reg, p->name, p->depth, p->cpu_start_ns, p->cpu_end_ns, at.start_ns, at.end_ns,
                p->stream);
  } else if (placing) {
    sampled = ReportSample(p, reg, at, now, logging ? &sample : nullptr);
  }
  if (logging) LogTiming(g_gpu_clock.renewals(), sampled ? &sample : nullptr);    // 4
  g_gpu_clock.ForgetRenewals();
  ReleasePending(p);                                                              // 5
}

void ResetCompletionPipelineAfterFork() { g_gpu_clock.Reset(); }

}  // namespace orion::interpose
