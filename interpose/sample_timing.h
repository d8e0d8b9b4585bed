// How a timed launch's two events become its kernel's duration and start (the completion poller,
// completion_pipeline.cc). Pure arithmetic, tested in tests/interpose/sample_timing_test.cc.
//
// The start event is recorded on the launch's stream just before the launch, the end event just
// after. When the stream had work queued, the start event runs when that work ends and the
// kernel right behind it: the GPU's elapsed time between the events is the kernel's and the
// kernel's start latency after an event (`StartLatency::queued_ns`; 2.4 us on an H100, steady:
// 2.40 to 2.46 us median over 176 queued launches of a trainer and a service in four runs
// against torch.profiler, 2.23 to 2.30 us at the tenth percentile), which comes off. When the
// stream was idle (a CPU-bound eager service, nearly every launch), the start event runs as soon
// as it is recorded, before the launch call has even handed the kernel over: the elapsed time then
// also holds the host time from the start event's record to the launch call's return, and the
// kernel's start latency beyond an event's (`StartLatency::idle_ns`; 1.4 us on an H100). Both
// come off. That latency moves with the launch path: round 11 measured a median of 1.2 us against
// torch.profiler and took 1 us. With round 14's build, 1 us read an eager service's busy seconds
// 1.047x to 1.118x (its samples 1.080x the profiler's kernels, which now started 0.2 us before
// the launch call returned, 0.3 us after with round 11's build; which change since moved it is
// not known), and 1.4 us read 0.982x to 1.018x (three windows; 1.45 us: 0.997x;
// bench/orion_bench.py timeline).
// A launch held on its stream until its end event was recorded (timing_hold.h) is a queued one
// whatever the stream held before it, its kernel's start latency after the event that of a
// stream released from a wait (`StartLatency::held_ns`: 2.5 us; measured against torch.profiler,
// an eager service's held samples read 0.999x its kernels with 2.4 us on an H100 host and with
// 2.6 us on an H200 host, 1.058x and 0.972x the other way round). A compute kernel's (GEMMs,
// convolutions, attention: contract::ClassifyKernelName) is longer
// (`StartLatency::held_compute_ns`: 2.75 us): against the profiler's kernels, 15 windows of an
// eager ResNet50 and a BERT-base-sized service on H100 and H200 hosts held 2.58 to 2.90 us
// beyond the kernel on average before their compute kernels and 2.33 to 2.65 us before the
// others; one constant of 2.5 us read the BERT service's held samples 1.028x and 1.039x, the
// class's own 1.003x and 1.014x (docs/benchmarks.md). Otherwise which case applies
// is read from where the anchors put the start event on the host clock: before the launch
// call's return, plus kIdleMarginNs for the placement's own error (up to about 15 us seen on an
// H100 guest), means idle. The duration uses only host intervals and the
// GPU's own elapsed time, never the placement, whose error once cut an eager service's
// kernels to nothing.
//
// Usage:
//   SampleTiming t = TimeSample(events, Config().start_latency);
#pragma once

#include <stdint.h>

#include <algorithm>

