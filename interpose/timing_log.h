// A diagnostic of the GPU timing itself: with ORION_TIMING_LOG=DIR the interposer writes
// DIR/timing.<pid>.log, one line per timed launch and per anchor renewal, so that a run on a GPU
// shows how a kernel's measured duration came about and how far the anchors that place GPU times
// on the host clock move (python3 bench/orion_bench.py timing-log summarises it). Off by default; written from
// the completion poller and the anchor renewal, never from the launch path.
//
// Lines, tab-separated, after a header "# orion-timing-log 2 pid=<pid> kernel_start_ns=<n>
// queued_start_ns=<n> held_start_ns=<n> held_compute_start_ns=<n>" (the start latencies taken
// off, sample_timing.h):
//   sample  func  gpu_elapsed_ns  start_host_ns  end_host_ns  launched_ns  duration_ns  clamped
//           warmup  start_recorded_ns  grid  block  contended  held  compute
//     gpu_elapsed: cuEventElapsedTime(start, end); start/end_host: the events on the host clock
//     (0 if they could not be placed); launched: when the launch call returned; duration: what
//     the sample reports; clamped: 1 where the stream was taken to be idle (the start event ran
//     before the kernel was handed over: sample_timing.h takes the handover off; 0: queued,
//     the queued start latency comes off);
//     start_recorded: when the start event's record call returned; grid, block: "x,y,z" (to
//     match a profiler's kernels); contended: 1 where another process's work was in flight
//     (a kContendedSample: the server counts it at the kernel's mean, it teaches nothing);
//     held: 1 where the launch was held on its stream until its end event was recorded
//     (timing_hold.h: a queued sample whatever the stream held); compute: 1 for a compute
//     kernel's sample (a held one has its own start latency).
//   anchor  ctx  recorded_ns  seen_ns  chained_ns  host_ns  rate_ppm
//     recorded: the record call's return; seen: the first query that found it done (0: it was
//     waited for); chained: where the previous anchor put it (0: none); host: where it was
//     placed; rate_ppm: the host clock's rate against the GPU's after it, less 1, in ppm.
#pragma once

#include <stdint.h>

#include "interpose/sample_timing.h"

namespace orion::interpose {

// Opens DIR/timing.<pid>.log when ORION_TIMING_LOG names a folder (once per process); the
// header records the start latencies the samples are reported with.
void StartTimingLog(const char* dir, const StartLatency& latency);
bool TimingLogActive();

// One timed launch: its events and what sample_timing.h made of them.
struct TimingSample {
  uint64_t func = 0;
  uint32_t grid[3] = {};
  uint32_t block[3] = {};
  SampleEvents events;
  SampleTiming timing;
  bool warmup = false;
  bool contended = false;  // kContendedSample
};
void LogTimingSample(const TimingSample& s);
void LogAnchor(uint64_t ctx, uint64_t recorded_ns, uint64_t seen_ns, uint64_t chained_ns,
               uint64_t host_ns, double rate);

// In a fork child: the parent's file is not ours; the child does not log.
void ResetTimingLogAfterFork();

}  // namespace orion::interpose
