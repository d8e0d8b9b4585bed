// A finished completion record's way out, in one direction, from FinishRecord:
//   1. released at the gate: a followed high-priority launch's completion noted on its slot (it
//      may end the busy period), a best-effort charge given back, and the gate opened for the
//      launches held there. First, because held launches wait for nothing else;
//   2. placed on the host clock (gpu_clock.h): a timed launch's or an NVTX range's two events,
//      where they completed;
//   3. reported: an NVTX range as a kRange event (nvtx_ranges.h), a timed launch as its sample
//      (sample_timing.h): a kKernelTime event and a step of its kernel's estimate;
//   4. logged, with ORION_TIMING_LOG (timing_log.h): the anchors step 2 renewed, then the sample;
//   5. back to the pool.
// Nothing is noted or reported to a slot the server has given to somebody else since
// (Registration::StillOwned).
//
// The poller finishes completed records (on the poller thread, the record's context current: the
// GPU clock takes no lock); a launch thread finishes its own record at once where the launch or
// the completion event's record failed (CompleteNow, SubmitPending), with nothing to place.
#pragma once

#include "interpose/completion_tracker.h"

namespace orion::interpose {

// `measured_on_gpu`: the record's completion event completed (its timing events may be read).
void FinishRecord(PendingLaunch* p, bool measured_on_gpu);

// In a fork child: the parent's anchor events do not exist there.
void ResetCompletionPipelineAfterFork();

}  // namespace orion::interpose
