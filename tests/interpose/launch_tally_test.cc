// CountLaunch (interpose/client_state.h): the launch counter that each thread adds to in batches,
// at once where the gate applies, after a quiet millisecond, and when it changes registration.
#include "interpose/client_state.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

namespace orion::interpose {

// client_state.cc's definitions (the test does not link the library's sources); the library's
// WatchLaunchTally arms the thread's exit, here it is counted.
constinit thread_local ThreadLaunch t_launch __attribute__((tls_model("initial-exec")));
thread_local int t_watched = 0;
void WatchLaunchTally() { ++t_watched; }

namespace {

constexpr uint64_t kT0 = 5'000'000'000;  // ns: any time after the first millisecond

struct Client {
  std::unique_ptr<contract::ClientArea> area = std::make_unique<contract::ClientArea>();
  Registration reg;
  explicit Client(int device = 0) {
    reg.device = device;
    reg.area = area.get();
  }
  uint64_t counted() const { return area->counters.launches.load(); }
};

class LaunchTallyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_launch = ThreadLaunch{};
    t_watched = 0;
  }
};

TEST_F(LaunchTallyTest, AddsInBatchesWhileLaunchesKeepComing) {
  Client c;
  CountLaunch(&c.reg, 1, kT0, false);  // the thread's first: a millisecond since it last added
  EXPECT_EQ(c.counted(), 1u);
  for (uint64_t i = 1; i < kLaunchTallyKernels; ++i) CountLaunch(&c.reg, 1, kT0 + i * 1000, false);
  EXPECT_EQ(c.counted(), 1u) << "31 launches within the millisecond stay in the thread's tally";
  CountLaunch(&c.reg, 1, kT0 + 40'000, false);
  EXPECT_EQ(c.counted(), 1u + kLaunchTallyKernels);
  // A graph of many kernels fills the batch by itself.
  CountLaunch(&c.reg, 229, kT0 + 50'000, false);
  EXPECT_EQ(c.counted(), 1u + kLaunchTallyKernels + 229);
  EXPECT_EQ(t_watched, 1) << "the thread's exit is armed once, at its first launch";
}

// A graph's kernel count may be as large as the registry keeps (2^32 - 1): added to a thread's
// tally of a few, the sum must not wrap (the tally itself is 32 bits: it holds under 32).
TEST_F(LaunchTallyTest, AGraphOfTheMostKernelsIsCountedWhole) {
  Client c;
  CountLaunch(&c.reg, 1, kT0, false);
  CountLaunch(&c.reg, 1, kT0 + 1'000, false);
  CountLaunch(&c.reg, 1, kT0 + 2'000, false);
  CountLaunch(&c.reg, UINT32_MAX, kT0 + 3'000, false);
  EXPECT_EQ(c.counted(), uint64_t{3} + UINT32_MAX);
  CountLaunch(&c.reg, 1, kT0 + 4'000, true);
  EXPECT_EQ(c.counted(), uint64_t{4} + UINT32_MAX) << "the tally starts again from nothing";
}

TEST_F(LaunchTallyTest, AddsAtOnceWhereTheGateAppliesOrAfterAQuietMillisecond) {
  Client c;
  CountLaunch(&c.reg, 1, kT0, false);
  CountLaunch(&c.reg, 1, kT0 + 1'000, false);
  EXPECT_EQ(c.counted(), 1u);
  CountLaunch(&c.reg, 1, kT0 + 2'000, /*gated=*/true);
  EXPECT_EQ(c.counted(), 3u) << "a held client's counter must show each launch it makes";
  CountLaunch(&c.reg, 1, kT0 + 3'000, false);
  EXPECT_EQ(c.counted(), 3u);
  CountLaunch(&c.reg, 1, kT0 + 2'000 + kLaunchTallyNs, false);
  EXPECT_EQ(c.counted(), 5u) << "the first launch after a quiet millisecond shows the progress";
}

TEST_F(LaunchTallyTest, LaunchingOnAnotherGpuAddsTheTallyToTheFirstOnesCounter) {
  Client a(0), b(1);
  CountLaunch(&a.reg, 1, kT0, false);
  CountLaunch(&a.reg, 1, kT0 + 1'000, false);
  CountLaunch(&a.reg, 1, kT0 + 2'000, false);
  EXPECT_EQ(a.counted(), 1u);
  CountLaunch(&b.reg, 1, kT0 + 3'000, false);
  EXPECT_EQ(a.counted(), 3u) << "the launches on the first GPU are not lost";
  EXPECT_EQ(b.counted(), 0u);
  CountLaunch(&b.reg, 1, kT0 + 4'000, true);
  EXPECT_EQ(b.counted(), 2u);
  EXPECT_EQ(t_watched, 1);
}

// A renewal (a new server) gives the same GPU a new registration whose counters were carried
// from the old one: the tally goes on in the new one, where the new server reads it.
TEST_F(LaunchTallyTest, ARenewedRegistrationTakesTheTallyOn) {
  Client old_reg(0), renewed(0);
  CountLaunch(&old_reg.reg, 1, kT0, false);
  CountLaunch(&old_reg.reg, 1, kT0 + 1'000, false);
  CountLaunch(&old_reg.reg, 1, kT0 + 2'000, false);
  renewed.area->counters.launches.store(old_reg.counted());  // carried at the renewal
  CountLaunch(&renewed.reg, 1, kT0 + 3'000, /*gated=*/true);
  EXPECT_EQ(old_reg.counted(), 1u) << "nothing is added to the registration left behind";
  EXPECT_EQ(renewed.counted(), 4u);
}

TEST_F(LaunchTallyTest, EachThreadKeepsItsOwnTally) {
  Client c;
  CountLaunch(&c.reg, 1, kT0, false);
  CountLaunch(&c.reg, 1, kT0 + 1'000, false);  // held in this thread's tally
  std::thread other([&] {
    CountLaunch(&c.reg, 1, kT0, false);
    CountLaunch(&c.reg, 1, kT0 + 1'000, true);
  });
  other.join();
  EXPECT_EQ(c.counted(), 3u);
}

}  // namespace
}  // namespace orion::interpose
