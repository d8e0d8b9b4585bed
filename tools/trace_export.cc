// Chrome trace export, merge and HTML page of orion timelines (see trace_export.h).
#include "tools/trace_export.h"

#include <dirent.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace orion::tools {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

constexpr uint32_t kHeldTidBase = 1'000'000;  // "held at gate" thread of client N: base + N
constexpr uint32_t kRunTidBase = 2'000'000;   // "ran" thread of client N: base + N
constexpr uint32_t kStepTidBase = 3'000'000;  // "steps" thread of client N: base + N
constexpr int kPidsPerInput = 1000;            // merge: input i's GPU g becomes i * 1000 + g

// Time a client's launches waited: held at the gate, or while the client was paused.
bool HeldKind(const std::string& kind) { return kind == "throttled" || kind == "paused"; }

Value Str(const std::string& s) {
  Value v;
  v.set_string_value(s);
  return v;
}
Value Num(double d) {
  Value v;
  v.set_number_value(d);
  return v;
}
Value Bool(bool b) {
  Value v;
  v.set_bool_value(b);
  return v;
}

const char* PriorityWord(orion::v1::Priority p) {
  return p == orion::v1::PRIORITY_HIGH ? "high" : "best-effort";
}

std::string ClientLabel(uint32_t id, const NodeTimeline& t, orion::v1::Priority span_priority) {
  auto it = t.clients.find(id);
  if (t.from_call_logs) {
    return absl::StrCat(it != t.clients.end() ? it->second.process_name() : "?", " (pid ", id,
                        ")");
  }
  if (it == t.clients.end()) {
    return absl::StrCat("client ", id, " (", PriorityWord(span_priority), ", exited)");
  }
  // Outside Kubernetes the process is what a reader knows: its name and PID. A rank of a job of
  // several clients is named with its job first, so a job's tracks read as one group.
  const orion::v1::Client& c = it->second;
  std::string who =
      c.pod().empty() ? c.process_name() : absl::StrCat(c.namespace_(), "/", c.pod());
  if (!c.job().empty() && std::count_if(t.clients.begin(), t.clients.end(), [&](const auto& o) {
        return o.second.job() == c.job();
      }) > 1) {
    who = absl::StrCat("job ", c.job(), ": ", who);
  }
  return absl::StrCat(who, " (", c.host_pid() != 0 ? absl::StrCat("pid ", c.host_pid(), ", ") : "",
                      "client ", id, ", ", PriorityWord(c.priority()), c.exited() ? ", exited" : "",
                      ")");
}

// Where a client's tracks sort: high-priority clients first, then by job (a job's ranks
// together), then by client id; add 0..3 for its run, step, work and held rows.
int TrackSort(uint32_t id, const NodeTimeline& t, orion::v1::Priority priority) {
  int job_index = 0;
  if (auto it = t.clients.find(id); it != t.clients.end() && !it->second.job().empty()) {
    std::set<std::string> jobs;
    for (const auto& [other, c] : t.clients) jobs.insert(c.job());
    job_index = static_cast<int>(std::distance(jobs.begin(), jobs.find(it->second.job())));
  }
  return (priority == orion::v1::PRIORITY_HIGH ? 0 : 1 << 29) + (std::min(job_index, 255) << 20) +
         static_cast<int>((id * 4) & 0xFFFFC);
}

void AddMeta(ListValue* events, const std::string& what, int pid, int64_t tid,
             const std::string& name, int sort_index) {
  Struct e;
  (*e.mutable_fields())["ph"] = Str("M");
  (*e.mutable_fields())["name"] = Str(what);
  (*e.mutable_fields())["pid"] = Num(pid);
  if (tid >= 0) (*e.mutable_fields())["tid"] = Num(static_cast<double>(tid));
  Struct args;
  (*args.mutable_fields())["name"] = Str(name);
  *(*e.mutable_fields())["args"].mutable_struct_value() = args;
  *events->add_values()->mutable_struct_value() = e;
  Struct order;
  (*order.mutable_fields())["ph"] = Str("M");
  (*order.mutable_fields())["name"] =
      Str(what == "process_name" ? "process_sort_index" : "thread_sort_index");
  (*order.mutable_fields())["pid"] = Num(pid);
  if (tid >= 0) (*order.mutable_fields())["tid"] = Num(static_cast<double>(tid));
  Struct order_args;
  (*order_args.mutable_fields())["sort_index"] = Num(sort_index);
  *(*order.mutable_fields())["args"].mutable_struct_value() = order_args;
  *events->add_values()->mutable_struct_value() = order;
}

