// One pass of the completion poller over its outstanding records, apart from the driver so that
// it can be tested: which records are queried, which are kept, and how long the poller sleeps
// before the next pass. completion_tracker.cc runs it with cuEventQuery.
//
// Records of one stream complete in order, so after the first record of a stream that is not
// ready, the later ones of that stream are kept without a query. An eager model queues hundreds
// of launches ahead of the GPU; querying each of them on every pass kept the poller busy beside
// the launching thread. A per-thread default stream is one handle for many streams: its records
// are queried one by one.
#pragma once

#include <stdint.h>

#include <algorithm>

#include "interpose/completion_tracker.h"

namespace orion::interpose {

// Best-effort budget charges and timed samples are followed closely: the gate's budget is small.
inline constexpr uint64_t kBestEffortPollNs = 20'000;
// A high-priority client stays busy for its grace period after its last completion anyway, so
// its completions are noticed within a fifth of that grace, at most this often.
inline constexpr uint64_t kHighPriorityPollMaxNs = 100'000;

inline uint64_t PollIntervalNs(const PendingLaunch& p) {
  const bool high_only = p.high_priority && p.budget_ns == 0 && !p.timed;
  if (!high_only || p.reg == nullptr || p.reg->gpu == nullptr) return kBestEffortPollNs;
  const uint64_t grace = p.reg->gpu->hp_grace_ns.load(std::memory_order_relaxed);
  return std::clamp(grace / 5, kBestEffortPollNs, kHighPriorityPollMaxNs);
}

// query(const PendingLaunch&) -> CUresult of its completion event; finish(PendingLaunch*, CUresult)
// ends a record that is not CUDA_ERROR_NOT_READY (errors end tracking too: never hold the gate).
// Keeps the unfinished records at the front of `records`, in order, and returns their number;
// *poll_ns receives the interval before the next pass.
template <typename Query, typename Finish>
uint32_t PollPass(PendingLaunch** records, uint32_t count, Query&& query, Finish&& finish,
                  uint64_t* poll_ns) {
  struct StreamKey {
    CUcontext ctx;
    uint64_t stream;
    bool operator==(const StreamKey&) const = default;
  };
  constexpr uint32_t kMaxWaitingStreams = 32;  // beyond this, records are simply queried
  StreamKey waiting[kMaxWaitingStreams];
  uint32_t waiting_count = 0;
  uint32_t kept = 0;
  uint64_t interval = kHighPriorityPollMaxNs;
  for (uint32_t i = 0; i < count; ++i) {
    PendingLaunch* p = records[i];
    interval = std::min(interval, PollIntervalNs(*p));
    const StreamKey key{p->ctx, p->stream};
    if (p->ordered && std::find(waiting, waiting + waiting_count, key) != waiting + waiting_count) {
      records[kept++] = p;
      continue;
    }
    const CUresult status = query(*p);
    if (status == CUDA_ERROR_NOT_READY) {
      records[kept++] = p;
      if (p->ordered && waiting_count < kMaxWaitingStreams) waiting[waiting_count++] = key;
    } else {
      finish(p, status);
    }
  }
  *poll_ns = interval;
  return kept;
}

}  // namespace orion::interpose
