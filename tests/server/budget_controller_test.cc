// The online budget search: shrink on a missed p99, grow with headroom, hold in between, wait for
// evidence, and settle without a limit cycle when it sees only periods since its last change.
#include "server/budget_controller.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace orion::server {
namespace {

constexpr uint64_t kMs = 1000000;

// n periods: `over` of them at 12 ms, `near` at 9.5 ms, the rest at 5 ms.
std::vector<uint64_t> Periods(uint32_t n, uint32_t over, uint32_t near) {
  std::vector<uint64_t> v(n, 5 * kMs);
  for (uint32_t i = 0; i < over; ++i) v[i] = 12 * kMs;
  for (uint32_t i = over; i < over + near; ++i) v[i] = 9500000;
  return v;
}

BudgetVerdict VerdictOf(const BudgetController& c, const std::vector<uint64_t>& v) {
  return c.Verdict(c.Judge(v.data(), v.size(), 10 * kMs));
}

TEST(BudgetControllerTest, JudgesAgainstTargetAndHeadroom) {
  BudgetController c(BudgetLimits{});
  const auto v = Periods(200, 3, 4);
  const TailEvidence e = c.Judge(v.data(), v.size(), 10 * kMs);
  EXPECT_EQ(e.samples, 200u);
  EXPECT_EQ(e.over_target, 3u);
  EXPECT_EQ(e.over_headroom, 7u);
}

TEST(BudgetControllerTest, ShrinksOnlyOnMoreThanOnePercentAndTwoPeriodsOver) {
  BudgetController c(BudgetLimits{});
  EXPECT_EQ(VerdictOf(c, Periods(10, 2, 0)), BudgetVerdict::kShrink);    // early, clear miss
  EXPECT_EQ(VerdictOf(c, Periods(10, 1, 0)), BudgetVerdict::kWait);      // one outlier
  EXPECT_EQ(VerdictOf(c, Periods(300, 3, 0)), BudgetVerdict::kGrow);     // exactly 1%: p99 met
  EXPECT_EQ(VerdictOf(c, Periods(300, 4, 0)), BudgetVerdict::kShrink);   // 1.3%
  EXPECT_EQ(c.Update(1000000, BudgetVerdict::kShrink), 500000u);
}

TEST(BudgetControllerTest, GrowsWithHeadroomAfterEnoughPeriodsAndHoldsNearTarget) {
  BudgetController c(BudgetLimits{});
  EXPECT_EQ(VerdictOf(c, Periods(99, 0, 0)), BudgetVerdict::kWait);   // too few to judge p99
  EXPECT_EQ(VerdictOf(c, Periods(100, 0, 1)), BudgetVerdict::kGrow);
  EXPECT_EQ(VerdictOf(c, Periods(100, 0, 2)), BudgetVerdict::kHold);  // p99 within 10% of target
  EXPECT_EQ(c.Update(100000, BudgetVerdict::kGrow), 150000u);         // at least the step
  EXPECT_EQ(c.Update(2000000, BudgetVerdict::kGrow), 2500000u);       // a quarter
  EXPECT_EQ(c.Update(2000000, BudgetVerdict::kHold), 2000000u);
  EXPECT_EQ(c.Update(2000000, BudgetVerdict::kWait), 2000000u);
}

TEST(BudgetControllerTest, ClampsAndCombinesClients) {
  BudgetLimits l;
  l.max_ns = 200000;
  BudgetController c(l);
  EXPECT_EQ(c.Update(190000, BudgetVerdict::kGrow), 200000u);
  EXPECT_EQ(c.Update(0, BudgetVerdict::kShrink), 0u);
  using V = BudgetVerdict;
  EXPECT_EQ(BudgetController::Combine(V::kGrow, V::kShrink), V::kShrink);
  EXPECT_EQ(BudgetController::Combine(V::kHold, V::kGrow), V::kHold);
  EXPECT_EQ(BudgetController::Combine(V::kWait, V::kGrow), V::kGrow);  // a quiet client: no veto
  EXPECT_EQ(BudgetController::Combine(V::kWait, V::kWait), V::kWait);
}

// A toy plant with the server's timing: 30 busy periods per 100 ms tick, each 5 ms plus an
// exponential delay whose mean grows with the budget (p99 = 5 ms + 4.6 * 0.3 * budget: 10 ms at
// a budget of about 3.6 ms). Judged on the periods since the last change, the search settles
// near that budget; judged on the last 2,000 periods (as the search used to be) it halves to 0
// before the window sees its first change, and keeps coming back there.
struct ToyRun {
  uint64_t ticks_at_zero = 0;
  uint64_t mean_budget = 0;
  double over_fraction = 0;  // periods over the 10 ms target, second half
};

ToyRun RunToy(bool since_change) {
  BudgetController c(BudgetLimits{});
  std::mt19937_64 rng(7);
  std::vector<uint64_t> all;
  size_t change_at = 0;
  uint64_t budget = 1000000;
  ToyRun out;
  uint64_t sum = 0, over = 0, counted = 0;
  constexpr int kTicks = 600;
  for (int tick = 0; tick < kTicks; ++tick) {
    std::exponential_distribution<double> extra(1.0 / (0.3 * static_cast<double>(budget) + 1));
    for (int i = 0; i < 30; ++i) {
      const uint64_t d = 5 * kMs + static_cast<uint64_t>(extra(rng));
      all.push_back(d);
      if (tick >= kTicks / 2) {
        ++counted;
        over += d > 10 * kMs;
      }
    }
    const size_t first = since_change ? change_at : (all.size() > 2000 ? all.size() - 2000 : 0);
    const BudgetVerdict v = c.Verdict(c.Judge(all.data() + first, all.size() - first, 10 * kMs));
    const uint64_t next = c.Update(budget, v);
    if (next != budget) change_at = all.size();
    budget = next;
    out.ticks_at_zero += budget == 0;
    if (tick >= kTicks / 2) sum += budget;
  }
  out.mean_budget = sum / (kTicks / 2);
  out.over_fraction = static_cast<double>(over) / static_cast<double>(counted);
  return out;
}

TEST(BudgetControllerTest, SettlesNearTheRightBudgetOnPeriodsSinceTheLastChange) {
  const ToyRun fresh = RunToy(/*since_change=*/true);
  const ToyRun windowed = RunToy(/*since_change=*/false);
  EXPECT_EQ(fresh.ticks_at_zero, 0u);
  EXPECT_GE(fresh.mean_budget, 1500000u);
  EXPECT_LE(fresh.mean_budget, 3600000u);
  EXPECT_LE(fresh.over_fraction, 0.02);
  // The same rules on a lagging window: a limit cycle through 0.
  EXPECT_GT(windowed.ticks_at_zero, 100u);
  EXPECT_LT(windowed.mean_budget, fresh.mean_budget / 2);
  std::printf("[budget] toy plant, right budget ~3.6 ms: since the last change mean %.2f ms, "
              "%.2f%% over target, 0 ms for %llu of 600 ticks; last 2,000 periods: mean %.2f ms, "
              "0 ms for %llu ticks\n",
              static_cast<double>(fresh.mean_budget) / 1e6, 100 * fresh.over_fraction,
              static_cast<unsigned long long>(fresh.ticks_at_zero),
              static_cast<double>(windowed.mean_budget) / 1e6,
              static_cast<unsigned long long>(windowed.ticks_at_zero));
}


// Sized to the service: a tenth of the median busy period, within [250 us, the mode's default].
TEST(SizeBudgetToServiceTest, FollowsTheMedianBusyPeriodWithinItsBounds) {
  const uint64_t kDefault = 500'000;
  // Busy periods of a graph service of ~1 ms requests beside a trainer: 2.8 ms -> 280 us; a
  // stray long period does not move the median.
  std::vector<uint64_t> periods(100, 2'800'000);
  periods[7] = 40'000'000;
  EXPECT_EQ(SizeBudgetToService(periods, kDefault, kDefault), 280'000u);
  // Long busy periods keep the default; short ones stop at the floor.
  EXPECT_EQ(SizeBudgetToService(std::vector<uint64_t>(50, 8'000'000), 280'000, kDefault),
            kDefault);
  EXPECT_EQ(SizeBudgetToService(std::vector<uint64_t>(50, 300'000), kDefault, kDefault),
            ServiceSizing{}.min_ns);
  // Too few periods: what the GPU has now stays.
  EXPECT_EQ(SizeBudgetToService(std::vector<uint64_t>(19, 2'800'000), kDefault, kDefault),
            kDefault);
  // Within the hysteresis: no change published; past it, the new size.
  EXPECT_EQ(SizeBudgetToService(std::vector<uint64_t>(50, 3'000'000), 280'000, kDefault),
            280'000u);
  EXPECT_EQ(SizeBudgetToService(std::vector<uint64_t>(50, 3'400'000), 280'000, kDefault),
            340'000u);
  // A mode default below the floor (a smaller maximum) wins.
  EXPECT_EQ(SizeBudgetToService(std::vector<uint64_t>(50, 300'000), 100'000, 100'000), 100'000u);
}

}  // namespace
}  // namespace orion::server