std::string ToJson(const Struct& s) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(s, &out, o);
  return out;
}

}  // namespace

std::string ChromeTraceJson(const NodeTimeline& t) {
  Struct root;
  ListValue* events = (*root.mutable_fields())["traceEvents"].mutable_list_value();
  for (const NodeTimeline::GpuSpans& g : t.gpus) {
    const int pid = static_cast<int>(g.gpu.index());
    AddMeta(events, "process_name", pid, -1,
            absl::StrCat(t.node, " GPU ", g.gpu.index(), " (", g.gpu.uuid(), ")"), pid);
    std::set<uint32_t> named;
    for (const orion::v1::TimelineSpan& s : g.spans) {
      const bool held = HeldKind(s.kind());
      const bool step = s.kind() == "step";
      const int64_t tid = held ? kHeldTidBase + s.client_id()
                          : step ? kStepTidBase + s.client_id()
                                 : s.client_id();
      if (named.insert(static_cast<uint32_t>(tid)).second) {
        const std::string label = ClientLabel(s.client_id(), t, s.priority());
        // High-priority clients first; each client's run row, then its steps, its work and the
        // time it was held.
        const int sort = TrackSort(s.client_id(), t, s.priority()) + (step ? 1 : held ? 3 : 2);
        AddMeta(events, "thread_name", pid, tid,
                held ? label + " held at gate" : step ? label + " steps" : label, sort);
      }
      Struct e;
      auto& f = *e.mutable_fields();
      f["ph"] = Str("X");
      f["cat"] = Str(s.kind());
      f["name"] = Str(s.name().empty() ? s.kind() : s.name());
      f["pid"] = Num(pid);
      f["tid"] = Num(static_cast<double>(tid));
      f["ts"] = Num(static_cast<double>(s.start_unix_ns()) / 1e3);
      f["dur"] = Num(static_cast<double>(s.duration_ns()) / 1e3);
      Struct args;
      (*args.mutable_fields())["priority"] = Str(PriorityWord(s.priority()));
      (*args.mutable_fields())["client"] = Num(s.client_id());
      // Measured: the GPU's own times (held time: the CPU's). A call log's durations are the
      // driver calls' on the CPU.
      (*args.mutable_fields())["measured"] = Bool(!t.from_call_logs && s.measured());
      if (step) {
        (*args.mutable_fields())["depth"] = Num(s.depth());
        (*args.mutable_fields())["cpu_start_us"] =
            Num(static_cast<double>(s.cpu_start_unix_ns()) / 1e3);
        (*args.mutable_fields())["cpu_dur_us"] = Num(static_cast<double>(s.cpu_duration_ns()) / 1e3);
      }
      if (t.from_call_logs) (*args.mutable_fields())["duration"] = Str("driver call on the CPU");
      if (s.bytes() > 0) (*args.mutable_fields())["bytes"] = Num(static_cast<double>(s.bytes()));
      *f["args"].mutable_struct_value() = args;
      *events->add_values()->mutable_struct_value() = e;
    }
    if (t.run_gap_ns == 0) continue;
    std::map<uint32_t, std::vector<orion::v1::TimelineSpan>> by_client;
    for (const orion::v1::TimelineSpan& s : g.spans) by_client[s.client_id()].push_back(s);
    for (const auto& [client, spans] : by_client) {
      const std::vector<RunInterval> runs = MergeRuns(spans, t.run_gap_ns);
      if (runs.empty()) continue;
      const orion::v1::Priority prio = spans.front().priority();
      const int64_t tid = kRunTidBase + client;
      AddMeta(events, "thread_name", pid, tid, ClientLabel(client, t, prio) + " ran",
              TrackSort(client, t, prio));
      for (const RunInterval& r : runs) {
        Struct e;
        auto& f = *e.mutable_fields();
        f["ph"] = Str("X");
        f["cat"] = Str("run");
        f["name"] = Str("ran");
        f["pid"] = Num(pid);
        f["tid"] = Num(static_cast<double>(tid));
        f["ts"] = Num(static_cast<double>(r.start_unix_ns) / 1e3);
        f["dur"] = Num(static_cast<double>(r.end_unix_ns - r.start_unix_ns) / 1e3);
        Struct args;
        (*args.mutable_fields())["priority"] = Str(PriorityWord(prio));
        (*args.mutable_fields())["client"] = Num(client);
        (*args.mutable_fields())["spans"] = Num(r.spans);
        (*args.mutable_fields())["measured"] = Bool(r.measured && !t.from_call_logs);
        (*args.mutable_fields())["gap_ns"] = Num(static_cast<double>(t.run_gap_ns));
        *f["args"].mutable_struct_value() = args;
        *events->add_values()->mutable_struct_value() = e;
      }
    }
  }
  Struct other;
  auto& o = *other.mutable_fields();
  o["format"] = Str("orion-timeline/1");
  o["node"] = Str(t.node);
  o["exported_at_unix_ns"] = Num(static_cast<double>(t.exported_unix_ns));
  o["clock_offset_ns"] = Num(static_cast<double>(t.clock_offset_ns));
  o["clock_uncertainty_ns"] = Num(static_cast<double>(t.clock_uncertainty_ns));
  o["clock"] = Str("the node's CLOCK_REALTIME in microseconds; clock_offset_ns = node clock "
                   "minus the exporting host's clock");
  o["since_unix_ns"] = Num(static_cast<double>(t.since_unix_ns));
  o["until_unix_ns"] = Num(static_cast<double>(t.until_unix_ns));
  bool truncated = false;
  for (const auto& g : t.gpus) truncated = truncated || g.truncated;
  o["truncated"] = Bool(truncated);
  *(*root.mutable_fields())["otherData"].mutable_struct_value() = other;
  (*root.mutable_fields())["displayTimeUnit"] = Str("ms");
  return ToJson(root);
}