namespace orion::interpose {

inline constexpr uint64_t kIdleMarginNs = 20'000;
inline constexpr uint64_t kDefaultKernelStartNs = 1'400;
inline constexpr uint64_t kDefaultQueuedStartNs = 2'400;
inline constexpr uint64_t kDefaultHeldStartNs = 2'500;
inline constexpr uint64_t kDefaultHeldComputeStartNs = 2'750;

// A timed kernel's start latency after its start event's, by the stream's state (0 on a GPU
// whose events and kernels start at once, e.g. the CUDA test double).
struct StartLatency {
  uint64_t idle_ns = kDefaultKernelStartNs;    // ORION_KERNEL_START_NS
  uint64_t queued_ns = kDefaultQueuedStartNs;  // ORION_QUEUED_START_NS
  uint64_t held_ns = kDefaultHeldStartNs;      // ORION_HELD_START_NS
  uint64_t held_compute_ns = kDefaultHeldComputeStartNs;  // ORION_HELD_COMPUTE_START_NS
};

struct SampleEvents {
  uint64_t gpu_elapsed_ns = 0;     // cuEventElapsedTime(start, end)
  uint64_t start_recorded_ns = 0;  // host clock: the start event's record call returned
  uint64_t launched_ns = 0;        // host clock: the launch call returned
  bool placed = false;             // the events' host times below are known
  bool held = false;               // held on its stream from before the start event (timing_hold.h)
  bool compute = false;            // a compute kernel's (KernelClass::kCompute)
  uint64_t start_host_ns = 0;
  uint64_t end_host_ns = 0;
};

struct SampleTiming {
  uint64_t duration_ns = 0;
  uint64_t start_ns = 0;  // host clock; 0 when the events could not be placed
  bool idle_stream = false;
};

// The end event is the kernel's end in every case; its span ends there.
inline uint64_t StartBeforeEnd(const SampleEvents& e, uint64_t duration_ns) {
  return e.end_host_ns > duration_ns ? e.end_host_ns - duration_ns : 0;
}

inline SampleTiming TimeSample(const SampleEvents& e, const StartLatency& latency) {
  SampleTiming t;
  t.duration_ns = e.gpu_elapsed_ns;
  if (!e.placed) return t;  // no host clock: the GPU's elapsed time, as measured
  t.idle_stream = !e.held && e.start_host_ns < e.launched_ns + kIdleMarginNs;
  uint64_t before_kernel = !e.held ? latency.queued_ns
                           : e.compute ? latency.held_compute_ns
                                       : latency.held_ns;
  if (t.idle_stream) {
    before_kernel = (e.launched_ns > e.start_recorded_ns && e.start_recorded_ns != 0
                         ? e.launched_ns - e.start_recorded_ns
                         : 0) +
                    latency.idle_ns;
  }
  t.duration_ns = e.gpu_elapsed_ns > before_kernel ? e.gpu_elapsed_ns - before_kernel : 0;
  t.start_ns = StartBeforeEnd(e, t.duration_ns);
  return t;
}

// Whether a timed launch that another process's work was in flight around (OtherWorkInFlight,
// at the launch or when found complete) is reported contended (kContendedSample: the server
// counts it at the mean and learns nothing from it): only where the other process's time
// slice can sit inside the measurement, between the start event and the kernel: on an idle
// stream (the kernel is handed over after its start event ran, and the GPU may run the other
// context first), or where the events could not be placed. Behind the process's own queued
// work, or released from a hold, the kernel follows its start event at once: there, a trainer's
// 312 contended samples beside a graph service read 1.007x the profiler's kernels and a
// service's 96 beside a trainer 1.012x (H100), while the server, drawing them at the mean of
// the others (a different mix of kernels), read that trainer's busy seconds 1.050x.
inline bool ReportedContended(bool contended, const SampleEvents& e, const SampleTiming& t) {
  return contended && (!e.placed || t.idle_stream);
}

// A CUDA graph launched on an idle stream: the driver hands its kernels over while the launch
// call runs (a ResNet50 graph's call takes about 65 us on an H100 host), so its first kernel
// starts anywhere between the start event and the call's return, and the idle rule, which takes
// the whole handover off, reads it short (a graph service's busy seconds 0.92x to 0.93x the
// profiler's kernels on an H100 and an H200 host). Where the graph has been timed behind queued
// work (no handover in its time), the mean of those samples is taken instead, kept within what
// the events allow: at least the idle rule's duration, at most the GPU's elapsed time less the
// queued start latency. `queued_mean_ns` 0: none yet, the idle rule's duration. The span's
// start moves with the duration.
inline SampleTiming IdleGraphTiming(const SampleEvents& e, SampleTiming t,
                                    const StartLatency& latency, uint64_t queued_mean_ns) {
  if (!t.idle_stream || queued_mean_ns == 0) return t;
  const uint64_t most =
      e.gpu_elapsed_ns > latency.queued_ns ? e.gpu_elapsed_ns - latency.queued_ns : 0;
  t.duration_ns = std::clamp(queued_mean_ns, t.duration_ns, std::max(t.duration_ns, most));
  t.start_ns = StartBeforeEnd(e, t.duration_ns);
  return t;
}

}  // namespace orion::interpose
