// Timeline exports: the Chrome trace JSON checked against the trace event format by a parser
// (every event well formed, one process per GPU, one thread per client, held time on its own
// thread, measured vs launch-instant spans), the merge of two nodes' exports (processes kept
// apart, clock offsets applied, bad input named), and the HTML page's embedding.
#include "tools/trace_export.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

namespace orion::tools {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

Struct Parse(const std::string& json) {
  Struct s;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &s).ok()) << json.substr(0, 300);
  return s;
}

// The trace event format's rules that viewers rely on; returns the events by phase.
std::map<std::string, std::vector<Struct>> CheckTraceFormat(const Struct& root) {
  std::map<std::string, std::vector<Struct>> by_phase;
  const auto& events = root.fields().at("traceEvents").list_value().values();
  for (const Value& v : events) {
    EXPECT_TRUE(v.has_struct_value());
    const auto& f = v.struct_value().fields();
    const std::string ph = f.at("ph").string_value();
    EXPECT_TRUE(ph == "X" || ph == "M") << ph;
    EXPECT_TRUE(f.at("pid").has_number_value());
    EXPECT_TRUE(f.at("name").has_string_value());
    if (ph == "X") {
      EXPECT_TRUE(f.at("tid").has_number_value());
      EXPECT_TRUE(f.at("ts").has_number_value());
      EXPECT_GE(f.at("dur").number_value(), 0);
      EXPECT_TRUE(f.at("cat").has_string_value());
    } else {
      EXPECT_TRUE(f.at("args").struct_value().fields().count("name") ||
                  f.at("args").struct_value().fields().count("sort_index"));
    }
    by_phase[ph].push_back(v.struct_value());
  }
  return by_phase;
}

orion::v1::TimelineSpan MakeSpan(uint32_t client, orion::v1::Priority p, const std::string& kind,
                                 int64_t start_ns, uint64_t dur_ns, uint64_t bytes = 0) {
  orion::v1::TimelineSpan s;
  s.set_client_id(client);
  s.set_priority(p);
  s.set_kind(kind);
  s.set_name(kind == "kernel" ? "gemm_kernel" : "");
  s.set_start_unix_ns(start_ns);
  s.set_duration_ns(dur_ns);
  s.set_measured(dur_ns > 0);  // in these tests: spans with a duration were timed
  s.set_bytes(bytes);
  return s;
}

