// AgentSync client (see agent_sync_client.h).
#include "agent/agent_sync_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace orion::agent {
namespace {

absl::Status ToStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("orion-server: ", s.error_message()));
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

// The server is on this node: a restarted one is reached again within 100 ms to 1 s, not after
// gRPC's default reconnect backoff (1 s, growing to 2 minutes).
std::shared_ptr<grpc::Channel> LocalChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

AgentSyncClient::AgentSyncClient(const std::string& target)
    : stub_(orion::v1::AgentSync::NewStub(LocalChannel(target))) {}

absl::Status AgentSyncClient::Upsert(const std::vector<orion::v1::PodPolicy>& pods,
                                     bool full_sync) {
  orion::v1::UpsertPodsRequest request;
  for (const auto& p : pods) *request.add_pods() = p;
  request.set_full_sync(full_sync);
  return SendUpsert(request).status();
}

absl::StatusOr<uint32_t> AgentSyncClient::PodsKnown() {
  return SendUpsert(orion::v1::UpsertPodsRequest());
}

absl::StatusOr<uint32_t> AgentSyncClient::SendUpsert(const orion::v1::UpsertPodsRequest& request) {
  orion::v1::UpsertPodsResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  absl::Status s = ToStatus(stub_->UpsertPods(&ctx, request, &response));
  if (!s.ok()) return s;
  return response.pods_known();
}

absl::StatusOr<std::vector<orion::v1::Gpu>> AgentSyncClient::ListGpuLoad() {
  orion::v1::ListGpuLoadResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  absl::Status s = ToStatus(stub_->ListGpuLoad(&ctx, orion::v1::ListGpuLoadRequest(), &response));
  if (!s.ok()) return s;
  return std::vector<orion::v1::Gpu>(response.gpus().begin(), response.gpus().end());
}

absl::Status AgentSyncClient::Delete(const std::string& pod_uid) {
  orion::v1::DeletePodRequest request;
  request.set_pod_uid(pod_uid);
  orion::v1::DeletePodResponse response;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return ToStatus(stub_->DeletePod(&ctx, request, &response));
}

}  // namespace orion::agent
