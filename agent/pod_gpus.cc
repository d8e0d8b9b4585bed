// The GPUs the device plugin allocated to each pod, added to the policies sent to orion-server
// (see pod_gpus.h).
#include "agent/pod_gpus.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <grpcpp/grpcpp.h>

#include "agent/share_allocation.h"

namespace orion::agent {

std::map<std::string, std::vector<std::string>> GpusByPod(
    const ::v1::ListPodResourcesResponse& list, const std::vector<std::string>& resource_names) {
  std::map<std::string, std::vector<std::string>> out;
  for (const ::v1::PodResources& pod : list.pod_resources()) {
    std::vector<std::string> gpus;
    for (const ::v1::ContainerResources& container : pod.containers()) {
      for (const ::v1::ContainerDevices& devices : container.devices()) {
        if (std::find(resource_names.begin(), resource_names.end(), devices.resource_name()) ==
            resource_names.end()) {
          continue;
        }
        for (const std::string& id : devices.device_ids()) {
          std::string gpu = GpuOfShare(id);
          if (!gpu.empty()) gpus.push_back(std::move(gpu));
        }
      }
    }
    if (gpus.empty()) continue;
    std::sort(gpus.begin(), gpus.end());
    gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
    out[pod.namespace_() + "/" + pod.name()] = std::move(gpus);
  }
  return out;
}

PodResourcesClient::PodResourcesClient(const std::string& socket_path)
    : socket_path_(socket_path),
      stub_(::v1::PodResourcesLister::NewStub(
          grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials()))) {}

absl::StatusOr<::v1::ListPodResourcesResponse> PodResourcesClient::List() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  ::v1::ListPodResourcesRequest request;
  ::v1::ListPodResourcesResponse response;
  const grpc::Status s = stub_->List(&ctx, request, &response);
  if (!s.ok()) {
    return absl::UnavailableError("the kubelet's pod resources API at " + socket_path_ +
                                  " answered: " + s.error_message());
  }
  return response;
}

GpuAllocationSink::GpuAllocationSink(PolicySink* inner, Lister list,
                                     std::vector<std::string> resource_names,
                                     std::string high_resource_name)
    : inner_(inner),
      list_(std::move(list)),
      resource_names_(std::move(resource_names)),
      high_resource_name_(std::move(high_resource_name)) {}

std::map<std::string, GpuAllocationSink::PodGpus> GpuAllocationSink::Allocations() {
  absl::StatusOr<::v1::ListPodResourcesResponse> list = list_();
  if (!list.ok()) {
    if (!list_failing_) {
      std::fprintf(stderr,
                   "orion-agent: %s; until it answers, pods are sent with the GPUs last "
                   "known for them, and pods not known yet without any (the server then allows "
                   "them every GPU of the node)\n",
                   std::string(list.status().message()).c_str());
    }
    list_failing_ = true;
    return last_;
  }
  if (list_failing_) std::fprintf(stderr, "orion-agent: the pod resources API answers again\n");
  list_failing_ = false;
  last_.clear();
  for (auto& [pod, gpus] : GpusByPod(*list, resource_names_)) last_[pod].all = std::move(gpus);
  if (!high_resource_name_.empty()) {
    for (auto& [pod, gpus] : GpusByPod(*list, {high_resource_name_})) {
      last_[pod].high = std::move(gpus);
    }
  }
  return last_;
}

void GpuAllocationSink::SetGpus(orion::v1::PodPolicy* p, const PodGpus& gpus) const {
  p->clear_gpu_uuids();
  for (const std::string& gpu : gpus.all) p->add_gpu_uuids(gpu);
  p->clear_high_gpu_uuids();
  const bool no_slots = high_resource_name_.empty() && p->priority() == orion::v1::PRIORITY_HIGH;
  for (const std::string& gpu : no_slots ? gpus.all : gpus.high) p->add_high_gpu_uuids(gpu);
}

absl::Status GpuAllocationSink::Upsert(const std::vector<orion::v1::PodPolicy>& pods,
                                       bool full_sync) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<orion::v1::PodPolicy> with_gpus = pods;
  if (!with_gpus.empty()) {
    const auto allocations = Allocations();
    for (orion::v1::PodPolicy& p : with_gpus) {
      auto it = allocations.find(Key(p));
      SetGpus(&p, it != allocations.end() ? it->second : PodGpus{});
    }
  }
  absl::Status s = inner_->Upsert(with_gpus, full_sync);
  if (!s.ok()) return s;
  if (full_sync) sent_.clear();
  for (const orion::v1::PodPolicy& p : with_gpus) sent_[p.pod_uid()] = p;
  return s;
}

absl::Status GpuAllocationSink::Delete(const std::string& pod_uid) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = inner_->Delete(pod_uid);
  if (s.ok()) sent_.erase(pod_uid);
  return s;
}

absl::StatusOr<int> GpuAllocationSink::Refresh() {
  std::lock_guard<std::mutex> lock(mu_);
  if (sent_.empty()) return 0;
  const auto allocations = Allocations();
  std::vector<orion::v1::PodPolicy> changed;
  for (const auto& [uid, p] : sent_) {
    auto it = allocations.find(Key(p));
    const PodGpus now = it == allocations.end() ? PodGpus{} : it->second;
    // A pod whose containers are gone keeps the GPUs it was sent: nothing of it can register.
    if (now.all.empty()) continue;
    orion::v1::PodPolicy updated = p;
    SetGpus(&updated, now);
    if (updated.SerializeAsString() == p.SerializeAsString()) continue;
    changed.push_back(std::move(updated));
  }
  if (changed.empty()) return 0;
  absl::Status s = inner_->Upsert(changed, /*full_sync=*/false);
  if (!s.ok()) return s;
  for (const orion::v1::PodPolicy& p : changed) sent_[p.pod_uid()] = p;
  return static_cast<int>(changed.size());
}

}  // namespace orion::agent
