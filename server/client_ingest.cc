// One client's events into spans, profiles and sums (see client_ingest.h).
#include "server/client_ingest.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "server/utf8.h"

namespace orion::server {

using contract::Event;
using contract::EventKind;
using contract::Priority;

ClientIngest::GraphStats* ClientIngest::Graph(uint64_t exec) {
  auto it = graphs_.find(exec);
  if (it != graphs_.end()) return &it->second;
  if (graphs_.size() >= kMaxGraphs) {
    ++graph_dropped_events_;
    return nullptr;
  }
  return &graphs_[exec];
}

Span ClientIngest::NewSpan(Priority priority, int64_t start_unix_ns) const {
  Span span;
  span.client_id = client_id_;
  span.priority = static_cast<uint8_t>(priority);
  span.start_unix_ns = start_unix_ns;
  return span;
}

void ClientIngest::AddWork(Priority priority, SpanKind kind, uint64_t func, uint64_t stream,
                           int64_t start_unix_ns, uint64_t duration_ns, bool measured,
                           uint64_t kernels, IngestSinks& sinks) {
  Span span = NewSpan(priority, start_unix_ns);
  span.kind = kind;
  span.func = func;
  span.bytes = kernels;  // graphs: kernel nodes
  span.duration_ns = duration_ns;
  span.measured = measured;
  if (measured) {
    streams_.Observe(stream, start_unix_ns + static_cast<int64_t>(duration_ns));
  } else {
    span.start_unix_ns = streams_.Place(stream, start_unix_ns, duration_ns);
  }
  AddBusy(static_cast<double>(duration_ns), sinks);
  sinks.timeline.Add(span);
}

void ClientIngest::AddStep(const Event& e, Priority priority, IngestSinks& sinks) {
  if (e.duration_ns >= kMaxPlausibleDurationNs) {
    ++malformed_events_;
    return;
  }
  // Tenant-written bytes: made valid UTF-8 before they name anything (utf8.h).
  const std::string name = SanitizeUtf8(std::string_view(e.name, strnlen(e.name, sizeof(e.name))));
  Span span = NewSpan(priority, ToUnixNs(e.cpu_ns));
  span.kind = SpanKind::kStep;
  span.func = sinks.range_names.Intern(name);
  span.depth = static_cast<uint8_t>(std::min<uint32_t>(e.aux, 255));
  span.cpu_start_unix_ns = span.start_unix_ns;
  span.cpu_duration_ns = e.duration_ns;
  // e.func / e.bytes: the GPU's start of the range's work and its end, on the host clock.
  const bool on_gpu = (e.flags & contract::kOnHostClock) != 0 && e.func != 0 &&
                      e.bytes >= e.func && e.bytes - e.func < kMaxPlausibleDurationNs;
  span.measured = on_gpu;
  if (on_gpu) span.start_unix_ns = ToUnixNs(e.func);
  span.duration_ns = on_gpu ? e.bytes - e.func : e.duration_ns;
  sinks.timeline.Add(span);
  const std::string& prefix = options_->request_range_prefix;
  if (!prefix.empty() && name.starts_with(prefix)) {
    // A request lasts from its push until both its pop and its GPU work are over.
    uint64_t end = e.cpu_ns + e.duration_ns;
    if (on_gpu) end = std::max(end, e.bytes);
    if (end >= e.cpu_ns) {
      requests_.Observe(static_cast<double>(end - e.cpu_ns) / 1e9, kRequestLatencyBuckets);
    }
  }
}

void ClientIngest::Leave(IngestSinks& sinks) {
  double ns = profile_.UnreportedNs();  // scaled by the client's pace, as a draw is
  for (auto& [exec, graph] : graphs_) ns += profile_.pace().Scaled(graph.duration.UnreportedNs());
  AddBusy(ns, sinks);
}

void ClientIngest::AddBusyPeriod(uint64_t duration_ns) {
  if (busy_recent_.size() < options_->hp_latency_window) {
    busy_recent_.push_back(duration_ns);
  } else {
    busy_recent_[busy_next_] = duration_ns;
    busy_next_ = (busy_next_ + 1) % busy_recent_.size();
  }
  busy_.Observe(static_cast<double>(duration_ns) / 1e9, kBusyPeriodBuckets);
}

std::vector<uint64_t> ClientIngest::BusyPeriodsSince(uint64_t count_at) const {
  const size_t n = busy_recent_.size();
  const size_t fresh = static_cast<size_t>(std::min<uint64_t>(busy_.count - count_at, n));
  std::vector<uint64_t> out(fresh);
  // The ring's newest entry is just before busy_next (busy_next stays 0 until the ring is full).
  for (size_t i = 0; i < fresh; ++i) out[fresh - 1 - i] = busy_recent_[(busy_next_ + n - 1 - i) % n];
  return out;
}

void ClientIngest::Consume(const Event& e, Priority priority, IngestSinks& sinks) {
  const int64_t at = ToUnixNs(e.cpu_ns);
  switch (e.kind) {
    case EventKind::kLaunch: {
      const uint64_t blocks64 = static_cast<uint64_t>(e.grid[0]) * e.grid[1] * e.grid[2];
      const uint32_t blocks = static_cast<uint32_t>(std::min<uint64_t>(blocks64, UINT32_MAX));
      const uint64_t threads64 = static_cast<uint64_t>(e.block[0]) * e.block[1] * e.block[2];
      profile_.OnLaunch(e.func, blocks, static_cast<uint32_t>(std::min<uint64_t>(threads64, 4096)));
      ++launched_kernels_;
      // A timed launch's span comes with its measured time (kKernelTime).
      KernelStats* kernel = profile_.StatsOf(e.func);
      if ((e.flags & contract::kTimedLaunch) == 0) {
        const uint64_t drawn =
            kernel != nullptr
                ? profile_.pace().Scale(kernel->ScaledToShape(LaunchShapeKey(e.grid, e.block),
                                                              kernel->duration.Draw()))
                : 0;
        AddWork(priority, SpanKind::kKernel, e.func, e.stream, at, drawn, /*measured=*/false, 0,
                sinks);
      } else if (kernel != nullptr) {
        kernel->duration.Await();
      }
      break;
    }
    case EventKind::kKernelName: {
      const std::string name =
          SanitizeUtf8(std::string_view(e.name, strnlen(e.name, sizeof(e.name))));
      profile_.OnName(e.func, name);
      if (!sinks.known_kernels.empty()) profile_.ApplyKnown(e.func, sinks.known_kernels);
      break;
    }
    case EventKind::kKernelTime: {
      if (e.duration_ns >= kMaxPlausibleDurationNs) break;
      const bool warmup = (e.flags & contract::kWarmupSample) != 0;
      auto graph = graphs_.find(e.func);
      const bool is_graph = graph != graphs_.end();
      const SpanKind kind = is_graph ? SpanKind::kGraph : SpanKind::kKernel;
      const uint64_t graph_kernels = is_graph ? graph->second.kernels : 0;
      // Without the GPU's start on the host clock, the work ended before it was reported.
      const bool measured = (e.flags & contract::kOnHostClock) != 0;
      const int64_t start = measured ? at : at - static_cast<int64_t>(e.duration_ns);
      if ((e.flags & contract::kContendedSample) != 0) {
        // It may hold another process's time slice: counted at the mean (ending where it was
        // measured to end), where there is one, and teaching nothing.
        KernelStats* kernel = is_graph ? nullptr : profile_.StatsOf(e.func);
        uint64_t drawn = 0;
        if (is_graph) {
          drawn = profile_.pace().Scale(graph->second.duration.Contended());
        } else if (kernel != nullptr) {
          drawn = profile_.pace().Scale(kernel->ScaledToShape(LaunchShapeKey(e.grid, e.block),
                                                              kernel->duration.Contended()));
        }
        if (drawn != 0) {
          const int64_t end = start + static_cast<int64_t>(e.duration_ns);
          AddWork(priority, kind, e.func, e.stream, end - static_cast<int64_t>(drawn), drawn,
                  /*measured=*/false, graph_kernels, sinks);
          break;
        }
      }
      double caught_up = 0;  // launches counted at 0 before this first measurement
      if (is_graph) {
        MeasuredMean& mean = graph->second.duration;
        caught_up = profile_.Measure(mean, e.duration_ns, warmup, mean.MeanNs());
      } else {
        caught_up =
            profile_.OnDuration(e.func, e.duration_ns, warmup, LaunchShapeKey(e.grid, e.block));
      }
      AddBusy(caught_up, sinks);
      AddWork(priority, kind, e.func, e.stream, start, e.duration_ns, measured, graph_kernels,
              sinks);
      break;
    }
    case EventKind::kGraphLaunch: {
      ++graph_launches_;
      launched_kernels_ += std::min<uint64_t>(e.aux, UINT64_MAX - launched_kernels_);
      GraphStats* graph = Graph(e.func);
      if (graph != nullptr) graph->kernels = e.aux;
      if ((e.flags & contract::kTimedLaunch) == 0) {
        AddWork(priority, SpanKind::kGraph, e.func, e.stream, at,
                graph != nullptr ? profile_.pace().Scale(graph->duration.Draw()) : 0,
                /*measured=*/false, e.aux, sinks);
      } else if (graph != nullptr) {
        graph->duration.Await();
      }
      break;
    }
    case EventKind::kRange:
      AddStep(e, priority, sinks);
      break;
    case EventKind::kMemcpy:
    case EventKind::kMemset: {
      copy_bytes_ += e.bytes;
      Span span = NewSpan(priority, at);
      span.kind = e.kind == EventKind::kMemcpy ? SpanKind::kMemcpy : SpanKind::kMemset;
      span.bytes = e.bytes;
      sinks.timeline.Add(span);
      break;
    }
    case EventKind::kThrottled:
      if (e.duration_ns < kMaxPlausibleDurationNs) {
        // Reported when the held launch went out, each part (paused, held at the gate) with
        // the time it ended.
        Span span = NewSpan(priority, at - static_cast<int64_t>(e.duration_ns));
        span.kind = (e.flags & contract::kPausedWait) ? SpanKind::kPaused : SpanKind::kThrottled;
        span.duration_ns = e.duration_ns;
        span.measured = true;  // on the CPU
        sinks.timeline.Add(span);
      }
      break;
    case EventKind::kBusyPeriod: {
      if (e.duration_ns >= kMaxPlausibleDurationNs) break;
      AddBusyPeriod(e.duration_ns);
      Span span = NewSpan(priority, at);
      span.kind = SpanKind::kBusyPeriod;
      span.duration_ns = e.duration_ns;
      span.measured = true;  // on the CPU
      sinks.timeline.Add(span);
      break;
    }
    case EventKind::kAllocDenied:
      ++alloc_denied_;
      break;
    case EventKind::kMemAlloc:
    case EventKind::kMemFree:
      break;  // the slot's counters are the source of truth for memory
    default:
      ++malformed_events_;  // a client scribbled on its ring: count it, use nothing
      break;
  }
}

}  // namespace orion::server
