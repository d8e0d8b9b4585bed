// What one client's drained events become: its kernel profile and graphs, timeline spans
// (kernels and graphs measured or inferred, copies, held time, high-priority busy periods, NVTX
// steps), busy seconds, the busy-period window the budget search reads, the request latency
// histogram and the event counters. The ingest seam of the node's state: no locks (NodeState
// owns one per client and calls it under its mutex), no proto types.
//
// Usage:
//   ClientIngest ingest(client_id, &options);
//   IngestSinks sinks{timelines[gpu], gpu_busy_ns[priority], range_names, known_kernels};
//   ingest.Consume(event, priority, sinks);
//   ingest.profile().EstimateNs(func); ingest.busy().count; ingest.BusyPeriodsSince(count);
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "contract/orion_contract.h"
#include "server/kernel_profile.h"
#include "server/span_builder.h"
#include "server/timeline.h"

namespace orion::server {

// Upper bounds (seconds) of the high-priority busy-period histogram.
inline constexpr std::array<double, 14> kBusyPeriodBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

// Upper bounds (seconds) of the request latency histogram (NVTX ranges named as requests).
inline constexpr std::array<double, 16> kRequestLatencyBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10};

// Durations past this in an event are garbage a tenant wrote, not work.
inline constexpr uint64_t kMaxPlausibleDurationNs = 600ull * 1000000000ull;  // 10 min

// A Prometheus histogram of seconds with fixed upper bounds (non-cumulative counts).
template <size_t N>
struct SecondsHistogram {
  uint64_t count = 0;
  double sum_s = 0;
  std::array<uint64_t, N> buckets{};
  void Observe(double s, const std::array<double, N>& bounds) {
    ++count;
    sum_s += s;
    for (size_t b = 0; b < N; ++b) {
      if (s <= bounds[b]) {
        ++buckets[b];
        return;
      }
    }
  }
};
using BusyPeriodHistogram = SecondsHistogram<kBusyPeriodBuckets.size()>;
using RequestLatencyHistogram = SecondsHistogram<kRequestLatencyBuckets.size()>;

// The node's settings the ingest reads (fixed for the server's life).
struct IngestOptions {
  int64_t mono_to_unix_ns = 0;          // the clients' CLOCK_MONOTONIC + this = Unix time
  std::string request_range_prefix;     // NVTX ranges named so are requests ("" = none)
  uint32_t hp_latency_window = 2000;    // busy periods kept for the budget search
};

// Where a client's spans and node-wide sums go, for one event.
struct IngestSinks {
  TimelineStore& timeline;  // the timeline of the client's GPU
  double& gpu_busy_ns;      // that GPU's busy time at the client's current priority
  RangeNames& range_names;  // node-wide NVTX names
  const std::unordered_map<std::string, OrionProfileRow>& known_kernels;
};

class ClientIngest {
 public:
  // Distinct CUDA graphs kept per client (same reason as KernelProfileBook::kMaxKernels).
  static constexpr size_t kMaxGraphs = 512;

  ClientIngest(uint32_t client_id, const IngestOptions* options)
      : client_id_(client_id), options_(options) {}

  // One event of the client's ring; `priority` is the client's now (spans carry it).
  void Consume(const contract::Event& e, contract::Priority priority, IngestSinks& sinks);
  // The ring's indices were found written over, or an entry was stuck: `n` events lost.
  void CountMalformed(uint64_t n) { malformed_events_ += n; }
  // The client left, its ring drained: timed launches whose measurement never came (in flight
  // when the process ended) count as work at their kernel's or graph's mean.
  void Leave(IngestSinks& sinks);

  KernelProfileBook& profile() { return profile_; }
  const KernelProfileBook& profile() const { return profile_; }
  // Kernels in the launch events read: one a kernel launch, a graph's kernel nodes a replay
  // (saturating: a replay's count is the client's word).
  uint64_t launched_kernels() const { return launched_kernels_; }
  uint64_t graph_launches() const { return graph_launches_; }
  uint64_t copy_bytes() const { return copy_bytes_; }
  uint64_t alloc_denied() const { return alloc_denied_; }
  uint64_t malformed_events() const { return malformed_events_; }
  // Events about kernels or graphs beyond the per-client tables (kMaxKernels, kMaxGraphs),
  // used for counts and spans but not kept in a profile.
  uint64_t table_dropped_events() const {
    return profile_.dropped_events() + graph_dropped_events_;
  }
  double gpu_busy_ns() const { return gpu_busy_ns_; }
  const BusyPeriodHistogram& busy() const { return busy_; }
  const RequestLatencyHistogram& requests() const { return requests_; }
  // The busy periods reported after the first `count_at` ones, newest last, at most the window.
  std::vector<uint64_t> BusyPeriodsSince(uint64_t count_at) const;

 private:
  // CUDA graphs launched (by CUgraphExec): kernel nodes and measured durations.
  struct GraphStats {
    uint32_t kernels = 0;
    MeasuredMean duration;
  };
  // The stats of graph `exec`, added if there is room (a ring the tenant writes must not grow
  // the server without bound); null when full.
  GraphStats* Graph(uint64_t exec);
  Span NewSpan(contract::Priority priority, int64_t start_unix_ns) const;
  int64_t ToUnixNs(uint64_t mono_ns) const {  // wraps rather than overflows: tenant-written
    return static_cast<int64_t>(mono_ns + static_cast<uint64_t>(options_->mono_to_unix_ns));
  }
  // A kernel or graph span on `stream`: measured (the GPU's start on the host clock) or inferred
  // (placed behind the stream's previous work); counted into the client's and GPU's busy time.
  void AddWork(contract::Priority priority, SpanKind kind, uint64_t func, uint64_t stream,
               int64_t start_unix_ns, uint64_t duration_ns, bool measured, uint64_t kernels,
               IngestSinks& sinks);
  // An NVTX range as a step span (GPU times when measured), and a request latency when its name
  // starts with request_range_prefix.
  void AddStep(const contract::Event& e, contract::Priority priority, IngestSinks& sinks);
  void AddBusyPeriod(uint64_t duration_ns);
  // GPU time counted as the client's work, and its GPU's at the client's priority.
  void AddBusy(double ns, IngestSinks& sinks) {
    gpu_busy_ns_ += ns;
    sinks.gpu_busy_ns += ns;
  }

  const uint32_t client_id_;
  const IngestOptions* const options_;
  KernelProfileBook profile_;
  std::unordered_map<uint64_t, GraphStats> graphs_;
  StreamClock streams_;
  uint64_t launched_kernels_ = 0, graph_launches_ = 0, copy_bytes_ = 0, alloc_denied_ = 0;
  uint64_t malformed_events_ = 0;
  uint64_t graph_dropped_events_ = 0;
  double gpu_busy_ns_ = 0;
  std::vector<uint64_t> busy_recent_;  // ring of the last hp_latency_window busy periods
  size_t busy_next_ = 0;
  BusyPeriodHistogram busy_;
  RequestLatencyHistogram requests_;
};

}  // namespace orion::server
