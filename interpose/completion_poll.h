// One pass of the completion poller over its outstanding records, apart from the driver so that
// it can be tested: which records are queried, which are kept, and when the poller looks again.
// The poller's thread (completion_poller.cc) runs it with cuEventQuery.
//
// Records of one stream complete in order, so after the first record of a stream that is not
// ready, the later ones of that stream are kept without a query, and the newest record of each
// stream is queried first: when it is done, so are all the stream's earlier records, finished
// without a query. A model that queues hundreds of launches ahead of the GPU would otherwise
// have each queried on every pass (54 ms of CPU a second on an H100 when an eager service's 229
// launches a request were all followed; FollowHighPriorityLaunch now follows none of them).
// A per-thread default stream is one handle for many streams: its records are queried one by
// one.
//
// When to look again costs the host process CPU, and a pod limited to one core shares that core
// with the poller (a 20 to 100 us timer had doubled a one-core eager service's p50 on an H100).
// So the poller never runs on a timer that nobody needs:
//  - a high-priority client counts as busy until the grace after its last launch or completion
//    has run out, whatever completes, so nothing is looked at before then; after it, the poller
//    waits for the newest followed record in the driver where that record has a blocking-sync
//    event (a graph or a long kernel: the thread sleeps until the GPU reaches it), which
//    completes every earlier record of its stream too, and looks again every
//    kHighPriorityPollNs otherwise (short kernels, done by the end of the grace: a
//    blocking-sync event on each of them cost the driver's event thread a wake-up per launch);
//  - best-effort budget charges and timed samples are followed closely (kBestEffortPollNs) only
//    while somebody is held at the gate of the record's GPU (gate_waiters > 0); otherwise the
//    poller looks again after the lazy period (`lazy_ns`: ORION_LAZY_POLL_MS, default
//    kDefaultLazyPollNs in env_config.h), or at once when a held thread bumps the GPU's
//    tracker_seq.
#pragma once

#include <stdint.h>

#include <algorithm>

#include "interpose/completion_tracker.h"