absl::StatusOr<std::string> MergeChromeTraces(
    const std::vector<std::pair<std::string, std::string>>& inputs) {
  if (inputs.empty()) return absl::InvalidArgumentError("nothing to merge");
  Struct merged;
  ListValue* events = (*merged.mutable_fields())["traceEvents"].mutable_list_value();
  ListValue* sources;
  {
    Struct other;
    (*other.mutable_fields())["format"] = Str("orion-timeline/1 merged");
    (*other.mutable_fields())["clock"] =
        Str("each export moved by its clock_offset_ns onto the clock of the host that exported "
            "it; exports taken from one host share one axis");
    (*other.mutable_fields())["sources"].mutable_list_value();
    *(*merged.mutable_fields())["otherData"].mutable_struct_value() = other;
    sources = (*(*merged.mutable_fields())["otherData"].mutable_struct_value()->mutable_fields())
                  ["sources"]
                      .mutable_list_value();
  }
  (*merged.mutable_fields())["displayTimeUnit"] = Str("ms");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& [name, text] = inputs[i];
    Struct in;
    if (auto st = google::protobuf::util::JsonStringToMessage(text, &in); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": not trace JSON: ", std::string(st.message())));
    }
    const auto& fields = in.fields();
    auto ev = fields.find("traceEvents");
    if (ev == fields.end() || !ev->second.has_list_value()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": no traceEvents array"));
    }
    double offset_us = 0;
    Struct source;
    (*source.mutable_fields())["file"] = Str(name);
    if (auto od = fields.find("otherData"); od != fields.end() && od->second.has_struct_value()) {
      const auto& of = od->second.struct_value().fields();
      if (auto off = of.find("clock_offset_ns"); off != of.end()) {
        offset_us = off->second.number_value() / 1e3;
      }
      for (const char* key : {"node", "exported_at_unix_ns", "clock_offset_ns",
                              "clock_uncertainty_ns", "truncated"}) {
        if (auto k = of.find(key); k != of.end()) (*source.mutable_fields())[key] = k->second;
      }
    }
    (*source.mutable_fields())["pid_base"] = Num(static_cast<double>(i) * kPidsPerInput);
    *sources->add_values()->mutable_struct_value() = source;
    for (const Value& v : ev->second.list_value().values()) {
      if (!v.has_struct_value()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": a trace event is not an object"));
      }
      Struct e = v.struct_value();
      auto& f = *e.mutable_fields();
      const auto pid = f.find("pid");
      if (pid == f.end() || !pid->second.has_number_value() || pid->second.number_value() < 0 ||
          pid->second.number_value() >= kPidsPerInput) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": a trace event without a pid in [0, ", kPidsPerInput, ")"));
      }
      f["pid"] = Num(static_cast<double>(i) * kPidsPerInput + pid->second.number_value());
      if (auto ts = f.find("ts"); ts != f.end() && ts->second.has_number_value()) {
        f["ts"] = Num(ts->second.number_value() - offset_us);
      }
      if (auto sort = f.find("name");
          sort != f.end() && sort->second.string_value() == "process_sort_index") {
        auto& args = *f["args"].mutable_struct_value()->mutable_fields();
        args["sort_index"] = Num(static_cast<double>(i) * kPidsPerInput +
                                 args["sort_index"].number_value());
      }
      *events->add_values()->mutable_struct_value() = e;
    }
  }
  return ToJson(merged);
}

