// Per-GPU timeline of who ran when: a bounded ring of spans (kernels, graphs, copies, throttled
// waits, high-priority busy periods) built from the drained events, queried by time window.
//
// Usage:
//   TimelineStore store(200000);
//   store.Add(span);
//   std::vector<Span> spans = store.Window(since_ns, until_ns, 10000, &truncated);
//   uint64_t cursor = 0, lost = 0;
//   std::vector<Span> fresh = store.After(&cursor, 1000, &lost);  // in arrival order; follow live
//   store.SetRecording(from_ns, until_ns);  // keep only spans starting inside (0: open ends)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace orion::server {

// kThrottled: a launch held at the gate; kPaused: held while its client was paused.
enum class SpanKind : uint8_t {
  kKernel, kGraph, kMemcpy, kMemset, kThrottled, kBusyPeriod, kStep, kPaused
};
const char* SpanKindName(SpanKind k);

struct Span {
  int64_t start_unix_ns = 0;
  uint64_t duration_ns = 0;
  uint64_t func = 0;  // CUfunction for kernels, CUgraphExec for graphs, a RangeNames id for steps
  uint64_t bytes = 0;
  // Steps: the range on the CPU (push to pop); start/duration above are the GPU's when measured.
  int64_t cpu_start_unix_ns = 0;
  uint64_t cpu_duration_ns = 0;
  uint32_t client_id = 0;
  uint8_t priority = 0;  // contract::Priority
  SpanKind kind = SpanKind::kKernel;
  // Start and end are the GPU's own (timed on the GPU) or, for held time, the CPU's; otherwise
  // inferred (kernels: placed behind their stream's previous work for a learned duration).
  bool measured = false;
  uint8_t depth = 0;  // steps: NVTX nesting level
};

class TimelineStore {
 public:
  explicit TimelineStore(size_t capacity) : capacity_(capacity) { spans_.reserve(capacity); }
  void Add(const Span& s) {
    if (s.start_unix_ns < record_from_ns_ || (record_until_ns_ != 0 && s.start_unix_ns > record_until_ns_)) {
      return;  // outside the recording window
    }
    ++added_;
    if (spans_.size() < capacity_) {
      spans_.push_back(s);
    } else {
      spans_[next_] = s;
      next_ = (next_ + 1) % capacity_;
    }
  }
  // Spans whose start lies in [since, until], oldest first; at most max_spans (the newest kept).
  std::vector<Span> Window(int64_t since_ns, int64_t until_ns, size_t max_spans,
                           bool* truncated) const;
  // Spans added after *cursor (a count of spans ever added; 0 = from the oldest kept), in arrival
  // order, at most max; moves *cursor past them. *lost: spans after the cursor that the ring had
  // already overwritten.
  std::vector<Span> After(uint64_t* cursor, size_t max, uint64_t* lost) const;
  uint64_t added() const { return added_; }
  void SetRecording(int64_t from_ns, int64_t until_ns) {
    record_from_ns_ = from_ns;
    record_until_ns_ = until_ns;
  }
  int64_t record_from_ns() const { return record_from_ns_; }
  int64_t record_until_ns() const { return record_until_ns_; }
  size_t size() const { return spans_.size(); }

 private:
  uint64_t added_ = 0;
  int64_t record_from_ns_ = 0, record_until_ns_ = 0;
  size_t capacity_;
  size_t next_ = 0;  // oldest element once full
  std::vector<Span> spans_;
};

}  // namespace orion::server
