// ClientIngest: a client's events into spans and sums, without a server around it.
#include "server/client_ingest.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <unordered_map>

namespace orion::server {
namespace {

namespace c = contract;

class ClientIngestTest : public ::testing::Test {
 protected:
  ClientIngestTest() : timeline_(1000), ingest_(7, &options_) {}

  void Feed(const c::Event& e, c::Priority p = c::Priority::kBestEffort) {
    IngestSinks sinks{timeline_, gpu_busy_ns_, names_, known_};
    ingest_.Consume(e, p, sinks);
  }
  static c::Event At(c::EventKind kind, uint64_t cpu_ns, uint64_t func = 0x100) {
    c::Event e{};
    e.kind = kind;
    e.cpu_ns = cpu_ns;
    e.func = func;
    e.stream = 0x55;
    return e;
  }
  std::vector<Span> Spans() {
    bool truncated = false;
    return timeline_.Window(INT64_MIN, INT64_MAX, 1000, &truncated);
  }

  IngestOptions options_{/*mono_to_unix_ns=*/0, "request", 100};
  TimelineStore timeline_;
  double gpu_busy_ns_ = 0;
  RangeNames names_;
  std::unordered_map<std::string, OrionProfileRow> known_;
  ClientIngest ingest_;
};

// Warm-up samples teach a duration until a later launch is measured, then step aside; untimed
// launches of a stream queue behind its measured work for the learned duration.
TEST_F(ClientIngestTest, InferredKernelsQueueBehindMeasuredWorkAtTheWarmDuration) {
  c::Event t = At(c::EventKind::kKernelTime, 1'000'000);
  t.flags = c::kOnHostClock | c::kWarmupSample;
  t.duration_ns = 90'000;  // cold
  Feed(t);
  EXPECT_EQ(ingest_.profile().EstimateNs(0x100), 90'000u);
  t.flags = c::kOnHostClock;
  t.cpu_ns = 2'000'000;
  t.duration_ns = 30'000;
  Feed(t);
  EXPECT_EQ(ingest_.profile().EstimateNs(0x100), 30'000u);
  Feed(At(c::EventKind::kLaunch, 2'010'000));  // launched while the measured one still ran
  Feed(At(c::EventKind::kLaunch, 2'011'000));
  const std::vector<Span> spans = Spans();
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_TRUE(spans[1].measured);
  EXPECT_EQ(spans[2].start_unix_ns, 2'030'000);  // behind the measured kernel's end
  EXPECT_FALSE(spans[2].measured);
  EXPECT_EQ(spans[3].start_unix_ns, 2'060'000);
  EXPECT_EQ(spans[3].duration_ns, 30'000u);
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), 90'000 + 30'000 * 3);
  EXPECT_DOUBLE_EQ(gpu_busy_ns_, ingest_.gpu_busy_ns());
}

// One kernel function at two shapes (a layer of 10 us, one of 100 us), untimed launches of each:
// busy time counts each at its own shape's mean, not at the function's mix of samples.
TEST_F(ClientIngestTest, UntimedLaunchesCountAtTheirShapesMean) {
  auto launch = [](c::EventKind kind, uint64_t at, uint32_t blocks, uint64_t ns) {
    c::Event e = At(kind, at);
    e.grid[0] = blocks;
    e.grid[1] = e.grid[2] = 1;
    e.block[0] = 256;
    e.block[1] = e.block[2] = 1;
    e.duration_ns = ns;
    e.flags = kind == c::EventKind::kKernelTime ? c::kOnHostClock : 0;
    return e;
  };
  uint64_t at = 1'000'000;
  // Three warm-up samples, then one measured sample of each shape.
  for (int i = 0; i < 3; ++i) {
    c::Event w = launch(c::EventKind::kKernelTime, at += 200'000, 8, 10'000);
    w.flags |= c::kWarmupSample;
    Feed(w);
  }
  Feed(launch(c::EventKind::kKernelTime, at += 200'000, 8, 10'000));
  Feed(launch(c::EventKind::kKernelTime, at += 200'000, 80, 100'000));
  const double before = ingest_.gpu_busy_ns();
  // Nine small launches for one big one, as a network's layers might run: the function's mean
  // (55 us) would count 550 us; their own shapes, 9 x 10 + 100 = 190 us.
  for (int i = 0; i < 9; ++i) Feed(launch(c::EventKind::kLaunch, at += 200'000, 8, 0));
  Feed(launch(c::EventKind::kLaunch, at += 200'000, 80, 0));
  EXPECT_NEAR(ingest_.gpu_busy_ns() - before, 190'000.0, 10.0);
}

// Launches that reach the server before any launch of their kernel was measured are drawn at 0
// (their spans have no duration) and counted; the first measurement adds their GPU time at its
// mean, once, so a short job's busy time is not lost.
TEST_F(ClientIngestTest, LaunchesBeforeTheFirstMeasurementAreCaughtUpByIt) {
  for (uint64_t t = 1'000'000; t < 1'005'000; t += 1000) Feed(At(c::EventKind::kLaunch, t));
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), 0);
  c::Event m = At(c::EventKind::kKernelTime, 1'010'000);
  m.flags = c::kOnHostClock;
  m.duration_ns = 5'000;
  Feed(m);
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), 5 * 5'000 + 5'000);  // five caught up, and its own
  EXPECT_DOUBLE_EQ(gpu_busy_ns_, ingest_.gpu_busy_ns());
  m.cpu_ns = 1'020'000;
  Feed(m);  // later measurements catch nothing up again
  Feed(At(c::EventKind::kLaunch, 1'030'000));  // drawn at the mean now
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), 5 * 5'000 + 3 * 5'000);
}

// Timed launches whose measurement never arrives (the process ended with them in flight) count
// at their kernel's mean when the client leaves; those that reported count once.
TEST_F(ClientIngestTest, TimedLaunchesThatNeverReportedCountWhenTheClientLeaves) {
  c::Event timed = At(c::EventKind::kLaunch, 1'000'000);
  timed.flags = c::kTimedLaunch;
  for (int i = 0; i < 4; ++i) Feed(timed);
  c::Event m = At(c::EventKind::kKernelTime, 1'010'000);
  m.flags = c::kOnHostClock;
  m.duration_ns = 8'000;
  Feed(m);  // one of the four reported
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), 8'000);
  IngestSinks sinks{timeline_, gpu_busy_ns_, names_, known_};
  ingest_.Leave(sinks);
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), 4 * 8'000);
  EXPECT_DOUBLE_EQ(gpu_busy_ns_, ingest_.gpu_busy_ns());
  ingest_.Leave(sinks);  // once
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), 4 * 8'000);
}

