// Places a timing event's GPU time on the host clock (CLOCK_MONOTONIC), per CUDA context, so
// that measured kernels and NVTX ranges become spans with the GPU's own start and end.
//
// An anchor event, recorded on a private stream that never has other work, runs within
// microseconds of its record call: its host time is taken as the middle between the call's
// return and the first query that finds it done (polled for at most kSpinNs). Any
// other timing event of the context is placed from the anchor by cuEventElapsedTime, scaled by
// the rate of the host clock against the GPU's: the two drift apart (about 22 us a second on an
// H100 KVM guest, measured: without the rate, events a second after an anchor came out 22 us
// early, more than an eager service's whole kernel). The rate is learned from consecutive
// precise anchors (host time between them over GPU time between them), smoothed. Elapsed times
// are floats in milliseconds, so anchors are renewed every kRenewNs while events are being
// placed (60 ns resolution at one second). An anchor seen done only after kPreciseNs (it waited
// behind other work, the GPU busy with other contexts) is placed by the chain from the previous
// one, never before its own record call. The previous anchor is kept for events recorded before the new one.
//
// The poller thread is the only user: no locks. The clock logs nothing itself: the anchors it
// renewed are read by the caller (renewals()), which writes them to the timing log.
//
// Usage:
//   uint64_t host_ns;
//   if (g_gpu_clock.ToHost(ctx, event, &host_ns)) ...;  // the context must be current
//   g_gpu_clock.renewals();  g_gpu_clock.ForgetRenewals();  // what those calls renewed
#pragma once

#include <stdint.h>

#include "interpose/cuda_abi.h"

namespace orion::interpose {

class GpuClock {
 public:
  static constexpr uint64_t kRenewNs = 1'000'000'000;
  // Rates further than this from 1 are measurement errors, not clocks (NTP slews at most 500 ppm).
  static constexpr double kMaxRateError = 1e-3;
  static constexpr int kContexts = 8;
  static constexpr uint64_t kSpinNs = 200'000;
  // An anchor seen done within this of its record is placed to within half of it (precise);
  // one seen later waited behind other work (seen 59 to 172 us after the record on an H100
  // beside a trainer) and is placed by the chain instead.
  static constexpr uint64_t kPreciseNs = 10'000;

  // Host time of a completed timing event of `ctx` (current on the calling thread), or false
  // when the context cannot hold an anchor or the driver cannot measure.
  bool ToHost(CUcontext ctx, CUevent event, uint64_t* host_ns);
  // Forgets every anchor (after fork: the events do not exist in the child).
  void Reset();

  // An anchor as it was renewed: its record call's return, the first query that found it done
  // (0: it was waited for), where the previous anchor put it (0: none), where it was placed, and
  // the host clock's rate against the GPU's after it.
  struct Renewal {
    uint64_t ctx = 0;
    uint64_t recorded_ns = 0;
    uint64_t seen_ns = 0;
    uint64_t chained_ns = 0;
    uint64_t host_ns = 0;
    double rate = 1.0;
  };
  // The anchors renewed since ForgetRenewals (one ToHost renews at most one; past kMaxRenewals
  // the later ones are not kept).
  static constexpr int kMaxRenewals = 4;
  struct Renewals {
    Renewal items[kMaxRenewals];
    int count = 0;
  };
  const Renewals& renewals() const { return renewals_; }
  void ForgetRenewals() { renewals_.count = 0; }

  // One step of the rate estimate (host ns per GPU ns): a new precise anchor `host_gap_ns` after
  // the last precise one, `gpu_gap_ns` later on the GPU. False (rate unchanged) where the gaps
  // cannot measure the clocks: too short, or a rate no clock runs at.
  static bool NextRate(double* rate, bool known, double host_gap_ns, double gpu_gap_ns) {
    // Gaps under 100 ms say more about the placement (a few us) than about the clocks.
    if (gpu_gap_ns < 1e8 || host_gap_ns <= 0) return false;
    const double r = host_gap_ns / gpu_gap_ns;
    if (r < 1.0 - kMaxRateError || r > 1.0 + kMaxRateError) return false;
    // Each measurement is good to a few ppm (the placements' few us over about a second): a
    // quarter of each new one keeps the estimate within about a ppm and follows a change of
    // rate (NTP slewing the host clock) within seconds.
    *rate = known ? *rate + (r - *rate) / 4 : r;
    return true;
  }

 private:
  struct Anchor {
    CUevent event = nullptr;
    uint64_t host_ns = 0;
    bool precise = false;  // host_ns measured (seen within kPreciseNs), not chained
  };
  struct Context {
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
    Anchor current;
    Anchor previous;
    CUevent spare = nullptr;  // the event of the anchor before `previous`, reused
    uint64_t renewed_ns = 0;
    double rate = 1.0;  // host ns per GPU ns
    bool rate_known = false;
    bool failed = false;
  };
  Context* Find(CUcontext ctx);
  bool Renew(Context& c);

  Context contexts_[kContexts];
  Renewals renewals_;
};

}  // namespace orion::interpose
