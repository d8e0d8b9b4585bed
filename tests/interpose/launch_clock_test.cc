// The launch path's clock (interpose/launch_clock.h): the counter's rate, the extrapolation and
// its bounds, which hosts may use it, and its readings against the kernel's clock.
#include "interpose/launch_clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

namespace orion::interpose {
namespace {

constexpr uint64_t kOneQ32 = uint64_t{1} << 32;

TEST(LaunchClockTest, RateFromTwoAnchors) {
  // A 2.5 GHz counter: 0.4 ns a tick.
  const uint64_t rate = NsPerTickQ32({1'000'000, 5'000}, {1'000'000 + 2'500'000'000ull, 1'000'005'000});
  EXPECT_NEAR(static_cast<double>(rate) / kOneQ32, 0.4, 1e-9);
  // A counter that went back, stood still, or ticks at an impossible rate is no clock.
  EXPECT_EQ(NsPerTickQ32({100, 5}, {50, 10}), 0u);
  EXPECT_EQ(NsPerTickQ32({100, 5}, {100, 10}), 0u);
  EXPECT_EQ(NsPerTickQ32({0, 0}, {1'000, 1'000'000}), 0u);     // 1 MHz
  EXPECT_EQ(NsPerTickQ32({0, 0}, {1'000'000'000, 1'000}), 0u);  // 1 THz
  EXPECT_EQ(NsPerTickQ32({0, 5}, {1'000, 5}), 0u);              // the kernel's clock stood
}

TEST(LaunchClockTest, ExtrapolatesOnlyWithinItsAnchorsReach) {
  ThreadClock clock;
  uint64_t ns = 0;
  EXPECT_FALSE(clock.Extrapolate(123, &ns)) << "never anchored";
  clock.Anchor({1'000'000, 7'000'000'000}, kOneQ32 / 2);  // 2 GHz
  EXPECT_EQ(clock.max_ticks, 2 * kMaxExtrapolatedNs);
  ASSERT_TRUE(clock.Extrapolate(1'000'000, &ns));
  EXPECT_EQ(ns, 7'000'000'000u);
  ASSERT_TRUE(clock.Extrapolate(1'000'000 + 2'000, &ns));
  EXPECT_EQ(ns, 7'000'001'000u);
  ASSERT_TRUE(clock.Extrapolate(1'000'000 + 2 * kMaxExtrapolatedNs - 1, &ns));
  EXPECT_EQ(ns, 7'000'000'000u + kMaxExtrapolatedNs - 1);
  EXPECT_FALSE(clock.Extrapolate(1'000'000 + 2 * kMaxExtrapolatedNs, &ns)) << "anchor too old";
  EXPECT_FALSE(clock.Extrapolate(999'999, &ns)) << "a counter behind the anchor";
  clock.Anchor({1'000'000, 7'000'000'000}, 0);
  EXPECT_FALSE(clock.Extrapolate(1'000'001, &ns)) << "no rate: the kernel's clock";
}

TEST(LaunchClockTest, AnInterruptedPairAnchorsNothing) {
  TickAnchor anchor;
  const uint64_t rate = kOneQ32 / 3;  // 3 GHz
  ASSERT_TRUE(AnchorFromReadings(1'000'000, 55, 1'000'090, rate, &anchor));
  EXPECT_EQ(anchor.ticks, 1'000'045u);
  EXPECT_EQ(anchor.ns, 55u);
  // 17 us between the kernel's reading and the counter's after it.
  EXPECT_FALSE(AnchorFromReadings(1'000'000, 55, 1'000'000 + 51'000, rate, &anchor));
  EXPECT_FALSE(AnchorFromReadings(1'000'000, 55, 999'000, rate, &anchor)) << "went back";
  // Before the first rate: in ticks.
  EXPECT_TRUE(AnchorFromReadings(0, 55, 9'999, 0, &anchor));
  EXPECT_FALSE(AnchorFromReadings(0, 55, 10'000, 0, &anchor));
}

constexpr char kInvariantCpu[] =
    "processor\t: 0\nvendor_id\t: GenuineIntel\n"
    "flags\t\t: fpu vme tsc msr constant_tsc rep_good nopl nonstop_tsc cpuid tsc_known_freq\n"
    "bugs\t\t: spectre_v1\n\nprocessor\t: 1\n";

TEST(LaunchClockTest, UsableOnlyWithASteadyCounterUnderTheKernelsClock) {
  EXPECT_TRUE(CounterClockUsable(kInvariantCpu, "tsc\n"));
  EXPECT_TRUE(CounterClockUsable(kInvariantCpu, "kvm-clock\n"));
  EXPECT_TRUE(CounterClockUsable(kInvariantCpu, "hyperv_clocksource_tsc_page"));
  EXPECT_FALSE(CounterClockUsable(kInvariantCpu, "hpet\n")) << "the kernel found it unstable";
  EXPECT_FALSE(CounterClockUsable(kInvariantCpu, "acpi_pm\n"));
  EXPECT_FALSE(CounterClockUsable(kInvariantCpu, ""));
  EXPECT_FALSE(CounterClockUsable(
      "processor\t: 0\nflags\t\t: fpu tsc constant_tsc cpuid\n", "tsc\n"))
      << "stops in deep sleep states";
  EXPECT_FALSE(CounterClockUsable(
      "processor\t: 0\nflags\t\t: fpu tsc nonstop_tsc\n", "tsc\n"));
  // A word only as a whole word, and only on the flags line.
  EXPECT_FALSE(CounterClockUsable(
      "processor\t: 0\nflags\t\t: xconstant_tsc nonstop_tscx\nbugs\t: constant_tsc nonstop_tsc\n",
      "tsc\n"));
  EXPECT_FALSE(CounterClockUsable("processor\t: 0\nCPU part\t: 0xd0c\n", "arch_sys_counter\n"));
}

// The readings against the kernel's clock read around them, after the first rate: within the
// bound launch_clock.h states, in several threads at once. Where the host's counter cannot be
// used the launch clock is the kernel's and the bound holds trivially; the test says which.
TEST(LaunchClockTest, ReadingsStayWithTheKernelsClock) {
  InitLaunchClock(true);
  const uint64_t warm_until = MonotonicNs() + 2 * kFirstCalibrationNs;
  while (MonotonicNs() < warm_until) LaunchClockNs();
  const bool extrapolates = LaunchClockExtrapolates();
  std::printf("launch clock %s on this host\n",
              extrapolates ? "extrapolates the counter" : "is the kernel's clock");

  // 100 ns for the rate's error over an anchor's reach, and room for a preemption between the
  // kernel's reading and the launch clock's.
  constexpr uint64_t kSlackNs = 100'000;
  auto check = [&](int reads, std::atomic<int>* bad, std::atomic<int>* extrapolated) {
    uint64_t last = 0;
    for (int i = 0; i < reads; ++i) {
      const uint64_t before = MonotonicNs();
      const uint64_t ns = LaunchClockNs();
      const uint64_t after = MonotonicNs();
      if (ns + kSlackNs < before || ns > after + kSlackNs) bad->fetch_add(1);
      if (ns + 1'000 < last) bad->fetch_add(1);  // never back by more than the rate's error
      last = ns;
    }
    if (t_launch_clock.max_ticks != 0) extrapolated->fetch_add(1);
  };
  std::atomic<int> bad{0}, extrapolated{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back(check, 200'000, &bad, &extrapolated);
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  if (extrapolates) EXPECT_EQ(extrapolated.load(), 3) << "every thread extrapolates";

  InitLaunchClock(false);
  EXPECT_FALSE(LaunchClockExtrapolates());
  const uint64_t before = MonotonicNs();
  // An anchor left from before still reaches kMaxExtrapolatedNs; a new thread has none.
  uint64_t reading = 0;
  std::thread([&reading] { reading = LaunchClockNs(); }).join();
  EXPECT_GE(reading, before) << "off: the kernel's clock";
}

}  // namespace
}  // namespace orion::interpose
