// Timed records on the completion poller: where their two timing events fall on the host clock
// (gpu_clock.h), and what a timed launch's sample becomes: its kernel's duration and start
// (sample_timing.h), a kKernelTime event, a step of the kernel's estimate for the gate and a line
// of the timing log (timing_log.h). NVTX ranges use the same placement (completion_report.cc).
//
// Poller thread only, with the record's context current (the GPU clock takes no lock).
#pragma once

#include <stdint.h>

#include "interpose/client_state.h"
#include "interpose/completion_tracker.h"

namespace orion::interpose {

// Host times of a completed timed record's start and end events, or false.
bool PlaceOnHostClock(const PendingLaunch& p, uint64_t* start_ns, uint64_t* end_ns);

// A timed launch completed on the GPU, seen at `now_ns`: reports its sample to `reg` (still
// owned) and teaches its kernel's estimate unless another process's work was in flight.
void ReportTimedSample(PendingLaunch* p, Registration* reg, uint64_t now_ns);

// In a fork child: the parent's anchor events do not exist there.
void ResetTimedSamplesAfterFork();

}  // namespace orion::interpose
