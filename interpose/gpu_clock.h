// Places a timing event's GPU time on the host clock (CLOCK_MONOTONIC), per CUDA context, so
// that measured kernels and NVTX ranges become spans with the GPU's own start and end.
//
// An anchor event, recorded on a private stream that never has other work, runs within
// microseconds of its record call: its host time is taken as the middle between the call's
// return and the first query that finds it done (polled for at most kSpinNs). Any
// other timing event of the context is placed by cuEventElapsedTime from the anchor. Elapsed
// times are floats in milliseconds, so anchors are renewed every kRenewNs while events are being
// placed (60 ns resolution at one second). A new anchor is placed two ways, by its own record
// time and by its elapsed time from the previous one; an anchor cannot run before it was
// recorded, so the later of the two wins, less kDriftAllowanceNs so that clock drift cannot
// ratchet the estimate one way. The previous anchor is kept for events recorded before the
// new one.
//
// The poller thread is the only user: no locks.
//
// Usage:
//   uint64_t host_ns;
//   if (g_gpu_clock.ToHost(ctx, event, &host_ns)) ...;  // the context must be current
#pragma once

#include <stdint.h>

#include "interpose/cuda_abi.h"

namespace orion::interpose {

class GpuClock {
 public:
  static constexpr uint64_t kRenewNs = 1'000'000'000;
  static constexpr uint64_t kDriftAllowanceNs = 2'000;
  static constexpr int kContexts = 8;
  static constexpr uint64_t kSpinNs = 200'000;

  // Host time of a completed timing event of `ctx` (current on the calling thread), or false
  // when the context cannot hold an anchor or the driver cannot measure.
  bool ToHost(CUcontext ctx, CUevent event, uint64_t* host_ns);
  // Forgets every anchor (after fork: the events do not exist in the child).
  void Reset();

 private:
  struct Anchor {
    CUevent event = nullptr;
    uint64_t host_ns = 0;
  };
  struct Context {
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
    Anchor current;
    Anchor previous;
    CUevent spare = nullptr;  // the event of the anchor before `previous`, reused
    uint64_t renewed_ns = 0;
    bool failed = false;
  };
  Context* Find(CUcontext ctx);
  bool Renew(Context& c);

  Context contexts_[kContexts];
};

}  // namespace orion::interpose