namespace orion::interpose {

// Best-effort budget charges and timed samples are followed closely while a launch is held: the
// gate's budget is small.
inline constexpr uint64_t kBestEffortPollNs = 20'000;
// High-priority records past their grace that are not waited for in the driver (short kernels,
// or no cuEventSynchronize) are polled this often instead.
inline constexpr uint64_t kHighPriorityPollNs = 100'000;
// What one record still pending at `now_ns` asks of the poller: a look after `sleep_ns`, or (for
// a followed high-priority record past its client's grace) a wait for it in the driver. `lazy_ns`
// is the lazy period: how long a record that nobody waits for may stay unlooked at.
struct NextLook {
  uint64_t sleep_ns = 0;
  bool wait_in_driver = false;
};

inline NextLook NextLookAt(const PendingLaunch& p, uint64_t now_ns, uint64_t lazy_ns) {
  if (p.reg == nullptr || p.reg->gpu == nullptr || p.reg->gate == nullptr) {
    return {kBestEffortPollNs, false};
  }
  const contract::GpuState& gpu = *p.reg->gpu;
  const bool high_only = p.high_priority && p.budget_ns == 0 && !p.timed;
  if (!high_only) {
    const bool held = p.reg->gate->words.gate_waiters.load(std::memory_order_relaxed) != 0;
    return {held ? kBestEffortPollNs : lazy_ns, false};
  }
  const uint64_t grace = gpu.hp_grace_ns.load(std::memory_order_relaxed);
  if (p.reg->own_gate != nullptr) {
    const uint64_t last = p.reg->own_gate->last_progress_ns.load(std::memory_order_relaxed);
    if (last <= now_ns && now_ns - last < grace) {
      return {std::max(last + grace - now_ns, kBestEffortPollNs), false};
    }
  }
  // Past the grace: asleep in the driver where the record has a blocking-sync event, else a
  // look every kHighPriorityPollNs (an eager service's short kernels are done by then).
  if (!p.wait_in_driver) return {kHighPriorityPollNs, false};
  return {lazy_ns, true};
}

// How the poller waits before its next pass.
struct PollSchedule {
  uint64_t sleep_ns = 0;
  // When no record needs a look before the lazy period: the poller may sleep on this GPU's
  // tracker_seq (in its gate area), which a best-effort thread that starts to wait there bumps.
  contract::GateArea* lazy_gate = nullptr;
  // When no record needs a look before the lazy period and this one may be waited for in the
  // driver: the newest such record (it completes its stream's earlier records too).
  PendingLaunch* wait_for = nullptr;
};

// After the wait for `through` ended with `status`: finishes it and, if its stream is ordered,
// every earlier record of the same stream (they completed before it). Keeps the others in order
// and returns their number.
template <typename Finish>
uint32_t FinishThrough(PendingLaunch** records, uint32_t count, PendingLaunch* through,
                       CUresult status, Finish&& finish) {
  uint32_t position = count;
  for (uint32_t i = 0; i < count; ++i) {
    if (records[i] == through) position = i;
  }
  uint32_t kept = 0;
  for (uint32_t i = 0; i < count; ++i) {
    PendingLaunch* p = records[i];
    const bool done = p == through || (i < position && through->ordered && p->ordered &&
                                       p->ctx == through->ctx && p->stream == through->stream);
    if (done) {
      finish(p, status);
    } else {
      records[kept++] = p;
    }
  }
  return kept;
}

// query(const PendingLaunch&) -> CUresult of its completion event; finish(PendingLaunch*, CUresult)
// ends a record that is not CUDA_ERROR_NOT_READY (errors end tracking too: never hold the gate).
// Keeps the unfinished records at the front of `records`, in order, stamps them known pending at
// `now_ns` (a later completion happened after that), and returns their number; *schedule
// receives how to wait before the next pass (at most `lazy_ns`, the lazy period).
template <typename Query, typename Finish>
uint32_t PollPass(PendingLaunch** records, uint32_t count, uint64_t now_ns, uint64_t lazy_ns,
                  Query&& query, Finish&& finish, PollSchedule* schedule) {
  struct StreamKey {
    CUcontext ctx;
    uint64_t stream;
    bool operator==(const StreamKey&) const = default;
  };
  constexpr uint32_t kMaxWaitingStreams = 32;  // beyond this, records are simply queried
  StreamKey waiting[kMaxWaitingStreams];
  uint32_t waiting_count = 0;
  // Each ordered stream's newest record and what its query said, newest streams first.
  struct Newest {
    StreamKey key;
    const PendingLaunch* record;
    CUresult status;
  };
  Newest newest[kMaxWaitingStreams];
  uint32_t newest_count = 0;
  for (uint32_t i = count; i-- > 0 && newest_count < kMaxWaitingStreams;) {
    const PendingLaunch* p = records[i];
    if (!p->ordered) continue;
    const StreamKey key{p->ctx, p->stream};
    bool seen = false;
    for (uint32_t n = 0; n < newest_count && !seen; ++n) seen = newest[n].key == key;
    if (!seen) newest[newest_count++] = {key, p, query(*p)};
  }
  auto newest_of = [&](const StreamKey& key) -> const Newest* {
    for (uint32_t n = 0; n < newest_count; ++n) {
      if (newest[n].key == key) return &newest[n];
    }
    return nullptr;
  };
  uint32_t kept = 0;
  PollSchedule next;
  next.sleep_ns = lazy_ns;
  auto keep = [&](PendingLaunch* p) {
    p->pending_at_ns = now_ns;
    records[kept++] = p;
    const NextLook look = NextLookAt(*p, now_ns, lazy_ns);
    if (look.wait_in_driver) {
      next.wait_for = p;  // the newest: records are in submission order
    } else {
      next.sleep_ns = std::min(next.sleep_ns, look.sleep_ns);
      if (next.lazy_gate == nullptr && p->reg != nullptr) next.lazy_gate = p->reg->gate;
    }
  };
  for (uint32_t i = 0; i < count; ++i) {
    PendingLaunch* p = records[i];
    const StreamKey key{p->ctx, p->stream};
    if (p->ordered && std::find(waiting, waiting + waiting_count, key) != waiting + waiting_count) {
      keep(p);
      continue;
    }
    const Newest* last = p->ordered ? newest_of(key) : nullptr;
    if (last != nullptr && last->status == CUDA_SUCCESS) {
      finish(p, CUDA_SUCCESS);  // the stream's newest record is done: so is this one
      continue;
    }
    const CUresult status = last != nullptr && last->record == p ? last->status : query(*p);
    if (status == CUDA_ERROR_NOT_READY) {
      keep(p);
      if (p->ordered && waiting_count < kMaxWaitingStreams) waiting[waiting_count++] = key;
    } else {
      finish(p, status);
    }
  }
  if (next.sleep_ns < lazy_ns) {
    next.lazy_gate = nullptr;
    next.wait_for = nullptr;
  } else if (next.wait_for != nullptr) {
    next.lazy_gate = nullptr;
  }
  *schedule = next;
  return kept;
}

}  // namespace orion::interpose
