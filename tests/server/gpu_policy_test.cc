// The policy seam: a GPU's knobs start from the config, admin changes are range-checked, a budget
// never set follows the mode's default while a set one stays, and only budget or mode changes
// restart the budget search's evidence.
#include "server/gpu_policy.h"

#include <gtest/gtest.h>

namespace orion::server {
namespace {

TEST(GpuPolicyTest, StartsFromTheConfigInTheBoardsUnits) {
  PolicyConfig c;
  c.mode = contract::GateMode::kMps;
  c.be_budget_us = 1234;
  c.be_budget_set = true;
  c.spin_us = 7;
  c.hp_stale_ms = 250;
  c.hp_grace_us = 900;
  c.gpu_hold_max_ms = 250;
  c.gpu_hold_release_ms = 1500;
  c.adapt_budget = false;
  const GpuPolicy p = InitialGpuPolicy(c);
  EXPECT_EQ(p.knobs.gpu_hold_max_ns, 250000000u);
  EXPECT_EQ(p.knobs.gpu_hold_release_ns, 1500000000u);
  EXPECT_EQ(p.knobs.mode, contract::GateMode::kMps);
  EXPECT_EQ(p.knobs.be_budget_ns, 1234000u);
  EXPECT_TRUE(p.budget_set);
  EXPECT_EQ(p.knobs.spin_ns, 7000u);
  EXPECT_EQ(p.knobs.hp_stale_ns, 250000000u);
  EXPECT_EQ(p.knobs.hp_grace_ns, 900000u);
  EXPECT_FALSE(p.adapt_budget);
}

TEST(GpuPolicyTest, AnUnsetBudgetFollowsTheModeAndASetOneStays) {
  GpuPolicy p = InitialGpuPolicy(PolicyConfig{});
  ASSERT_FALSE(p.budget_set);
  PolicyChange to_mps;
  to_mps.mode = contract::GateMode::kMps;
  EXPECT_TRUE(ApplyPolicyChange(to_mps, &p));
  EXPECT_EQ(p.knobs.be_budget_ns, DefaultBeBudgetUs(contract::GateMode::kMps) * 1000);

  PolicyChange budget;
  budget.be_budget_us = 42;
  EXPECT_TRUE(ApplyPolicyChange(budget, &p));
  EXPECT_TRUE(p.budget_set);
  PolicyChange to_priority;
  to_priority.mode = contract::GateMode::kPriority;
  EXPECT_TRUE(ApplyPolicyChange(to_priority, &p));
  EXPECT_EQ(p.knobs.mode, contract::GateMode::kPriority);
  EXPECT_EQ(p.knobs.be_budget_ns, 42000u);  // set by an operator: kept across the mode change
}

TEST(GpuPolicyTest, AdaptBudgetTrueHandsASetBudgetBackToTheServer) {
  GpuPolicy p = InitialGpuPolicy(PolicyConfig{});
  PolicyChange budget;
  budget.be_budget_us = 42;
  ApplyPolicyChange(budget, &p);
  ASSERT_TRUE(p.budget_set);
  PolicyChange back;
  back.adapt_budget = true;
  EXPECT_TRUE(ApplyPolicyChange(back, &p));  // the budget changed: fresh evidence
  EXPECT_FALSE(p.budget_set);
  EXPECT_EQ(p.knobs.be_budget_ns, DefaultBeBudgetUs(p.knobs.mode) * 1000);
  // With a budget in the same change, the budget wins and stays set.
  PolicyChange both;
  both.adapt_budget = true;
  both.be_budget_us = 99;
  ApplyPolicyChange(both, &p);
  EXPECT_TRUE(p.budget_set);
  EXPECT_EQ(p.knobs.be_budget_ns, 99000u);
}

TEST(GpuPolicyTest, OtherKnobsChangeWithoutRestartingTheBudgetEvidence) {
  GpuPolicy p = InitialGpuPolicy(PolicyConfig{});
  const GpuPolicy before = p;
  PolicyChange c;
  c.hp_grace_us = 2000;
  c.sm_threshold = 64;
  c.adapt_budget = false;
  c.gpu_hold_max_ms = 0;
  c.gpu_hold_release_ms = 0;
  EXPECT_EQ(before.knobs.gpu_hold_release_ns, contract::kDefaultGpuHoldReleaseNs);
  EXPECT_FALSE(ApplyPolicyChange(c, &p));  // adapt_budget=false moves no budget
  EXPECT_EQ(p.knobs.hp_grace_ns, 2000000u);
  EXPECT_EQ(p.knobs.gpu_hold_max_ns, 0u) << "0: no bound";
  EXPECT_EQ(p.knobs.gpu_hold_release_ns, 0u) << "0: until idle";
  EXPECT_EQ(p.knobs.sm_threshold, 64u);
  EXPECT_FALSE(p.adapt_budget);
  EXPECT_EQ(p.knobs.be_budget_ns, before.knobs.be_budget_ns);
  EXPECT_EQ(p.knobs.mode, before.knobs.mode);
  EXPECT_EQ(p.knobs.spin_ns, before.knobs.spin_ns);
}

TEST(GpuPolicyTest, OutOfRangeValuesAreRefusedByName) {
  auto message = [](auto set) {
    PolicyChange c;
    set(c);
    return std::string(ValidatePolicyChange(c).message());
  };
  EXPECT_EQ(message([](PolicyChange&) {}), "");
  EXPECT_EQ(message([](PolicyChange& c) { c.be_budget_us = 1000001; }),
            "knobs.be_budget_us must be at most 1000000 (1 s)");
  EXPECT_EQ(message([](PolicyChange& c) { c.spin_us = 10001; }),
            "knobs.spin_us must be at most 10000");
  EXPECT_EQ(message([](PolicyChange& c) { c.hp_stale_ms = 9; }),
            "knobs.hp_stale_ms must be in [10, 600000]");
  EXPECT_EQ(message([](PolicyChange& c) { c.hp_grace_us = 100001; }),
            "knobs.hp_grace_us must be at most 100000 (100 ms)");
  EXPECT_EQ(message([](PolicyChange& c) { c.gpu_hold_max_ms = 60001; }),
            "knobs.gpu_hold_max_ms must be at most 60000 (60 s)");
  EXPECT_EQ(message([](PolicyChange& c) { c.gpu_hold_max_ms = 60000; }), "");
  EXPECT_EQ(message([](PolicyChange& c) { c.gpu_hold_release_ms = 600001; }),
            "knobs.gpu_hold_release_ms must be at most 600000 (600 s)");
  EXPECT_EQ(message([](PolicyChange& c) { c.gpu_hold_release_ms = 600000; }), "");
  EXPECT_EQ(message([](PolicyChange& c) { c.be_budget_us = 1000000; c.hp_stale_ms = 600000; }),
            "");
}

}  // namespace
}  // namespace orion::server
