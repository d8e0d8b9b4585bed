// Timeline exports for orion-ctl: Chrome trace event JSON (opens in Perfetto and
// chrome://tracing), the merge of several nodes' exports onto one time axis, and a
// self-contained HTML page. Pure: no RPCs; orion-ctl fetches, these format.
//
// Trace layout: one process per node GPU ("<node> GPU <index>"), one thread per client
// ("<namespace>/<pod> (client N, high)"), GPU work as complete events ("X"; args.measured says
// whether the duration is the GPU's own, else the span is a launch instant of zero length), and
// time held at the gate (cat "throttled", or "paused" while the client was paused) on a second
// thread of the client ("... held at gate"), and, with
// run_gap_ns, the client's run intervals on a third ("... ran": its work spans merged while the
// gap between them stays within run_gap_ns). Timestamps are the
// node's CLOCK_REALTIME in microseconds; otherData records the node, when it was exported and the
// node's clock offset to the exporting host (server clock minus host clock, measured over the
// RPC, with half the round trip as its uncertainty).
//
// Usage:
//   NodeTimeline t{.node = "gpu-node-1", ...};  // GPUs, clients, spans from the admin API
//   std::string json = ChromeTraceJson(t);
//   absl::StatusOr<std::string> all = MergeChromeTraces({{"a.json", a}, {"b.json", b}});
//   std::string page = TimelineHtml(json);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "orion/v1/admin.pb.h"

namespace orion::tools {

struct NodeTimeline {
  std::string node;
  int64_t exported_unix_ns = 0;    // the exporting host's clock
  int64_t clock_offset_ns = 0;     // node clock minus exporting host clock
  int64_t clock_uncertainty_ns = 0;
  int64_t since_unix_ns = 0, until_unix_ns = 0;  // the window asked for (0: open)
  struct GpuSpans {
    orion::v1::Gpu gpu;
    std::vector<orion::v1::TimelineSpan> spans;
    bool truncated = false;
  };
  std::vector<GpuSpans> gpus;
  std::map<uint32_t, orion::v1::Client> clients;  // by client id; departed ones may be missing
  // From call logs (NodeTimelineFromCallLogs): client ids are pids, durations are the driver
  // calls' on the CPU (never marked measured GPU time).
  bool from_call_logs = false;
  // Run intervals per client and GPU: work spans (not held time) closer than this merge into one
  // "ran" interval, from the first span's start to the last one's end. 0: no run rows.
  uint64_t run_gap_ns = 0;
};

// A client's work merged into run intervals (see NodeTimeline::run_gap_ns).
struct RunInterval {
  int64_t start_unix_ns = 0, end_unix_ns = 0;
  uint32_t spans = 0;
  bool measured = true;  // every span in it had its GPU duration measured
};
// The run intervals of `spans` (any order, one client's; held time is skipped), in time order.
std::vector<RunInterval> MergeRuns(const std::vector<orion::v1::TimelineSpan>& spans,
                                   uint64_t gap_ns);

// The call logs an interposer wrote with no server (ORION_LOG_DIR; format in
// interpose/call_log.h): every timeline.<pid>.log of `dir` as one timeline, a row per process
// ("GPU" 0 stands for the host the logs came from). Errors name the file and line.
absl::StatusOr<NodeTimeline> NodeTimelineFromCallLogs(const std::string& dir);

std::string ChromeTraceJson(const NodeTimeline& timeline);

// Merges exports (name, JSON text) of several nodes: each input's processes are renumbered so
// they stay apart, and its timestamps are moved by its recorded clock offset onto the clock of
// the host that exported it (so exports taken from one host share one axis). Errors name the file.
absl::StatusOr<std::string> MergeChromeTraces(
    const std::vector<std::pair<std::string, std::string>>& inputs);

// One HTML page, no network: the trace embedded, drawn as rows (GPU, then client) with zoom
// (wheel), pan (drag) and hover details.
std::string TimelineHtml(const std::string& trace_json);

}  // namespace orion::tools
