// Pod policies with the settings of their prepared DRA claims (see claim_policy_sink.h).
#include "agent/claim_policy_sink.h"

namespace orion::agent {

orion::v1::PodPolicy ClaimPolicySink::WithClaims(
    orion::v1::PodPolicy p, const std::map<std::string, ClaimPodPolicy>& claims) {
  auto it = claims.find(p.pod_uid());
  if (it == claims.end()) return p;
  const PodSettings& s = it->second.settings;
  p.set_priority(s.priority == PodPriority::kHigh ? orion::v1::PRIORITY_HIGH
                                                  : orion::v1::PRIORITY_BEST_EFFORT);
  p.set_memory_limit_bytes(s.memory_limit_bytes);
  p.set_latency_target_us(s.latency_target_us);
  p.clear_gpu_uuids();
  for (const std::string& g : it->second.gpu_uuids) p.add_gpu_uuids(g);
  // A claim's priority comes from its devices: a high claim's GPUs are its high devices'.
  p.clear_high_gpu_uuids();
  if (s.priority == PodPriority::kHigh) {
    for (const std::string& g : it->second.gpu_uuids) p.add_high_gpu_uuids(g);
  }
  return p;
}

absl::Status ClaimPolicySink::Upsert(const std::vector<orion::v1::PodPolicy>& pods,
                                     bool full_sync) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto claims = policies_();
  std::vector<orion::v1::PodPolicy> out;
  out.reserve(pods.size());
  for (const orion::v1::PodPolicy& p : pods) out.push_back(WithClaims(p, claims));
  absl::Status s = inner_->Upsert(out, full_sync);
  if (!s.ok()) return s;
  if (full_sync) {
    received_.clear();
    sent_.clear();
  }
  for (size_t i = 0; i < pods.size(); ++i) {
    received_[pods[i].pod_uid()] = pods[i];
    sent_[pods[i].pod_uid()] = out[i].SerializeAsString();
  }
  return s;
}

absl::Status ClaimPolicySink::Delete(const std::string& pod_uid) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = inner_->Delete(pod_uid);
  if (s.ok()) {
    received_.erase(pod_uid);
    sent_.erase(pod_uid);
  }
  return s;
}

absl::StatusOr<int> ClaimPolicySink::Refresh() {
  std::lock_guard<std::mutex> lock(mu_);
  if (received_.empty()) return 0;
  const auto claims = policies_();
  std::vector<orion::v1::PodPolicy> changed;
  for (const auto& [uid, p] : received_) {
    orion::v1::PodPolicy now = WithClaims(p, claims);
    if (now.SerializeAsString() != sent_[uid]) changed.push_back(std::move(now));
  }
  if (changed.empty()) return 0;
  absl::Status s = inner_->Upsert(changed, /*full_sync=*/false);
  if (!s.ok()) return s;
  for (const orion::v1::PodPolicy& p : changed) sent_[p.pod_uid()] = p.SerializeAsString();
  return static_cast<int>(changed.size());
}

}  // namespace orion::agent
