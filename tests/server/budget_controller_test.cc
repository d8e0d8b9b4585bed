// The online budget search: decrease on a missed target, increase with headroom, clamp, hold.
#include "server/budget_controller.h"

#include <gtest/gtest.h>

namespace orion::server {
namespace {

TEST(BudgetControllerTest, HalvesWhenTailMissesTarget) {
  BudgetController c(BudgetLimits{});
  EXPECT_EQ(c.Update(1000000, 12000000, 10000000, 100), 500000u);
}

TEST(BudgetControllerTest, GrowsWithHeadroomAndHoldsNearTarget) {
  BudgetController c(BudgetLimits{});
  EXPECT_EQ(c.Update(100000, 5000000, 10000000, 100), 150000u);   // 50% of target: grow
  EXPECT_EQ(c.Update(100000, 9500000, 10000000, 100), 100000u);   // within 10%: hold
}

TEST(BudgetControllerTest, ClampsAndNeedsSamplesAndTarget) {
  BudgetLimits l;
  l.max_ns = 200000;
  BudgetController c(l);
  EXPECT_EQ(c.Update(190000, 1, 10000000, 100), 200000u);
  EXPECT_EQ(c.Update(100000, 99999999, 10000000, 5), 100000u);  // too few samples
  EXPECT_EQ(c.Update(100000, 99999999, 0, 500), 100000u);       // no target
}

TEST(BudgetControllerTest, ConvergesUnderAToyModel) {
  // Toy plant: HP p99 = 5 ms + 4 * budget. Target 9 ms -> budget should settle near 1 ms.
  BudgetController c(BudgetLimits{});
  uint64_t budget = 0;
  for (int i = 0; i < 400; ++i) {
    const uint64_t p99 = 5000000 + 4 * budget;
    budget = c.Update(budget, p99, 9000000, 100);
  }
  const uint64_t p99 = 5000000 + 4 * budget;
  EXPECT_LE(p99, 9000000u + 4 * 50000u);
  EXPECT_GE(budget, 400000u);
}

}  // namespace
}  // namespace orion::server
