// A test kubelet's pod resources API (the kubelet's v1 PodResourcesLister, served over real
// gRPC by the tests): what it allocated to each pod, which orion-agent reads to tell the server
// each pod's GPUs. A test double, named as such: the real one is the kubelet's.
#pragma once

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "podresources/v1/api.grpc.pb.h"

namespace orion::agent::test_doubles {

class TestPodResources final : public ::v1::PodResourcesLister::Service {
 public:
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    *out = list_;
    return grpc::Status::OK;
  }
  void Set(const ::v1::ListPodResourcesResponse& list) {
    std::lock_guard<std::mutex> lock(mu_);
    list_ = list;
  }

 private:
  std::mutex mu_;
  ::v1::ListPodResourcesResponse list_;
};

}  // namespace orion::agent::test_doubles
