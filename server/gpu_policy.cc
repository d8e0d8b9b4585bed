// Per-GPU gate knobs: start values, checked changes (gpu_policy.h).
#include "server/gpu_policy.h"

namespace orion::server {

GpuPolicy InitialGpuPolicy(const PolicyConfig& c) {
  GpuPolicy p;
  p.knobs.mode = c.mode;
  p.knobs.be_budget_ns = c.be_budget_us * 1000;
  p.budget_set = c.be_budget_set;
  p.knobs.sm_threshold = c.sm_threshold;
  p.knobs.spin_ns = c.spin_us * 1000;
  p.knobs.hp_stale_ns = static_cast<uint64_t>(c.hp_stale_ms) * 1000000;
  p.knobs.hp_grace_ns = static_cast<uint64_t>(c.hp_grace_us) * 1000;
  p.knobs.gpu_hold = c.gpu_hold;
  p.knobs.gpu_hold_max_ns = static_cast<uint64_t>(c.gpu_hold_max_ms) * 1000000;
  p.knobs.gpu_hold_release_ns = static_cast<uint64_t>(c.gpu_hold_release_ms) * 1000000;
  p.adapt_budget = c.adapt_budget;
  return p;
}

absl::Status ValidatePolicyChange(const PolicyChange& c) {
  if (c.be_budget_us && *c.be_budget_us > 1000000) {
    return absl::InvalidArgumentError("knobs.be_budget_us must be at most 1000000 (1 s)");
  }
  if (c.spin_us && *c.spin_us > 10000) {
    return absl::InvalidArgumentError("knobs.spin_us must be at most 10000");
  }
  if (c.hp_stale_ms && (*c.hp_stale_ms < 10 || *c.hp_stale_ms > 600000)) {
    return absl::InvalidArgumentError("knobs.hp_stale_ms must be in [10, 600000]");
  }
  if (c.hp_grace_us && *c.hp_grace_us > 100000) {
    return absl::InvalidArgumentError("knobs.hp_grace_us must be at most 100000 (100 ms)");
  }
  if (c.gpu_hold_max_ms && *c.gpu_hold_max_ms > contract::kMaxGpuHoldMaxNs / 1000000) {
    return absl::InvalidArgumentError("knobs.gpu_hold_max_ms must be at most 60000 (60 s)");
  }
  if (c.gpu_hold_release_ms && *c.gpu_hold_release_ms > contract::kMaxGpuHoldReleaseNs / 1000000) {
    return absl::InvalidArgumentError(
        "knobs.gpu_hold_release_ms must be at most 600000 (600 s)");
  }
  return absl::OkStatus();
}

bool ApplyPolicyChange(const PolicyChange& c, GpuPolicy* p) {
  if (c.mode) {
    p->knobs.mode = *c.mode;
    // A budget never set follows the mode's default; a set or adapted one stays.
    if (!c.be_budget_us && !p->budget_set) {
      p->knobs.be_budget_ns = DefaultBeBudgetUs(p->knobs.mode) * 1000;
    }
  }
  if (c.be_budget_us) {
    p->knobs.be_budget_ns = *c.be_budget_us * 1000;
    p->budget_set = true;
  }
  if (c.sm_threshold) p->knobs.sm_threshold = *c.sm_threshold;
  if (c.spin_us) p->knobs.spin_ns = *c.spin_us * 1000;
  if (c.hp_stale_ms) p->knobs.hp_stale_ns = static_cast<uint64_t>(*c.hp_stale_ms) * 1000000;
  if (c.hp_grace_us) p->knobs.hp_grace_ns = static_cast<uint64_t>(*c.hp_grace_us) * 1000;
  if (c.adapt_budget) p->adapt_budget = *c.adapt_budget;
  if (c.gpu_hold) p->knobs.gpu_hold = *c.gpu_hold;
  if (c.gpu_hold_max_ms) {
    p->knobs.gpu_hold_max_ns = static_cast<uint64_t>(*c.gpu_hold_max_ms) * 1000000;
  }
  if (c.gpu_hold_release_ms) {
    p->knobs.gpu_hold_release_ns = static_cast<uint64_t>(*c.gpu_hold_release_ms) * 1000000;
  }
  // adapt_budget=true without a budget hands the budget back to the server: it starts again
  // from the mode's default and follows the service.
  if (c.adapt_budget && *c.adapt_budget && !c.be_budget_us) {
    p->budget_set = false;
    p->knobs.be_budget_ns = DefaultBeBudgetUs(p->knobs.mode) * 1000;
    return true;
  }
  return c.be_budget_us.has_value() || c.mode.has_value();
}

}  // namespace orion::server
