// PolicySink that sends pod policies to the node's orion-server over orion.v1.AgentSync.
//
// Usage:
//   AgentSyncClient sink("127.0.0.1:50051");
//   PodWatcher watcher(config, &api, &sink);
#pragma once

#include <memory>
#include <string>

#include "agent/pod_watcher.h"
#include "orion/v1/agent.grpc.pb.h"

namespace orion::agent {

class AgentSyncClient final : public PolicySink {
 public:
  // target: a gRPC target, "127.0.0.1:50051" or "unix:///path".
  explicit AgentSyncClient(const std::string& target);
  absl::Status Upsert(const std::vector<orion::v1::PodPolicy>& pods, bool full_sync) override;
  absl::Status Delete(const std::string& pod_uid) override;
  // An UpsertPods with no pods and no full sync: changes nothing, answers pods_known.
  absl::StatusOr<uint32_t> PodsKnown() override;
  // The server's GPUs with their busy seconds so far (for the device plugin's placement).
  absl::StatusOr<std::vector<orion::v1::Gpu>> ListGpuLoad();

 private:
  // One UpsertPods call; the answer's pods_known.
  absl::StatusOr<uint32_t> SendUpsert(const orion::v1::UpsertPodsRequest& request);
  std::unique_ptr<orion::v1::AgentSync::Stub> stub_;
};

}  // namespace orion::agent
