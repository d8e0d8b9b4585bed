// What a finished completion record leaves behind, then the record goes back to the pool:
//  - a followed high-priority launch: its client's progress (it may end the busy period) and a
//    look for the launches held at the gate;
//  - a best-effort launch charged to the gate's budget: the charge given back, the gate opened;
//  - a timed launch measured on the GPU: its sample (timed_samples.h);
//  - an NVTX range: a kRange event, with its GPU times where both events were placed.
// Nothing goes to a slot the server has given to somebody else since (Registration::StillOwned).
//
// The poller finishes completed records; a launch thread finishes its own record at once where
// the launch or the completion event's record failed (CompleteNow, SubmitPending).
#pragma once

#include "interpose/completion_tracker.h"

namespace orion::interpose {

// `measured_on_gpu`: the record's completion event completed (its timing events may be read).
void FinishRecord(PendingLaunch* p, bool measured_on_gpu);

}  // namespace orion::interpose