NodeTimeline TwoGpuNode(const std::string& node, int64_t offset_ns) {
  NodeTimeline t;
  t.node = node;
  t.exported_unix_ns = 1'700'000'010'000'000'000;
  t.clock_offset_ns = offset_ns;
  t.clock_uncertainty_ns = 150'000;
  orion::v1::Client svc;
  svc.set_client_id(1);
  svc.set_pod("resnet-svc");
  svc.set_namespace_("ml");
  svc.set_priority(orion::v1::PRIORITY_HIGH);
  t.clients[1] = svc;
  // A process outside Kubernetes that has exited: the server still names it.
  orion::v1::Client train;
  train.set_client_id(3);
  train.set_process_name("train");
  train.set_host_pid(4321);
  train.set_priority(orion::v1::PRIORITY_BEST_EFFORT);
  train.set_exited(true);
  t.clients[3] = train;
  NodeTimeline::GpuSpans g0;
  g0.gpu.set_index(0);
  g0.gpu.set_uuid("GPU-aaaa");
  const int64_t t0 = 1'700'000'000'000'000'000;
  g0.spans = {MakeSpan(1, orion::v1::PRIORITY_HIGH, "kernel", t0, 250'000),
              MakeSpan(2, orion::v1::PRIORITY_BEST_EFFORT, "kernel", t0 + 300'000, 0),
              MakeSpan(2, orion::v1::PRIORITY_BEST_EFFORT, "throttled", t0 + 10'000, 280'000),
              MakeSpan(2, orion::v1::PRIORITY_BEST_EFFORT, "paused", t0 + 310'000, 50'000),
              MakeSpan(1, orion::v1::PRIORITY_HIGH, "memcpy", t0 + 400'000, 5'000, 1 << 20),
              MakeSpan(1, orion::v1::PRIORITY_HIGH, "step", t0 - 20'000, 700'000)};
  // An NVTX range: GPU times above, CPU times (push 30 us before its work began) here.
  g0.spans.back().set_name("request");
  g0.spans.back().set_cpu_start_unix_ns(t0 - 50'000);
  g0.spans.back().set_cpu_duration_ns(800'000);
  NodeTimeline::GpuSpans g1;
  g1.gpu.set_index(1);
  g1.gpu.set_uuid("GPU-bbbb");
  g1.spans = {MakeSpan(3, orion::v1::PRIORITY_BEST_EFFORT, "graph", t0 + 50'000, 1'000'000)};
  t.gpus = {g0, g1};
  return t;
}

TEST(ChromeTrace, OneProcessPerGpuOneThreadPerClientHeldTimeApart) {
  const Struct root = Parse(ChromeTraceJson(TwoGpuNode("node-a", 0)));
  auto events = CheckTraceFormat(root);
  ASSERT_EQ(events["X"].size(), 7u);
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  for (const Struct& m : events["M"]) {
    const auto& f = m.fields();
    if (f.at("name").string_value() == "process_name") {
      processes[static_cast<int>(f.at("pid").number_value())] =
          f.at("args").struct_value().fields().at("name").string_value();
    }
    if (f.at("name").string_value() == "thread_name") {
      threads[{static_cast<int>(f.at("pid").number_value()),
               static_cast<int>(f.at("tid").number_value())}] =
          f.at("args").struct_value().fields().at("name").string_value();
    }
  }
  EXPECT_EQ(processes[0], "node-a GPU 0 (GPU-aaaa)");
  EXPECT_EQ(processes[1], "node-a GPU 1 (GPU-bbbb)");
  EXPECT_EQ(threads[std::make_pair(0, 1)], "ml/resnet-svc (client 1, high)");
  EXPECT_EQ(threads[std::make_pair(0, 2)], "client 2 (best-effort, exited)");
  EXPECT_EQ(threads[std::make_pair(0, 1'000'002)], "client 2 (best-effort, exited) held at gate");
  EXPECT_EQ(threads[std::make_pair(1, 3)], "train (pid 4321, client 3, best-effort, exited)");
  EXPECT_EQ(threads[std::make_pair(0, 3'000'001)], "ml/resnet-svc (client 1, high) steps");

  for (const Struct& x : events["X"]) {
    const auto& f = x.fields();
    const auto& args = f.at("args").struct_value().fields();
    const std::string cat = f.at("cat").string_value();
    if (cat == "kernel" && f.at("tid").number_value() == 1) {
      EXPECT_DOUBLE_EQ(f.at("ts").number_value(), 1'700'000'000'000'000.0);  // microseconds
      EXPECT_DOUBLE_EQ(f.at("dur").number_value(), 250.0);
      EXPECT_TRUE(args.at("measured").bool_value());
      EXPECT_EQ(f.at("name").string_value(), "gemm_kernel");
    } else if (cat == "kernel") {
      EXPECT_FALSE(args.at("measured").bool_value());  // a launch instant, not a GPU interval
    } else if (cat == "throttled" || cat == "paused") {
      EXPECT_EQ(f.at("tid").number_value(), 1'000'002);  // the client's held row, both kinds
      EXPECT_TRUE(args.at("measured").bool_value());
      EXPECT_EQ(f.at("name").string_value(), cat);
    } else if (cat == "memcpy") {
      EXPECT_EQ(args.at("bytes").number_value(), 1 << 20);
    } else if (cat == "step") {
      EXPECT_EQ(f.at("tid").number_value(), 3'000'001);
      EXPECT_EQ(f.at("name").string_value(), "request");
      EXPECT_DOUBLE_EQ(f.at("dur").number_value(), 700.0);
      EXPECT_TRUE(args.at("measured").bool_value());
      EXPECT_DOUBLE_EQ(args.at("cpu_start_us").number_value(), 1'699'999'999'999'950.0);
      EXPECT_DOUBLE_EQ(args.at("cpu_dur_us").number_value(), 800.0);
      EXPECT_EQ(args.at("depth").number_value(), 0);
    }
  }
  const auto& other = root.fields().at("otherData").struct_value().fields();
  EXPECT_EQ(other.at("node").string_value(), "node-a");
  EXPECT_EQ(other.at("clock_uncertainty_ns").number_value(), 150'000);
}

// A job's ranks: named with their job first and sorted together, whatever their client ids;
// a client alone in its job is named as before.
TEST(ChromeTrace, AJobsRanksAreNamedAndSortedTogether) {
  NodeTimeline t;
  t.node = "node-a";
  auto client = [&](uint32_t id, const std::string& pod, const std::string& job) {
    orion::v1::Client c;
    c.set_client_id(id);
    c.set_pod(pod);
    c.set_namespace_("training");
    c.set_job(job);
    c.set_priority(orion::v1::PRIORITY_BEST_EFFORT);
    t.clients[id] = c;
  };
  client(1, "llama-0", "training/llama");
  client(2, "notebook", "training/notebook");
  client(3, "llama-1", "training/llama");
  NodeTimeline::GpuSpans g;
  g.gpu.set_index(0);
  const int64_t t0 = 1'700'000'000'000'000'000;
  for (uint32_t id : {1u, 2u, 3u}) {
    g.spans.push_back(MakeSpan(id, orion::v1::PRIORITY_BEST_EFFORT, "kernel", t0, 1000));
  }
  t.gpus = {g};
  std::map<int, std::string> names;
  std::map<int, double> sort;
  auto events = CheckTraceFormat(Parse(ChromeTraceJson(t)));
  for (const Struct& m : events["M"]) {
    const auto& f = m.fields();
    if (!f.count("tid")) continue;
    const int tid = static_cast<int>(f.at("tid").number_value());
    const auto& args = f.at("args").struct_value().fields();
    if (f.at("name").string_value() == "thread_name") names[tid] = args.at("name").string_value();
    if (f.at("name").string_value() == "thread_sort_index") {
      sort[tid] = args.at("sort_index").number_value();
    }
  }
  EXPECT_EQ(names[1], "job training/llama: training/llama-0 (client 1, best-effort)");
  EXPECT_EQ(names[3], "job training/llama: training/llama-1 (client 3, best-effort)");
  EXPECT_EQ(names[2], "training/notebook (client 2, best-effort)");
  EXPECT_LT(sort[1], sort[3]);
  EXPECT_LT(sort[3], sort[2]);  // client 3 sorts beside its job's rank 1, before client 2
}

// Run intervals: a client's work spans closer than the gap merge into one "ran" interval from the
// first start to the last end; held time never counts; a launch instant (no duration) makes the
// run not measured.
TEST(ChromeTrace, RunIntervalsMergeWorkWithinTheGap) {
  const int64_t t0 = 1'700'000'000'000'000'000;
  const auto hp = orion::v1::PRIORITY_HIGH;
  const std::vector<orion::v1::TimelineSpan> spans = {
      MakeSpan(1, hp, "kernel", t0 + 2'000'000, 100'000),  // out of order on purpose
      MakeSpan(1, hp, "kernel", t0, 300'000),
      MakeSpan(1, hp, "kernel", t0 + 800'000, 200'000),    // 0.5 ms after the first ends
      MakeSpan(1, hp, "throttled", t0 + 1'000'000, 900'000),
      MakeSpan(1, hp, "paused", t0 + 1'050'000, 900'000),  // held, not work: bridges no gap
      MakeSpan(1, hp, "memcpy", t0 + 2'050'000, 0),        // inside the third run, unmeasured
  };
  const std::vector<RunInterval> runs = MergeRuns(spans, 600'000);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].start_unix_ns, t0);
  EXPECT_EQ(runs[0].end_unix_ns, t0 + 1'000'000);
  EXPECT_EQ(runs[0].spans, 2u);
  EXPECT_TRUE(runs[0].measured);
  EXPECT_EQ(runs[1].start_unix_ns, t0 + 2'000'000);
  EXPECT_EQ(runs[1].end_unix_ns, t0 + 2'100'000);
  EXPECT_EQ(runs[1].spans, 2u);
  EXPECT_FALSE(runs[1].measured);
  EXPECT_EQ(MergeRuns(spans, 0).size(), 3u);  // no gap: only the memcpy inside a kernel merges

  NodeTimeline t = TwoGpuNode("node-a", 0);
  t.run_gap_ns = 1'000'000;
  auto events = CheckTraceFormat(Parse(ChromeTraceJson(t)));
  std::vector<Struct> ran;
  for (const Struct& x : events["X"]) {
    if (x.fields().at("cat").string_value() == "run") ran.push_back(x);
  }
  // GPU 0: client 1 (kernel, then memcpy 0.15 ms later: one run; its step is not work),
  // client 2 (its kernel; held time skipped); GPU 1: client 3.
  ASSERT_EQ(ran.size(), 3u);
  for (const Struct& r : ran) {
    const double tid = r.fields().at("tid").number_value();
    if (tid == 2'000'001) {
      EXPECT_DOUBLE_EQ(r.fields().at("dur").number_value(), 405.0);  // 0 .. 0.4 ms + 5 us
      EXPECT_EQ(r.fields().at("args").struct_value().fields().at("spans").number_value(), 2);
    }
  }
}

TEST(ChromeTrace, MergeKeepsNodesApartAndAlignsClocks) {
  const std::string a = ChromeTraceJson(TwoGpuNode("node-a", 0));
  const std::string b = ChromeTraceJson(TwoGpuNode("node-b", 2'000'000));  // 2 ms ahead
  absl::StatusOr<std::string> merged = MergeChromeTraces({{"a.json", a}, {"b.json", b}});
  ASSERT_TRUE(merged.ok()) << merged.status();
  const Struct root = Parse(*merged);
  auto events = CheckTraceFormat(root);
  EXPECT_EQ(events["X"].size(), 14u);
  std::set<int> pids;
  double a_first = 0, b_first = 0;
  for (const Struct& x : events["X"]) {
    const int pid = static_cast<int>(x.fields().at("pid").number_value());
    pids.insert(pid);
    if (x.fields().at("tid").number_value() == 1 && x.fields().at("cat").string_value() == "kernel") {
      (pid < 1000 ? a_first : b_first) = x.fields().at("ts").number_value();
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 1000, 1001}));
  // The same instant on both nodes' clocks: node-b's clock runs 2 ms ahead, so its copy moves back.
  EXPECT_DOUBLE_EQ(a_first - b_first, 2000.0);
  const auto& sources =
      root.fields().at("otherData").struct_value().fields().at("sources").list_value().values();
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[1].struct_value().fields().at("node").string_value(), "node-b");

  auto bad = MergeChromeTraces({{"a.json", a}, {"broken.json", "{\"traceEvents\": 3}"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("broken.json"), std::string::npos) << bad.status();
  EXPECT_FALSE(MergeChromeTraces({{"x.json", "not json"}}).ok());
  EXPECT_FALSE(MergeChromeTraces({}).ok());
}

TEST(TimelineHtml, SelfContainedWithTheTraceEmbedded) {
  NodeTimeline t = TwoGpuNode("node-a", 0);
  t.gpus[0].spans[0].set_name("evil</script><script>alert(1)</script>");
  const std::string html = TimelineHtml(ChromeTraceJson(t));
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // no fetches
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("evil</script>"), std::string::npos);  // cannot end the script early
  EXPECT_NE(html.find("evil"), std::string::npos);  // the name is kept, escaped
  EXPECT_NE(html.find("node-a GPU 1 (GPU-bbbb)"), std::string::npos);
}

}  // namespace
}  // namespace orion::tools
