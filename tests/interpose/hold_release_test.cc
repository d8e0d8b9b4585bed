// A GPU hold released past its bound (interpose/client_state.h, Registration::StillReleased):
// the launches stay at the gate on the CPU within the release's least time whatever the service
// does, after it only while the service is busy; a release stamped after the launch read its
// clock counts as within it; cleared, nothing is released.
#include "interpose/client_state.h"

#include <gtest/gtest.h>

namespace orion::interpose {
namespace {

constexpr uint64_t kSecond = 1'000'000'000;
constexpr uint64_t kLeast = 30 * kSecond;

TEST(HoldReleaseTest, WithinTheLeastTimeWhateverTheService) {
  Registration reg;
  const auto idle = [] { return false; };
  const auto busy = [] { return true; };
  EXPECT_FALSE(reg.StillReleased(100 * kSecond, kLeast, busy)) << "never released";
  reg.NoteReleased(100 * kSecond);
  EXPECT_TRUE(reg.HoldReleased());
  EXPECT_EQ(reg.HoldReleasedNs(), 100 * kSecond);
  EXPECT_TRUE(reg.StillReleased(100 * kSecond, kLeast, idle));
  EXPECT_TRUE(reg.StillReleased(129 * kSecond, kLeast, idle));
  // Past it: only while the service is busy.
  EXPECT_FALSE(reg.StillReleased(130 * kSecond, kLeast, idle));
  EXPECT_TRUE(reg.StillReleased(130 * kSecond, kLeast, busy));
  // Released again after the launch read its clock: within.
  EXPECT_TRUE(reg.StillReleased(99 * kSecond, kLeast, idle));
  // No least time: exactly while busy.
  EXPECT_FALSE(reg.StillReleased(100 * kSecond, 0, idle));
  EXPECT_TRUE(reg.StillReleased(100 * kSecond, 0, busy));
  reg.ClearReleased();
  EXPECT_FALSE(reg.HoldReleased());
  EXPECT_FALSE(reg.StillReleased(101 * kSecond, kLeast, busy));
}

TEST(HoldReleaseTest, WithinReleaseAtTheEdges) {
  EXPECT_TRUE(WithinRelease(10, 10, 1));
  EXPECT_FALSE(WithinRelease(11, 10, 1));
  EXPECT_TRUE(WithinRelease(9, 10, 0)) << "stamped after the reading";
  EXPECT_FALSE(WithinRelease(10, 10, 0));
  EXPECT_TRUE(WithinRelease(UINT64_MAX - 1, 0, UINT64_MAX)) << "no overflow";
  EXPECT_FALSE(WithinRelease(UINT64_MAX, 0, UINT64_MAX));
}

}  // namespace
}  // namespace orion::interpose