// A measurement taken while another process's work was in flight (kContendedSample) counts at
// the kernel's mean times the client's pace, ending where it was measured to end, and moves
// neither; before any measurement it is taken as it is.
TEST_F(ClientIngestTest, ContendedSamplesCountAtTheMeanAndTeachNothing) {
  c::Event timed = At(c::EventKind::kLaunch, 900'000);
  timed.flags = c::kTimedLaunch;
  Feed(timed);
  c::Event first = At(c::EventKind::kKernelTime, 1'000'000);
  first.flags = c::kOnHostClock | c::kContendedSample;
  first.duration_ns = 6'000;
  Feed(first);  // nothing known yet: the measurement as it is
  EXPECT_EQ(ingest_.profile().EstimateNs(0x100), 6'000u);
  c::Event m = At(c::EventKind::kKernelTime, 1'100'000);
  m.flags = c::kOnHostClock;
  m.duration_ns = 2'000;
  for (int i = 0; i < 4; ++i) Feed(m);
  // The run's mean: (6 + 4 x 2) / 5 us. The fifth sample is the first with four before it: it
  // measured 2 us where the mean said 3 us, and moves the pace a 32nd of the way from 1 (3 us
  // against 3 us) to 2/3: 2.96875 / 3.
  EXPECT_EQ(ingest_.profile().EstimateNs(0x100), 2'800u);
  EXPECT_DOUBLE_EQ(ingest_.profile().pace().Factor(), 2'968.75 / 3'000);
  const uint64_t drawn = ingest_.profile().pace().Scale(2'800);
  EXPECT_EQ(drawn, 2'770u);
  const double busy = ingest_.gpu_busy_ns();
  Feed(timed);
  c::Event waited = At(c::EventKind::kKernelTime, 2'000'000);
  waited.flags = c::kOnHostClock | c::kContendedSample;
  waited.duration_ns = 94'000;  // a 2 us kernel and another context's time slice
  Feed(waited);
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), busy + drawn);
  EXPECT_EQ(ingest_.profile().EstimateNs(0x100), 2'800u);  // taught nothing
  EXPECT_DOUBLE_EQ(ingest_.profile().pace().Factor(), 2'968.75 / 3'000);
  Feed(At(c::EventKind::kLaunch, 2'200'000));
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), busy + 2 * drawn);  // an untimed launch alike
  const std::vector<Span> spans = Spans();
  ASSERT_GE(spans.size(), 2u);
  const Span& s = spans[spans.size() - 2];  // the contended one: inferred, ending at its end
  EXPECT_FALSE(s.measured);
  EXPECT_EQ(s.duration_ns, drawn);
  EXPECT_EQ(s.start_unix_ns, 2'000'000 + 94'000 - static_cast<int64_t>(drawn));
  // It reported: nothing is left awaited when the client leaves.
  IngestSinks sinks{timeline_, gpu_busy_ns_, names_, known_};
  ingest_.Leave(sinks);
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), busy + 2 * drawn);
}

// A launch's wait arrives as a paused part and a held part, each ending where it ended: two
// spans of their own kinds, measured on the CPU, neither counted as GPU work.
TEST_F(ClientIngestTest, PausedAndGateHeldTimeAreSpansOfTheirOwnKinds) {
  c::Event paused = At(c::EventKind::kThrottled, 5'000'000);  // the pause ended here
  paused.flags = c::kPausedWait;
  paused.duration_ns = 3'000'000;
  Feed(paused);
  c::Event held = At(c::EventKind::kThrottled, 5'400'000);  // then held at the gate till here
  held.duration_ns = 400'000;
  Feed(held);
  const std::vector<Span> spans = Spans();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].kind, SpanKind::kPaused);
  EXPECT_STREQ(SpanKindName(spans[0].kind), "paused");
  EXPECT_EQ(spans[0].start_unix_ns, 2'000'000);
  EXPECT_EQ(spans[0].duration_ns, 3'000'000u);
  EXPECT_EQ(spans[1].kind, SpanKind::kThrottled);
  EXPECT_EQ(spans[1].start_unix_ns, 5'000'000);
  EXPECT_TRUE(spans[0].measured && spans[1].measured);
  EXPECT_DOUBLE_EQ(ingest_.gpu_busy_ns(), 0);
}

