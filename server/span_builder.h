// Ingest helpers that turn one client's drained events into timeline spans with GPU-like times.
//
// StreamClock: a launch the interposer did not time is placed where its stream could have run
// it, at the later of its launch and the end of the stream's previous span (work of one stream
// runs in order), for its kernel's learned duration: an inferred span. Measured spans (the
// GPU's own start and end on the host clock) move the stream's end forward, so inferred spans
// after them line up behind real ones.
//
// RangeNames: NVTX range names, interned per server (a span stores an id, as kernels store
// their function); bounded, names past the bound read as "range".
//
// Usage:
//   StreamClock clock;
//   int64_t start = clock.Place(stream, launch_unix_ns, estimate_ns);   // inferred
//   clock.Observe(stream, measured_end_unix_ns);                         // measured
//   RangeNames names; uint64_t id = names.Intern("step"); names.NameOf(id);
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace orion::server {

class StreamClock {
 public:
  static constexpr size_t kMaxStreams = 1024;  // a client with more streams starts afresh

  int64_t Place(uint64_t stream, int64_t earliest_unix_ns, uint64_t duration_ns) {
    int64_t& free_at = FreeAt(stream);
    const int64_t start = std::max(earliest_unix_ns, free_at);
    free_at = start + static_cast<int64_t>(duration_ns);
    return start;
  }
  void Observe(uint64_t stream, int64_t end_unix_ns) {
    int64_t& free_at = FreeAt(stream);
    free_at = std::max(free_at, end_unix_ns);
  }

 private:
  int64_t& FreeAt(uint64_t stream) {
    if (free_at_.size() >= kMaxStreams && free_at_.find(stream) == free_at_.end()) free_at_.clear();
    return free_at_.try_emplace(stream, INT64_MIN).first->second;
  }
  std::unordered_map<uint64_t, int64_t> free_at_;
};

class RangeNames {
 public:
  static constexpr size_t kMaxNames = 4096;

  uint64_t Intern(std::string_view name) {
    auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    if (names_.size() >= kMaxNames) return 0;
    names_.emplace_back(name);
    ids_.emplace(names_.back(), names_.size());
    return names_.size();
  }
  // "range" for 0 or an unknown id.
  const std::string& NameOf(uint64_t id) const {
    static const std::string kUnnamed = "range";
    return id == 0 || id > names_.size() ? kUnnamed : names_[id - 1];
  }

 private:
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint64_t> ids_;
};

}  // namespace orion::server
