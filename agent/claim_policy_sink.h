// Gives the pods of prepared DRA claims their claim's priority, limits and GPUs at orion-server:
// a PolicySink in front of the AgentSync client (after GpuAllocationSink) that replaces the
// settings the pod watcher read from annotations with those of the pod's claims (the claim's
// config replaces the annotations), and Refresh() sends a pod's policy again when its claims
// were prepared or unprepared after the pod was sent (the kubelet prepares a claim after the
// pod is scheduled, and so usually after the watcher has sent it, but before its containers
// start).
//
// Usage:
//   ClaimPolicySink sink(&agent_sync, [&] { return dra.PodPolicies(); });
//   dra.OnClaimsChanged([&] { (void)sink.Refresh(); });
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "agent/dra_plugin.h"
#include "agent/pod_watcher.h"

namespace orion::agent {

class ClaimPolicySink final : public PolicySink {
 public:
  using ClaimPolicies = std::function<std::map<std::string, ClaimPodPolicy>()>;
  ClaimPolicySink(PolicySink* inner, ClaimPolicies policies)
      : inner_(inner), policies_(std::move(policies)) {}

  absl::Status Upsert(const std::vector<orion::v1::PodPolicy>& pods, bool full_sync) override;
  absl::Status Delete(const std::string& pod_uid) override;
  absl::StatusOr<uint32_t> PodsKnown() override { return inner_->PodsKnown(); }

  // Sends again every pod whose policy with its claims differs from what was sent. Returns how
  // many were sent.
  absl::StatusOr<int> Refresh();

 private:
  static orion::v1::PodPolicy WithClaims(orion::v1::PodPolicy p,
                                         const std::map<std::string, ClaimPodPolicy>& claims);

  PolicySink* const inner_;
  const ClaimPolicies policies_;
  std::mutex mu_;  // held around each send, so Refresh never overtakes a newer update
  std::map<std::string, orion::v1::PodPolicy> received_ ABSL_GUARDED_BY(mu_);  // by pod UID
  std::map<std::string, std::string> sent_ ABSL_GUARDED_BY(mu_);  // serialized, by pod UID
};

}  // namespace orion::agent
