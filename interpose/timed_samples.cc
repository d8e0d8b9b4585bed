// Timed records' events on the host clock and timed launches' samples (timed_samples.h).
#include "interpose/glibc_compat.h"

#include "interpose/timed_samples.h"

#include <string.h>

#include "interpose/gpu_clock.h"
#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"
#include "interpose/sample_timing.h"
#include "interpose/timing_log.h"

namespace orion::interpose {
namespace {

constinit GpuClock g_gpu_clock;  // poller thread only

}  // namespace

bool PlaceOnHostClock(const PendingLaunch& p, uint64_t* start_ns, uint64_t* end_ns) {
  return g_gpu_clock.ToHost(p.ctx, p.start, start_ns) &&
         g_gpu_clock.ToHost(p.ctx, p.end, end_ns) && *end_ns >= *start_ns;
}

void ReportTimedSample(PendingLaunch* p, Registration* reg, uint64_t now_ns) {
  p->contended =
      p->contended || OtherWorkInFlight(*reg->gate, *reg->gpu, reg->slot_index, p->high, now_ns);
  float ms = 0.0f;
  auto elapsed = ORION_DRIVER(cuEventElapsedTime_v2);
  if (elapsed == nullptr || elapsed(&ms, p->start, p->end) != CUDA_SUCCESS || ms < 0.0f) return;
  uint64_t ns = static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
  contract::Event e{};
  e.kind = contract::EventKind::kKernelTime;
  e.cpu_ns = now_ns;
  SampleEvents events;
  events.gpu_elapsed_ns = ns;
  events.start_recorded_ns = p->start_recorded_ns;
  events.launched_ns = p->launched_ns;
  events.held = p->held;
  events.compute = !p->graph && p->kernel != nullptr &&
                   p->kernel->kclass.load(std::memory_order_relaxed) ==
                       contract::KernelClassToBoard(contract::KernelClass::kCompute);
  events.placed = PlaceOnHostClock(*p, &events.start_host_ns, &events.end_host_ns);
  SampleTiming timing = TimeSample(events, Config().start_latency);
  if (p->graph && p->kernel != nullptr && events.placed) {
    if (!timing.idle_stream && !p->contended && !p->warmup) {
      p->kernel->AddQueuedSample(timing.duration_ns);
    } else {
      timing = IdleGraphTiming(events, timing, Config().start_latency,
                               p->kernel->queued_ns.load(std::memory_order_relaxed));
    }
  }
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
  if (ReportedContended(p->contended, events, timing)) e.flags |= contract::kContendedSample;
  // No sample taken beside another process's work teaches the gate's estimate (its kernels'
  // time alone).
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

void ResetTimedSamplesAfterFork() { g_gpu_clock.Reset(); }

}  // namespace orion::interpose