std::string TimelineHtml(const std::string& trace_json) {
  // "</" inside the embedded JSON would end the script element early.
  const std::string embedded = absl::StrReplaceAll(trace_json, {{"</", "<\\/"}});
  return absl::StrCat(R"(<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>orion timeline</title>
<style>
body { font: 12px sans-serif; margin: 8px; }
#info { margin: 4px 0; color: #333; }
#legend span { display: inline-block; width: 10px; height: 10px; margin: 0 3px 0 10px; }
#tip { position: fixed; background: #ffe; border: 1px solid #999; padding: 3px; display: none;
       pointer-events: none; white-space: pre; }
svg { border: 1px solid #ccc; cursor: grab; }
</style></head><body>
<div id="info"></div>
<div id="legend"><span style="background:#1f77b4"></span>high-priority work<span
 style="background:#2ca02c"></span>best-effort work<span style="background:#d62728"></span>held
 at the gate<span style="background:#7f7f7f"></span>paused<span
 style="background:#9467bd"></span>steps (NVTX)</div>
<svg id="chart" width="1200" height="100"></svg>
<div id="tip"></div>
<script type="application/json" id="trace">)",
                      embedded, R"(</script>
<script>
// Rows: per process (a node's GPU) a header, then its threads (clients and their held time).
const trace = JSON.parse(document.getElementById('trace').textContent);
const evs = trace.traceEvents || [];
const names = {}, sorts = {}, procNames = {}, procSorts = {};
for (const e of evs) {
  if (e.ph !== 'M') continue;
  const key = e.pid + '/' + e.tid;
  if (e.name === 'thread_name') names[key] = e.args.name;
  if (e.name === 'thread_sort_index') sorts[key] = e.args.sort_index;
  if (e.name === 'process_name') procNames[e.pid] = e.args.name;
  if (e.name === 'process_sort_index') procSorts[e.pid] = e.args.sort_index;
}
const spans = evs.filter(e => e.ph === 'X');
const rowsByKey = {};
for (const s of spans) {
  const key = s.pid + '/' + s.tid;
  (rowsByKey[key] = rowsByKey[key] || {pid: s.pid, tid: s.tid, spans: []}).spans.push(s);
}
const rows = Object.values(rowsByKey).sort((a, b) =>
  ((procSorts[a.pid] ?? a.pid) - (procSorts[b.pid] ?? b.pid)) ||
  ((sorts[a.pid + '/' + a.tid] ?? a.tid) - (sorts[b.pid + '/' + b.tid] ?? b.tid)));
let t0 = Infinity, t1 = -Infinity;
for (const s of spans) { t0 = Math.min(t0, s.ts); t1 = Math.max(t1, s.ts + (s.dur || 0)); }
if (!spans.length) { t0 = 0; t1 = 1; }
if (t1 <= t0) t1 = t0 + 1;
let view0 = t0, view1 = t1;
const svg = document.getElementById('chart'), NS = 'http://www.w3.org/2000/svg';
const LABEL = 330, ROW = 18, W = 1200;
const color = s => s.cat === 'throttled' ? '#d62728' : s.cat === 'paused' ? '#7f7f7f' :
  s.cat === 'step' ? '#9467bd' :
  (s.args && s.args.priority === 'high' ? '#1f77b4' : '#2ca02c');
function draw() {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  let y = 0, lastPid = null;
  const x = ts => LABEL + (ts - view0) / (view1 - view0) * (W - LABEL);
  for (const r of rows) {
    if (r.pid !== lastPid) {
      const h = document.createElementNS(NS, 'text');
      h.setAttribute('x', 2); h.setAttribute('y', y + 13); h.setAttribute('font-weight', 'bold');
      h.textContent = procNames[r.pid] || ('GPU ' + r.pid);
      svg.appendChild(h); y += ROW; lastPid = r.pid;
    }
    const label = document.createElementNS(NS, 'text');
    label.setAttribute('x', 12); label.setAttribute('y', y + 13);
    label.textContent = names[r.pid + '/' + r.tid] || ('thread ' + r.tid);
    svg.appendChild(label);
    for (const s of r.spans) {
      const a = x(s.ts), b = x(s.ts + (s.dur || 0));
      if (b < LABEL || a > W) continue;
      const rect = document.createElementNS(NS, 'rect');
      rect.setAttribute('class', 'span');
      rect.setAttribute('x', Math.max(a, LABEL)); rect.setAttribute('y', y + 2);
      rect.setAttribute('width', Math.max(2, Math.min(b, W) - Math.max(a, LABEL)));
      rect.setAttribute('height', ROW - 4); rect.setAttribute('fill', color(s));
      rect.dataset.tip = `${s.name} [${s.cat}]\nstart ${(s.ts - t0).toFixed(1)} us, ` +
        `${(s.dur || 0).toFixed(1)} us${s.args && s.args.measured ? '' : ' (inferred)'}` +
        (s.args && s.args.bytes ? `\n${s.args.bytes} bytes` : '');
      svg.appendChild(rect);
    }
    y += ROW;
  }
  svg.setAttribute('height', Math.max(y, 20));
  document.getElementById('info').textContent =
    `${spans.length} spans in ${rows.length} rows; showing ${((view1 - view0) / 1000).toFixed(3)} ms ` +
    `(wheel: zoom, drag: pan)`;
}
const tip = document.getElementById('tip');
svg.addEventListener('mousemove', ev => {
  const t = ev.target.dataset && ev.target.dataset.tip;
  tip.style.display = t ? 'block' : 'none';
  if (t) { tip.textContent = t; tip.style.left = (ev.clientX + 12) + 'px'; tip.style.top = (ev.clientY + 12) + 'px'; }
});
svg.addEventListener('wheel', ev => {
  ev.preventDefault();
  const rect = svg.getBoundingClientRect();
  const at = view0 + (ev.clientX - rect.left - LABEL) / (W - LABEL) * (view1 - view0);
  const k = ev.deltaY > 0 ? 1.25 : 0.8;
  view0 = at - (at - view0) * k; view1 = at + (view1 - at) * k; draw();
});
let dragX = null;
svg.addEventListener('mousedown', ev => { dragX = ev.clientX; });
window.addEventListener('mouseup', () => { dragX = null; });
window.addEventListener('mousemove', ev => {
  if (dragX === null) return;
  const d = (ev.clientX - dragX) / (W - LABEL) * (view1 - view0);
  view0 -= d; view1 -= d; dragX = ev.clientX; draw();
});
draw();
</script></body></html>
)");
}

