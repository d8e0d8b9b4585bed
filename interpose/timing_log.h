// A diagnostic of the GPU timing itself: with ORION_TIMING_LOG=DIR the interposer writes
// DIR/timing.<pid>.log, one line per timed launch and per anchor renewal, so that a run on a GPU
// shows how a kernel's measured duration came about and how far the anchors that place GPU times
// on the host clock move (bench/timing_log_summary.py summarises it). Off by default; written from
// the completion poller and the anchor renewal, never from the launch path.
//
// Lines, tab-separated, after a header "# orion-timing-log 1 pid=<pid>":
//   sample  func  gpu_elapsed_ns  start_host_ns  end_host_ns  launched_ns  duration_ns  clamped  warmup
//     gpu_elapsed: cuEventElapsedTime(start, end); start/end_host: the events on the host clock
//     (0 if they could not be placed); launched: when the launch call returned; duration: what
//     the sample reports; clamped: 1 where the start was moved to the call's return (an idle
//     stream's start event ran before the kernel was handed over).
//   anchor  ctx  recorded_ns  seen_ns  chained_ns  host_ns
//     recorded: the record call's return; seen: the first query that found it done (0: it was
//     waited for); chained: where the previous anchor put it (0: none); host: where it was placed.
#pragma once

#include <stdint.h>

namespace orion::interpose {

// Opens DIR/timing.<pid>.log when ORION_TIMING_LOG names a folder (once per process).
void StartTimingLog(const char* dir);
bool TimingLogActive();

void LogTimingSample(uint64_t func, uint64_t gpu_elapsed_ns, uint64_t start_host_ns,
                     uint64_t end_host_ns, uint64_t launched_ns, uint64_t duration_ns,
                     bool clamped, bool warmup);
void LogAnchor(uint64_t ctx, uint64_t recorded_ns, uint64_t seen_ns, uint64_t chained_ns,
               uint64_t host_ns);

// In a fork child: the parent's file is not ours; the child does not log.
void ResetTimingLogAfterFork();

}  // namespace orion::interpose