// A graph's replays: untimed ones at the mean of its timed ones, with their kernel count.
TEST_F(ClientIngestTest, GraphReplaysAtTheirMeasuredMean) {
  c::Event g = At(c::EventKind::kGraphLaunch, 1'000'000, 0xabc);
  g.aux = 160;
  g.flags = c::kTimedLaunch;
  Feed(g);
  c::Event t = At(c::EventKind::kKernelTime, 1'000'500, 0xabc);
  t.flags = c::kOnHostClock;
  t.duration_ns = 1'300'000;
  Feed(t);
  g.flags = 0;
  g.cpu_ns = 5'000'000;
  Feed(g);
  const std::vector<Span> spans = Spans();
  ASSERT_EQ(spans.size(), 2u);  // the timed replay is drawn from its time only
  for (const Span& s : spans) {
    EXPECT_EQ(s.kind, SpanKind::kGraph);
    EXPECT_EQ(s.duration_ns, 1'300'000u);
    EXPECT_EQ(s.bytes, 160u);
  }
  EXPECT_EQ(ingest_.graph_launches(), 2u);
  EXPECT_EQ(ingest_.launched_kernels(), 2u * 160);  // each replay's kernel nodes
  EXPECT_TRUE(ingest_.profile().kernels().empty());  // graphs are not kernels
}

// NVTX ranges: GPU times when measured, CPU times otherwise; requests by name feed the
// histogram from push to the later of pop and GPU end; garbage durations are counted, not kept.
TEST_F(ClientIngestTest, RangesBecomeStepsAndRequestsLatencies) {
  c::Event r = At(c::EventKind::kRange, 10'000'000, 0);
  std::snprintf(r.name, sizeof(r.name), "request 17");
  r.duration_ns = 2'000'000;  // popped at 12 ms
  r.flags = c::kOnHostClock;
  r.func = 10'100'000;        // GPU work from 10.1 ms
  r.bytes = 13'000'000;       // to 13 ms: after the pop
  Feed(r, c::Priority::kHigh);
  c::Event step = At(c::EventKind::kRange, 20'000'000, 0);
  std::snprintf(step.name, sizeof(step.name), "step");
  step.aux = 1;
  step.duration_ns = 5'000'000;  // no GPU times
  Feed(step);
  step.duration_ns = 700ull * 1000000000ull;  // 700 s: written by a tenant, not measured
  Feed(step);
  const std::vector<Span> spans = Spans();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].kind, SpanKind::kStep);
  EXPECT_TRUE(spans[0].measured);
  EXPECT_EQ(spans[0].start_unix_ns, 10'100'000);
  EXPECT_EQ(spans[0].duration_ns, 2'900'000u);
  EXPECT_EQ(spans[0].cpu_start_unix_ns, 10'000'000);
  EXPECT_EQ(spans[0].cpu_duration_ns, 2'000'000u);
  EXPECT_EQ(names_.NameOf(spans[0].func), "request 17");
  EXPECT_FALSE(spans[1].measured);
  EXPECT_EQ(spans[1].depth, 1);
  EXPECT_EQ(spans[1].duration_ns, 5'000'000u);
  EXPECT_EQ(ingest_.requests().count, 1u);
  EXPECT_DOUBLE_EQ(ingest_.requests().sum_s, 0.003);
  EXPECT_EQ(ingest_.malformed_events(), 1u);
  EXPECT_DOUBLE_EQ(gpu_busy_ns_, 0);  // steps are not work
}

// The busy-period window the budget search reads: newest last, only those after a mark.
TEST_F(ClientIngestTest, BusyPeriodsSinceAMark) {
  for (uint64_t d : {100u, 200u, 300u}) {
    c::Event b = At(c::EventKind::kBusyPeriod, 1000);
    b.duration_ns = d * 1000;
    Feed(b, c::Priority::kHigh);
  }
  EXPECT_EQ(ingest_.busy().count, 3u);
  EXPECT_EQ(ingest_.BusyPeriodsSince(1), (std::vector<uint64_t>{200'000, 300'000}));
  EXPECT_TRUE(ingest_.BusyPeriodsSince(3).empty());
}

}  // namespace
}  // namespace orion::server
