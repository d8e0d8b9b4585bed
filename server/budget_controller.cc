// The budget search (see budget_controller.h).
#include "server/budget_controller.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace orion::server {

TailEvidence BudgetController::Judge(const uint64_t* durations_ns, size_t n,
                                     uint64_t target_ns) const {
  TailEvidence e;
  const double room = limits_.headroom * static_cast<double>(target_ns);
  for (size_t i = 0; i < n; ++i) {
    ++e.samples;
    if (durations_ns[i] > target_ns) ++e.over_target;
    if (static_cast<double>(durations_ns[i]) > room) ++e.over_headroom;
  }
  return e;
}

BudgetVerdict BudgetController::Verdict(const TailEvidence& e) const {
  // One long period on its own is not a missed p99: more than 1% of them, and at least two.
  if (e.over_target >= 2 && e.over_target > e.samples / 100) return BudgetVerdict::kShrink;
  if (e.samples < limits_.min_samples_to_grow) return BudgetVerdict::kWait;
  return e.over_headroom <= e.samples / 100 ? BudgetVerdict::kGrow : BudgetVerdict::kHold;
}

BudgetVerdict BudgetController::Combine(BudgetVerdict a, BudgetVerdict b) {
  return std::max(a, b);
}

uint64_t BudgetController::Update(uint64_t budget, BudgetVerdict verdict) const {
  if (verdict == BudgetVerdict::kShrink) {
    budget = static_cast<uint64_t>(static_cast<double>(budget) * limits_.decrease);
  } else if (verdict == BudgetVerdict::kGrow) {
    budget += std::max(limits_.step_ns,
                       static_cast<uint64_t>(static_cast<double>(budget) * limits_.growth));
  }
  // Whole microseconds: what the admin API reports is what the board holds.
  return std::clamp(budget / 1000 * 1000, limits_.min_ns, limits_.max_ns);
}

uint64_t SizeBudgetToService(std::vector<uint64_t> periods, uint64_t current, uint64_t max_ns,
                             const ServiceSizing& sizing) {
  if (periods.size() < sizing.min_periods) return current;
  auto mid = periods.begin() + static_cast<std::ptrdiff_t>(periods.size() / 2);
  std::nth_element(periods.begin(), mid, periods.end());
  const double sized = sizing.fraction * static_cast<double>(*mid);
  const uint64_t next =
      std::clamp(static_cast<uint64_t>(sized) / 1000 * 1000, std::min(sizing.min_ns, max_ns),
                 max_ns);
  const double change = std::abs(static_cast<double>(next) - static_cast<double>(current));
  if (change <= sizing.hysteresis * static_cast<double>(current) && current <= max_ns) {
    return current;
  }
  return next;
}

}  // namespace orion::server
