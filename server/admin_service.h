// gRPC adapters over NodeState: orion.v1.Admin (operators, orion-ctl, grpcurl) and
// orion.v1.AgentSync (orion-agent's pod policies). Thin: check the caller's token (AdminAuth:
// readers list and read, operators also change), validate, call NodeState, map absl codes to gRPC
// codes with the same message. Every call that changes something is logged with who made it.
#pragma once

#include <grpcpp/grpcpp.h>

#include "orion/v1/admin.grpc.pb.h"
#include "orion/v1/agent.grpc.pb.h"
#include "server/admin_auth.h"
#include "server/node_state.h"

namespace orion::server {

grpc::Status ToGrpc(const absl::Status& s);

class AdminServiceImpl final : public orion::v1::Admin::CallbackService {
 public:
  AdminServiceImpl(NodeState* state, const AdminAuth* auth) : state_(state), auth_(auth) {}

  grpc::ServerUnaryReactor* ListGpus(grpc::CallbackServerContext* ctx,
                                     const orion::v1::ListGpusRequest* req,
                                     orion::v1::ListGpusResponse* resp) override;
  grpc::ServerUnaryReactor* ListClients(grpc::CallbackServerContext* ctx,
                                        const orion::v1::ListClientsRequest* req,
                                        orion::v1::ListClientsResponse* resp) override;
  grpc::ServerUnaryReactor* GetClient(grpc::CallbackServerContext* ctx,
                                      const orion::v1::GetClientRequest* req,
                                      orion::v1::Client* resp) override;
  grpc::ServerUnaryReactor* SetPriority(grpc::CallbackServerContext* ctx,
                                        const orion::v1::SetPriorityRequest* req,
                                        orion::v1::SetPriorityResponse* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const orion::v1::ListJobsRequest* req,
                                     orion::v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* PauseJob(grpc::CallbackServerContext* ctx,
                                     const orion::v1::JobRequest* req,
                                     orion::v1::Job* resp) override;
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* ctx,
                                      const orion::v1::JobRequest* req,
                                      orion::v1::Job* resp) override;
  grpc::ServerUnaryReactor* PauseClient(grpc::CallbackServerContext* ctx,
                                        const orion::v1::PauseRequest* req,
                                        orion::v1::Client* resp) override;
  grpc::ServerUnaryReactor* ResumeClient(grpc::CallbackServerContext* ctx,
                                         const orion::v1::ResumeRequest* req,
                                         orion::v1::Client* resp) override;
  grpc::ServerUnaryReactor* GetPolicy(grpc::CallbackServerContext* ctx,
                                      const orion::v1::GetPolicyRequest* req,
                                      orion::v1::PolicyKnobs* resp) override;
  grpc::ServerUnaryReactor* SetPolicy(grpc::CallbackServerContext* ctx,
                                      const orion::v1::SetPolicyRequest* req,
                                      orion::v1::PolicyKnobs* resp) override;
  grpc::ServerUnaryReactor* GetTimeline(grpc::CallbackServerContext* ctx,
                                        const orion::v1::TimelineRequest* req,
                                        orion::v1::TimelineResponse* resp) override;
  grpc::ServerUnaryReactor* GetKernelProfile(grpc::CallbackServerContext* ctx,
                                             const orion::v1::KernelProfileRequest* req,
                                             orion::v1::KernelProfileResponse* resp) override;
  // Server streaming: a thread per open stream reads spans after the cursor and writes them one
  // message at a time; with follow it polls every 100 ms until the caller cancels.
  grpc::ServerWriteReactor<orion::v1::TimelineChunk>* StreamTimeline(
      grpc::CallbackServerContext* ctx, const orion::v1::StreamTimelineRequest* req) override;
  grpc::ServerUnaryReactor* SetRecording(grpc::CallbackServerContext* ctx,
                                         const orion::v1::RecordingRequest* req,
                                         orion::v1::RecordingState* resp) override;

 private:
  // The caller if its token allows `role`; logs operator calls (allowed or refused).
  absl::StatusOr<AdminCaller> Admit(grpc::CallbackServerContext* ctx, AdminRole role,
                                    const char* method, const google::protobuf::Message& request);

  NodeState* state_;
  const AdminAuth* auth_;
};

class AgentSyncServiceImpl final : public orion::v1::AgentSync::CallbackService {
 public:
  explicit AgentSyncServiceImpl(NodeState* state) : state_(state) {}
  grpc::ServerUnaryReactor* UpsertPods(grpc::CallbackServerContext* ctx,
                                       const orion::v1::UpsertPodsRequest* req,
                                       orion::v1::UpsertPodsResponse* resp) override;
  grpc::ServerUnaryReactor* DeletePod(grpc::CallbackServerContext* ctx,
                                      const orion::v1::DeletePodRequest* req,
                                      orion::v1::DeletePodResponse* resp) override;
  grpc::ServerUnaryReactor* ListGpuLoad(grpc::CallbackServerContext* ctx,
                                        const orion::v1::ListGpuLoadRequest* req,
                                        orion::v1::ListGpuLoadResponse* resp) override;

 private:
  NodeState* state_;
};

}  // namespace orion::server
