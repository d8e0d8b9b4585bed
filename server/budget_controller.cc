// AIMD budget search (see budget_controller.h).
#include "server/budget_controller.h"

#include <algorithm>

namespace orion::server {

uint64_t BudgetController::Update(uint64_t budget, uint64_t p99, uint64_t target,
                                  uint32_t samples) const {
  if (target == 0 || samples < limits_.min_samples) return std::clamp(budget, limits_.min_ns,
                                                                       limits_.max_ns);
  if (p99 > target) {
    budget = static_cast<uint64_t>(static_cast<double>(budget) * limits_.decrease);
  } else if (static_cast<double>(p99) < limits_.headroom * static_cast<double>(target)) {
    budget += limits_.step_ns;
  }
  return std::clamp(budget, limits_.min_ns, limits_.max_ns);
}

}  // namespace orion::server
