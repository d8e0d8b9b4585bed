// The policy seam of the node's state: each GPU's gate knobs, where they start (the config), how
// the admin API changes them (checked here), and whether the budget search may move the
// best-effort budget. Pure values and functions, no locks, no proto types; NodeState keeps one
// GpuPolicy per GPU under its mutex and publishes the knobs on the board.
//
// Usage:
//   GpuPolicy p = InitialGpuPolicy(config.policy);
//   PolicyChange change;  change.be_budget_us = 200;
//   if (absl::Status s = ValidatePolicyChange(change); !s.ok()) ...;
//   if (ApplyPolicyChange(change, &p)) { /* budget or mode changed: restart the evidence */ }
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "server/board.h"
#include "server/config.h"

namespace orion::server {

struct GpuPolicy {
  GateKnobs knobs;
  // The budget was set (config, admin API) or adapted; otherwise it is the mode's default and
  // follows mode changes.
  bool budget_set = false;
  bool adapt_budget = true;  // the budget search may move the budget toward the latency target
};

GpuPolicy InitialGpuPolicy(const PolicyConfig& config);

// A change of some knobs on one GPU or all: unset fields stay as they are.
struct PolicyChange {
  bool all_gpus = false;  // every GPU, those that join the board later too
  uint32_t gpu = 0;       // otherwise this one
  std::optional<contract::GateMode> mode;
  std::optional<uint64_t> be_budget_us;
  std::optional<uint32_t> sm_threshold;
  std::optional<uint32_t> spin_us;
  std::optional<uint32_t> hp_stale_ms;
  std::optional<uint32_t> hp_grace_us;
  std::optional<bool> adapt_budget;
  std::optional<bool> gpu_hold;
  std::optional<uint32_t> gpu_hold_max_ms;
  std::optional<uint32_t> gpu_hold_release_ms;
};

// The ranges the gate can work with; the message names the field as the admin API does.
absl::Status ValidatePolicyChange(const PolicyChange& change);

// Applies a validated change. True when the budget or the mode changed, so the budget search's
// evidence no longer describes the GPU's knobs.
bool ApplyPolicyChange(const PolicyChange& change, GpuPolicy* policy);

}  // namespace orion::server
