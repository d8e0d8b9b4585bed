// Which GPUs the device plugin allocated to each pod, told to orion-server with the pod's policy
// so that the server refuses a registration from the pod naming any other GPU of the node.
//
// The kubelet says which devices each container got (its pod resources API, List); a share ID
// names its GPU (share_allocation.h). GpuAllocationSink is a PolicySink in front of the
// AgentSync client: it adds each pod's GPU UUIDs to the policies the pod watcher sends, and
// Refresh() (called periodically) sends a pod's policy again once its allocation is known or has
// changed (a pod is seen before its containers are created, and so before its allocation).
//
// Usage:
//   PodResourcesClient kubelet("/var/lib/kubelet/pod-resources/kubelet.sock");
//   GpuAllocationSink sink(&agent_sync, [&] { return kubelet.List(); },
//                          {"orion.io/gpu", "orion.io/gpu-high"});
//   PodWatcher watcher(config, &api, &sink);   ...   sink.Refresh();  // every second
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "agent/pod_watcher.h"
#include "podresources/v1/api.grpc.pb.h"

namespace orion::agent {

// "namespace/name" -> the GPU UUIDs (sorted, distinct) of the devices of `resource_names` the
// kubelet allocated to any container of the pod. Device IDs that are not our shares are skipped.
std::map<std::string, std::vector<std::string>> GpusByPod(
    const ::v1::ListPodResourcesResponse& list, const std::vector<std::string>& resource_names);

// The kubelet's pod resources socket, over gRPC (2 s deadline a call).
class PodResourcesClient {
 public:
  explicit PodResourcesClient(const std::string& socket_path);
  absl::StatusOr<::v1::ListPodResourcesResponse> List();

 private:
  std::string socket_path_;
  std::unique_ptr<::v1::PodResourcesLister::Stub> stub_;
};

class GpuAllocationSink final : public PolicySink {
 public:
  using Lister = std::function<absl::StatusOr<::v1::ListPodResourcesResponse>()>;
  // `resource_names`: the resources whose devices give a pod its GPUs; `high_resource_name`
  // (one of them): the high-priority slot's, whose GPUs go in high_gpu_uuids. Empty (the node
  // has no high-priority slots): a high-priority pod is high on all its GPUs.
  GpuAllocationSink(PolicySink* inner, Lister list, std::vector<std::string> resource_names,
                    std::string high_resource_name = "");

  absl::Status Upsert(const std::vector<orion::v1::PodPolicy>& pods, bool full_sync) override;
  absl::Status Delete(const std::string& pod_uid) override;
  absl::StatusOr<uint32_t> PodsKnown() override { return inner_->PodsKnown(); }

  // Lists the allocations again and sends the policy of every pod whose GPUs changed (those
  // learnt since, typically). Returns how many pods were sent.
  absl::StatusOr<int> Refresh();

 private:
  // A pod's GPUs, and those of them where it holds the high-priority slot.
  struct PodGpus {
    std::vector<std::string> all, high;
  };
  // The current allocations; on a kubelet error, the last ones (said once on stderr).
  std::map<std::string, PodGpus> Allocations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetGpus(orion::v1::PodPolicy* p, const PodGpus& gpus) const;
  static std::string Key(const orion::v1::PodPolicy& p) {
    return p.namespace_() + "/" + p.name();
  }

  PolicySink* const inner_;
  const Lister list_;
  const std::vector<std::string> resource_names_;
  const std::string high_resource_name_;
  std::mutex mu_;  // held around each send, so Refresh never overtakes a newer update
  std::map<std::string, orion::v1::PodPolicy> sent_ ABSL_GUARDED_BY(mu_);  // by pod UID
  std::map<std::string, PodGpus> last_ ABSL_GUARDED_BY(mu_);
  bool list_failing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace orion::agent
