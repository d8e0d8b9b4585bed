// Online search of the best-effort budget for one GPU, in the spirit of Orion's offline search of
// `orion_hp_limit`: keep the high-priority tail (p99 of busy periods) under its target while giving
// best-effort work as much GPU time as possible. Multiplicative decrease when the tail is over the
// target, additive increase when it is comfortably under. Pure logic, driven by the server's
// policy loop (about every 100 ms) and tested directly.
//
// Usage:
//   BudgetController c({.min_ns = 0, .max_ns = 5'000'000});
//   uint64_t budget = c.Update(current_budget, observed_p99_ns, target_ns, samples);
#pragma once

#include <cstdint>

namespace orion::server {

struct BudgetLimits {
  uint64_t min_ns = 0;
  uint64_t max_ns = 5000000;    // 5 ms
  uint64_t step_ns = 50000;     // additive increase
  double decrease = 0.5;        // multiplicative decrease
  double headroom = 0.9;        // increase only while p99 < headroom * target
  uint32_t min_samples = 20;    // too few busy periods: hold
};

class BudgetController {
 public:
  explicit BudgetController(BudgetLimits limits) : limits_(limits) {}
  uint64_t Update(uint64_t budget_ns, uint64_t p99_ns, uint64_t target_ns, uint32_t samples) const;

 private:
  BudgetLimits limits_;
};

}  // namespace orion::server
