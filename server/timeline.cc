// Timeline ring buffer queries (see timeline.h).
#include "server/timeline.h"

#include <algorithm>

namespace orion::server {

const char* SpanKindName(SpanKind k) {
  switch (k) {
    case SpanKind::kKernel: return "kernel";
    case SpanKind::kGraph: return "graph";
    case SpanKind::kMemcpy: return "memcpy";
    case SpanKind::kMemset: return "memset";
    case SpanKind::kThrottled: return "throttled";
    case SpanKind::kPaused: return "paused";
    case SpanKind::kBusyPeriod: return "hp-busy";
    case SpanKind::kStep: return "step";
  }
  return "unknown";
}

std::vector<Span> TimelineStore::Window(int64_t since_ns, int64_t until_ns, size_t max_spans,
                                        bool* truncated) const {
  std::vector<Span> out;
  const size_t n = spans_.size();
  for (size_t i = 0; i < n; ++i) {
    const Span& s = spans_[(next_ + i) % n];
    if (s.start_unix_ns >= since_ns && s.start_unix_ns <= until_ns) out.push_back(s);
  }
  // Spans arrive per client in order but clients interleave: sort by start.
  std::stable_sort(out.begin(), out.end(),
                   [](const Span& a, const Span& b) { return a.start_unix_ns < b.start_unix_ns; });
  *truncated = out.size() > max_spans;
  if (*truncated) out.erase(out.begin(), out.end() - static_cast<ptrdiff_t>(max_spans));
  return out;
}

std::vector<Span> TimelineStore::After(uint64_t* cursor, size_t max, uint64_t* lost) const {
  std::vector<Span> out;
  *lost = 0;
  const uint64_t oldest = added_ - spans_.size();  // count of spans before the oldest kept
  if (*cursor > added_) *cursor = added_;  // a cursor of a previous server: start afresh at now
  if (*cursor < oldest) {
    *lost = oldest - *cursor;
    *cursor = oldest;
  }
  const size_t n = spans_.size();
  while (*cursor < added_ && out.size() < max) {
    // Element `k` spans after the oldest kept sits at (next_ + k) % n once the ring is full.
    const uint64_t k = *cursor - oldest;
    out.push_back(spans_[n < capacity_ ? k : (next_ + k) % n]);
    ++*cursor;
  }
  return out;
}

}  // namespace orion::server