std::vector<RunInterval> MergeRuns(const std::vector<orion::v1::TimelineSpan>& spans,
                                   uint64_t gap_ns) {
  std::vector<const orion::v1::TimelineSpan*> work;
  for (const orion::v1::TimelineSpan& s : spans) {
    // GPU work only: held time, high-priority busy periods and steps are not work that ran.
    if (!HeldKind(s.kind()) && s.kind() != "hp-busy" && s.kind() != "step") {
      work.push_back(&s);
    }
  }
  std::sort(work.begin(), work.end(), [](const auto* a, const auto* b) {
    return a->start_unix_ns() < b->start_unix_ns();
  });
  std::vector<RunInterval> runs;
  for (const orion::v1::TimelineSpan* s : work) {
    const int64_t start = s->start_unix_ns();
    const int64_t end = start + static_cast<int64_t>(s->duration_ns());
    const bool measured = s->measured();
    if (!runs.empty() && start - runs.back().end_unix_ns <= static_cast<int64_t>(gap_ns)) {
      RunInterval& r = runs.back();
      r.end_unix_ns = std::max(r.end_unix_ns, end);
      ++r.spans;
      r.measured = r.measured && measured;
    } else {
      runs.push_back(RunInterval{start, end, 1, measured});
    }
  }
  return runs;
}

