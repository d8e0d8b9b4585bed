// A timed kernel launch held on its stream from before its start event until its end event is
// recorded: a stream wait on a word of this process (cuStreamWaitValue32, GEQ a ticket) that a
// CPU store opens right after the end event's record. The start event then runs on the GPU right
// before the kernel, so the sample is the GPU's elapsed time less the start latency after a
// wait alone (sample_timing.h). Unheld, on an idle stream, the start event runs as it is
// recorded, and the sample also holds the launch's handover, taken off as the host time between
// the record and the launch's return plus a start latency that moved between hosts (1.0 to
// 1.4 us on H100s: 6% of an eager service's 5 us kernels).
//
// Held only where no other client's work is in flight on the GPU (the launch's sample is not
// contended): a stream waiting on a word leaves the GPU free to switch to another context with
// work, which would cost a high-priority client the switch. Never held: a kernel's first
// launches and its launches on a GPU where no timed launch of it went out yet (the driver may
// load its module there and wait for the stream), CUDA graph launches (their launch call takes
// about 65 us, which a hold would add to each request), a process with CUDA_LAUNCH_BLOCKING=1
// (every launch waits for its stream), any launch while a stream of the process captures a
// graph. ORION_TIMING_HOLD=0 turns it off.
//
// A guard thread opens any hold still closed 5 ms after it was queued (a launch call that waited
// for its own stream anyway: the hold then costs 5 to 25 ms once; the guard sleeps while nothing
// is held), and after three such openings the process stops holding. Each thread has a word of
// its own in one registered page of the process (claimed at its first hold, given back when it
// exits; a 1025th thread holding at once is not held), so one thread's store never opens
// another's hold. The page is not forked: a child maps its own.
//
// Usage (hooks_launch.cc):
//   uint32_t ticket = HoldForTiming(stream, ptsz);  // 0: not held
//   RecordStart(...); launch; SubmitPending(...);  // or CompleteNow on a failed launch
//   ReleaseTimingHold(ticket);                       // on every path, after the end's record
#pragma once

#include <stdint.h>

#include "interpose/cuda_abi.h"

namespace orion::interpose {

// Queues the wait on `stream` (its context current); the ticket to release, or 0 where the hold
// is off or impossible (no host registration or stream wait in the driver, the wait refused,
// 1024 threads holding already).
uint32_t HoldForTiming(CUstream stream, bool per_thread_stream);

// Opens the hold of `ticket` (not 0). Never blocks.
void OpenTimingHold(uint32_t ticket);

// Opens the hold of `ticket` (nothing for 0, inline: most launches hold nothing).
inline void ReleaseTimingHold(uint32_t ticket) {
  if (ticket != 0) OpenTimingHold(ticket);
}

// After fork(): the child's page is not registered with any driver.
void ResetTimingHoldAfterFork();

}  // namespace orion::interpose
