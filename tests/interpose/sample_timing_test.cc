// A timed launch's events into a kernel duration (interpose/sample_timing.h), and the host
// clock's rate against the GPU's learned from anchors (interpose/gpu_clock.h).
#include "interpose/sample_timing.h"

#include <gtest/gtest.h>

#include "interpose/gpu_clock.h"

namespace orion::interpose {
namespace {

constexpr StartLatency kLatency{
    .idle_ns = 1'000, .queued_ns = 2'400, .held_ns = 2'600, .held_compute_ns = 2'900};

// An eager service's launch on an idle stream, as seen on an H100: the start event ran at once,
// the launch call returned 9 us after the start event's record, the kernel ran 3 us, 1 us of
// start latency beyond an event's.
SampleEvents IdleLaunch() {
  SampleEvents e;
  e.start_recorded_ns = 1'000'000;
  e.launched_ns = 1'009'000;
  e.gpu_elapsed_ns = 9'000 + 1'000 + 3'000;
  e.placed = true;
  e.start_host_ns = 1'000'500;
  e.end_host_ns = e.start_host_ns + e.gpu_elapsed_ns;
  return e;
}

// The same launch with its start event run `after_return_ns` after the call's return and
// `gpu_elapsed_ns` between its events.
SampleEvents StartedAfterReturn(uint64_t after_return_ns, uint64_t gpu_elapsed_ns) {
  SampleEvents e = IdleLaunch();
  e.start_host_ns = e.launched_ns + after_return_ns;
  e.gpu_elapsed_ns = gpu_elapsed_ns;
  e.end_host_ns = e.start_host_ns + e.gpu_elapsed_ns;
  return e;
}

TEST(TimeSampleTest, IdleStreamTakesOffTheHandoverNotThePlacement) {
  SampleEvents e = IdleLaunch();
  SampleTiming t = TimeSample(e, kLatency);
  EXPECT_TRUE(t.idle_stream);
  EXPECT_EQ(t.duration_ns, 3'000u);
  EXPECT_EQ(t.start_ns, e.end_host_ns - 3'000);
  // Anchors placing the events 12 us early or late (seen on an H100 guest before the clock rate
  // was learned) change where the span sits, not how long it is.
  for (int64_t error : {-12'000, 12'000}) {
    SampleEvents moved = e;
    moved.start_host_ns += error;
    moved.end_host_ns += error;
    SampleTiming m = TimeSample(moved, kLatency);
    EXPECT_TRUE(m.idle_stream) << error;
    EXPECT_EQ(m.duration_ns, 3'000u) << error;
  }
}

TEST(TimeSampleTest, QueuedKernelIsTheGpusElapsedTimeLessItsStartLatency) {
  // The start event ran 200 us after the call's return: the previous kernel on the stream. The
  // kernel started 2.4 us after the event and ran 40 us.
  SampleEvents e = StartedAfterReturn(200'000, 2'400 + 40'000);
  SampleTiming t = TimeSample(e, kLatency);
  EXPECT_FALSE(t.idle_stream);
  EXPECT_EQ(t.duration_ns, 40'000u);
  EXPECT_EQ(t.start_ns, e.start_host_ns + 2'400);
  // The host times between the start event's record and the call's return are the idle rule's:
  // a queued sample ignores them.
  e.start_recorded_ns = e.launched_ns - 150'000;
  EXPECT_EQ(TimeSample(e, kLatency).duration_ns, 40'000u);
  // A GPU whose kernels start with their event (the test double) keeps the elapsed time.
  EXPECT_EQ(TimeSample(e, StartLatency{.idle_ns = 0, .queued_ns = 0}).duration_ns, 42'400u);
  // Shorter than the latency: nothing left to see, never negative.
  e.gpu_elapsed_ns = 2'000;
  EXPECT_EQ(TimeSample(e, kLatency).duration_ns, 0u);
}

TEST(TimeSampleTest, HeldLaunchIsQueuedWhereverItsStartEventIsPlaced) {
  // Held on its stream until its end event was recorded (timing_hold.h): the start event ran
  // 3 us after the call's return, the kernel 2.6 us after it (the held latency, not the queued
  // one), for 5 us. Placed within the idle margin, it would otherwise lose the host gap (9 us)
  // and the idle latency too.
  SampleEvents e = StartedAfterReturn(3'000, 2'600 + 5'000);
  e.held = true;
  SampleTiming t = TimeSample(e, kLatency);
  EXPECT_FALSE(t.idle_stream);
  EXPECT_EQ(t.duration_ns, 5'000u);
  EXPECT_EQ(t.start_ns, e.start_host_ns + 2'600);
  e.held = false;
  EXPECT_TRUE(TimeSample(e, kLatency).idle_stream);
  EXPECT_EQ(TimeSample(e, kLatency).duration_ns, 0u);  // the idle rule cuts it to nothing
}

TEST(TimeSampleTest, HeldComputeKernelLosesItsOwnStartLatency) {
  // A held GEMM starts 2.9 us after its start event (the compute kernels' latency), a held
  // elementwise kernel 2.6 us after it: each loses its own, and only a held sample does.
  SampleEvents e = StartedAfterReturn(3'000, 2'900 + 7'000);
  e.held = true;
  e.compute = true;
  SampleTiming t = TimeSample(e, kLatency);
  EXPECT_EQ(t.duration_ns, 7'000u);
  EXPECT_EQ(t.start_ns, e.start_host_ns + 2'900);
  e.compute = false;
  EXPECT_EQ(TimeSample(e, kLatency).duration_ns, 7'300u);
  // Queued behind the stream's own work (not held): the queued latency, whatever the class.
  SampleEvents queued = StartedAfterReturn(40'000, 2'400 + 7'000);
  queued.compute = true;
  EXPECT_FALSE(TimeSample(queued, kLatency).idle_stream);
  EXPECT_EQ(TimeSample(queued, kLatency).duration_ns, 7'000u);
}

TEST(TimeSampleTest, IdleGraphTakesItsQueuedMeanWithinWhatTheEventsAllow) {
  // A graph launch on an idle stream: the call took 65 us, the start event ran at its record,
  // the graph's first kernel 20 us into the call, and it ran 1 ms.
  SampleEvents e = IdleLaunch();
  e.launched_ns = e.start_recorded_ns + 65'000;
  e.gpu_elapsed_ns = 20'000 + 1'000'000;
  e.end_host_ns = e.start_host_ns + e.gpu_elapsed_ns;
  const SampleTiming t = TimeSample(e, kLatency);
  ASSERT_TRUE(t.idle_stream);
  EXPECT_EQ(t.duration_ns, 1'020'000u - 65'000 - 1'000);  // the idle rule: 4.6% short
  EXPECT_EQ(IdleGraphTiming(e, t, kLatency, 0).duration_ns, t.duration_ns);  // no queued sample yet
  EXPECT_EQ(IdleGraphTiming(e, t, kLatency, 1'000'000).duration_ns, 1'000'000u);
  EXPECT_EQ(IdleGraphTiming(e, t, kLatency, 1'000'000).start_ns, e.end_host_ns - 1'000'000);
  // Kept within the events: not past the elapsed time less the queued latency, not under the
  // idle rule's duration.
  EXPECT_EQ(IdleGraphTiming(e, t, kLatency, 1'100'000).duration_ns, 1'020'000u - 2'400);
  EXPECT_EQ(IdleGraphTiming(e, t, kLatency, 900'000).duration_ns, t.duration_ns);
  // A queued sample is left as it is.
  SampleTiming queued = t;
  queued.idle_stream = false;
  EXPECT_EQ(IdleGraphTiming(e, queued, kLatency, 1'000'000).duration_ns, t.duration_ns);
}

TEST(TimeSampleTest, NeverNegativeAndUnplacedKeepsTheElapsedTime) {
  SampleEvents e = IdleLaunch();
  e.gpu_elapsed_ns = 4'000;  // less than the handover: a kernel too short to see
  EXPECT_EQ(TimeSample(e, kLatency).duration_ns, 0u);
  e.placed = false;
  SampleTiming t = TimeSample(e, kLatency);
  EXPECT_EQ(t.duration_ns, 4'000u);
  EXPECT_EQ(t.start_ns, 0u);
  EXPECT_FALSE(t.idle_stream);
  // No record time known: only the start latency comes off.
  e = IdleLaunch();
  e.start_recorded_ns = 0;
  EXPECT_EQ(TimeSample(e, kLatency).duration_ns, e.gpu_elapsed_ns - 1'000);
}

TEST(TimeSampleTest, ContendedOnlyWhereAnotherSliceCanSitInsideTheMeasurement) {
  // Another process's work in flight: an idle stream's sample may hold its time slice between
  // the start event and the kernel, and so may one whose events were not placed.
  const SampleEvents idle = IdleLaunch();
  EXPECT_TRUE(ReportedContended(true, idle, TimeSample(idle, kLatency)));
  SampleEvents unplaced = idle;
  unplaced.placed = false;
  EXPECT_TRUE(ReportedContended(true, unplaced, TimeSample(unplaced, kLatency)));
  // Behind the process's own work, or released from a hold, the kernel follows its start event:
  // the measurement is its own.
  const SampleEvents queued = StartedAfterReturn(200'000, 2'400 + 40'000);
  EXPECT_FALSE(ReportedContended(true, queued, TimeSample(queued, kLatency)));
  SampleEvents held = StartedAfterReturn(3'000, 2'600 + 5'000);
  held.held = true;
  EXPECT_FALSE(ReportedContended(true, held, TimeSample(held, kLatency)));
  // Nothing else in flight: never contended.
  EXPECT_FALSE(ReportedContended(false, idle, TimeSample(idle, kLatency)));
  EXPECT_FALSE(ReportedContended(false, unplaced, TimeSample(unplaced, kLatency)));
}

TEST(GpuClockRateTest, LearnsTheDriftAndIgnoresWhatNoClockDoes) {
  double rate = 1.0;
  // 22 us a second: the host clock ran fast against an H100's.
  ASSERT_TRUE(GpuClock::NextRate(&rate, false, 1e9 + 22'000, 1e9));
  EXPECT_NEAR((rate - 1.0) * 1e6, 22.0, 0.01);
  // A later measurement moves the estimate a quarter of the way.
  ASSERT_TRUE(GpuClock::NextRate(&rate, true, 1e9 + 14'000, 1e9));
  EXPECT_NEAR((rate - 1.0) * 1e6, 20.0, 0.01);
  // Too short a gap, an impossible rate (a misplaced anchor), a backwards host gap: unchanged.
  EXPECT_FALSE(GpuClock::NextRate(&rate, true, 5e7 + 500, 5e7));
  EXPECT_FALSE(GpuClock::NextRate(&rate, true, 1e9 + 2e6, 1e9));
  EXPECT_FALSE(GpuClock::NextRate(&rate, true, -1.0, 1e9));
  EXPECT_NEAR((rate - 1.0) * 1e6, 20.0, 0.01);
}

}  // namespace
}  // namespace orion::interpose