absl::StatusOr<NodeTimeline> NodeTimelineFromCallLogs(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (absl::StartsWith(name, "timeline.") && absl::EndsWith(name, ".log")) {
        files.push_back(dir + "/" + name);
      }
    }
    closedir(d);
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": cannot read the call-log folder"));
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, ": no timeline.<pid>.log files (was "
                                                 "ORION_LOG_DIR set, and no server running?)"));
  }
  std::sort(files.begin(), files.end());
  NodeTimeline t;
  t.node = absl::StrCat("call logs ", dir);
  t.from_call_logs = true;
  NodeTimeline::GpuSpans host;
  host.gpu.set_index(0);
  host.gpu.set_uuid("CPU-side driver calls");
  for (const std::string& file : files) {
    std::ifstream in(file);
    std::string line;
    size_t number = 0;
    uint32_t pid = 0;
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(file, ":", number, ": ", what));
    };
    while (std::getline(in, line)) {
      ++number;
      if (number == 1) {
        // # orion-call-log 1 pid=<pid> process=<name>
        const std::vector<std::string> words = absl::StrSplit(line, ' ');
        if (words.size() < 5 || words[0] != "#" || words[1] != "orion-call-log" ||
            words[2] != "1" || !absl::StartsWith(words[3], "pid=") ||
            !absl::SimpleAtoi(words[3].substr(4), &pid) ||
            !absl::StartsWith(words[4], "process=")) {
          return bad("not an orion call log (expected '# orion-call-log 1 pid=N process=NAME')");
        }
        orion::v1::Client c;
        c.set_client_id(pid);
        c.set_host_pid(pid);
        c.set_process_name(words[4].substr(8));
        t.clients[pid] = c;
        continue;
      }
      if (line.empty()) continue;
      const std::vector<std::string> f = absl::StrSplit(line, '\t');
      int64_t start = 0;
      uint64_t duration = 0, bytes = 0;
      if (f.size() != 6 || !absl::SimpleAtoi(f[0], &start) || !absl::SimpleAtoi(f[1], &duration) ||
          !absl::SimpleAtoi(f[4], &bytes) || f[2].empty()) {
        return bad("expected 6 tab-separated fields: start_unix_ns duration_ns call name bytes "
                   "copy_kind");
      }
      orion::v1::TimelineSpan s;
      s.set_client_id(pid);
      s.set_start_unix_ns(start);
      s.set_duration_ns(duration);
      s.set_bytes(bytes);
      const std::string& call = f[2];
      s.set_kind(call == "cuLaunchKernel"                  ? "kernel"
                 : call == "cuGraphLaunch"                 ? "graph"
                 : call == "nvtxRange"                     ? "step"
                 : absl::StrContains(call, "Memcpy")       ? "memcpy"
                 : absl::StrContains(call, "Memset")       ? "memset"
                 : absl::StrContains(call, "Free")         ? "free"
                                                           : "alloc");
      s.set_name(f[3] != "-" ? f[3] : f[5] != "-" ? absl::StrCat(call, " (", f[5], ")") : call);
      if (s.kind() == "step") {  // an NVTX range: push to pop on the CPU
        s.set_cpu_start_unix_ns(start);
        s.set_cpu_duration_ns(duration);
      }
      if (t.since_unix_ns == 0 || start < t.since_unix_ns) t.since_unix_ns = start;
      t.until_unix_ns = std::max<int64_t>(t.until_unix_ns, start + static_cast<int64_t>(duration));
      host.spans.push_back(std::move(s));
    }
    if (number == 0) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": empty (not an orion call log)"));
    }
  }
  std::sort(host.spans.begin(), host.spans.end(),
            [](const auto& a, const auto& b) { return a.start_unix_ns() < b.start_unix_ns(); });
  t.gpus.push_back(std::move(host));
  return t;
}

}  // namespace orion::tools
