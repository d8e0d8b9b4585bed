// orion.v1.Admin and orion.v1.AgentSync over NodeState (see admin_service.h).
#include "server/admin_service.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/admin_mapping.h"

namespace orion::server {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// Finishes with the error, or with the view mapped into the response.
template <typename View, typename Message>
grpc::ServerUnaryReactor* DoneWith(grpc::CallbackServerContext* ctx,
                                   const absl::StatusOr<View>& result, Message* resp) {
  if (!result.ok()) return Done(ctx, ToGrpc(result.status()));
  ToProto(*result, resp);
  return Done(ctx, grpc::Status::OK);
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::StatusOr<AdminCaller> AdminServiceImpl::Admit(grpc::CallbackServerContext* ctx,
                                                    AdminRole role, const char* method,
                                                    const google::protobuf::Message& request) {
  absl::string_view header;
  const auto& metadata = ctx->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    header = absl::string_view(it->second.data(), it->second.size());
  }
  // The common name of a client certificate the TLS handshake verified (none without one).
  std::string certificate_name;
  if (const auto auth_context = ctx->auth_context(); auth_context != nullptr) {
    const auto names = auth_context->FindPropertyValues("x509_common_name");
    if (!names.empty()) certificate_name.assign(names.front().data(), names.front().size());
  }
  absl::StatusOr<AdminCaller> caller = auth_->Authorize(header, certificate_name, role);
  if (role == AdminRole::kOperator) {
    const std::string who =
        caller.ok() ? absl::StrCat(caller->name, " (", AdminRoleName(caller->role), ")")
                    : absl::StrCat("refused: ", caller.status().message());
    std::fprintf(stderr, "orion-server: audit: %s by %s from %s: %s\n", method, who.c_str(),
                 ctx->peer().c_str(), request.ShortDebugString().c_str());
  }
  return caller;
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListGpus(grpc::CallbackServerContext* ctx,
                                                     const orion::v1::ListGpusRequest* req,
                                                     orion::v1::ListGpusResponse* resp) {
  if (auto caller = Admit(ctx, AdminRole::kReader, "ListGpus", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  for (const GpuView& g : state_->ListGpus()) ToProto(g, resp->add_gpus());
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListClients(grpc::CallbackServerContext* ctx,
                                                        const orion::v1::ListClientsRequest* req,
                                                        orion::v1::ListClientsResponse* resp) {
  if (auto caller = Admit(ctx, AdminRole::kReader, "ListClients", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  for (const ClientView& c : state_->ListClients(FilterFromProto(*req))) {
    ToProto(c, resp->add_clients());
  }
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetClient(grpc::CallbackServerContext* ctx,
                                                      const orion::v1::GetClientRequest* req,
                                                      orion::v1::Client* resp) {
  if (auto caller = Admit(ctx, AdminRole::kReader, "GetClient", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx, state_->GetClient(req->client_id()), resp);
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetPriority(grpc::CallbackServerContext* ctx,
                                                        const orion::v1::SetPriorityRequest* req,
                                                        orion::v1::SetPriorityResponse* resp) {
  if (auto caller = Admit(ctx, AdminRole::kOperator, "SetPriority", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  const absl::StatusOr<contract::Priority> priority = PriorityFromProto(req->priority(), "priority");
  if (!priority.ok()) return Done(ctx, ToGrpc(priority.status()));
  absl::StatusOr<std::vector<ClientView>> changed;
  switch (req->target_case()) {
    case orion::v1::SetPriorityRequest::kClientId: {
      absl::StatusOr<ClientView> one = state_->SetClientPriority(req->client_id(), *priority);
      if (one.ok()) changed = std::vector<ClientView>{*std::move(one)};
      else changed = one.status();
      break;
    }
    case orion::v1::SetPriorityRequest::kPodUid:
      changed = state_->SetPodPriority(req->pod_uid(), *priority);
      break;
    case orion::v1::SetPriorityRequest::kJob:
      changed = state_->SetJobPriority(req->job(), *priority);
      break;
    default:
      changed = absl::InvalidArgumentError("set one of client_id, pod_uid or job");
  }
  if (!changed.ok()) return Done(ctx, ToGrpc(changed.status()));
  for (const ClientView& c : *changed) ToProto(c, resp->add_clients());
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                     const orion::v1::ListJobsRequest* req,
                                                     orion::v1::ListJobsResponse* resp) {
  if (auto caller = Admit(ctx, AdminRole::kReader, "ListJobs", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  for (const JobView& j : state_->ListJobs(req->namespace_())) ToProto(j, resp->add_jobs());
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AdminServiceImpl::PauseJob(grpc::CallbackServerContext* ctx,
                                                     const orion::v1::JobRequest* req,
                                                     orion::v1::Job* resp) {
  if (auto caller = Admit(ctx, AdminRole::kOperator, "PauseJob", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx, state_->SetJobPaused(req->job(), true), resp);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ResumeJob(grpc::CallbackServerContext* ctx,
                                                      const orion::v1::JobRequest* req,
                                                      orion::v1::Job* resp) {
  if (auto caller = Admit(ctx, AdminRole::kOperator, "ResumeJob", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx, state_->SetJobPaused(req->job(), false), resp);
}

grpc::ServerUnaryReactor* AdminServiceImpl::PauseClient(grpc::CallbackServerContext* ctx,
                                                        const orion::v1::PauseRequest* req,
                                                        orion::v1::Client* resp) {
  if (auto caller = Admit(ctx, AdminRole::kOperator, "PauseClient", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx, state_->SetPaused(req->client_id(), true), resp);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ResumeClient(grpc::CallbackServerContext* ctx,
                                                         const orion::v1::ResumeRequest* req,
                                                         orion::v1::Client* resp) {
  if (auto caller = Admit(ctx, AdminRole::kOperator, "ResumeClient", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx, state_->SetPaused(req->client_id(), false), resp);
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetPolicy(grpc::CallbackServerContext* ctx,
                                                      const orion::v1::GetPolicyRequest* req,
                                                      orion::v1::PolicyKnobs* resp) {
  if (auto caller = Admit(ctx, AdminRole::kReader, "GetPolicy", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx, state_->GetPolicy(req->gpu()), resp);
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetPolicy(grpc::CallbackServerContext* ctx,
                                                      const orion::v1::SetPolicyRequest* req,
                                                      orion::v1::PolicyKnobs* resp) {
  if (auto caller = Admit(ctx, AdminRole::kOperator, "SetPolicy", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  const absl::StatusOr<PolicyChange> change = PolicyChangeFromProto(*req);
  if (!change.ok()) return Done(ctx, ToGrpc(change.status()));
  return DoneWith(ctx, state_->SetPolicy(*change), resp);
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetTimeline(grpc::CallbackServerContext* ctx,
                                                        const orion::v1::TimelineRequest* req,
                                                        orion::v1::TimelineResponse* resp) {
  if (auto caller = Admit(ctx, AdminRole::kReader, "GetTimeline", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx,
                  state_->TimelineWindow(req->gpu(), req->since_unix_ms(), req->until_unix_ms(),
                                         req->max_spans()),
                  resp);
}

grpc::ServerUnaryReactor* AdminServiceImpl::GetKernelProfile(
    grpc::CallbackServerContext* ctx, const orion::v1::KernelProfileRequest* req,
    orion::v1::KernelProfileResponse* resp) {
  if (auto caller = Admit(ctx, AdminRole::kReader, "GetKernelProfile", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx, state_->GetKernelProfile(req->client_id()), resp);
}

namespace {

// One StreamTimeline call. Its thread does the blocking work (waiting for a write to finish, for
// new spans); gRPC's callbacks only signal it. Deletes itself in OnDone, after the thread ended.
class TimelineStreamer final : public grpc::ServerWriteReactor<orion::v1::TimelineChunk> {
 public:
  TimelineStreamer(NodeState* state, orion::v1::StreamTimelineRequest request)
      : state_(state), request_(std::move(request)) {
    thread_ = std::thread([this] { Run(); });
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) stop_ = true;  // the caller went away
    cv_.notify_all();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  void OnDone() override {
    // OnDone runs after Finish; should gRPC run it on the streaming thread itself, detach.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    delete this;
  }

 private:
  void Run() {
    uint64_t cursor = request_.cursor();
    grpc::Status status = grpc::Status::OK;
    for (;;) {
      const absl::StatusOr<TimelineView> view =
          state_->TimelineAfter(request_.gpu(), cursor, request_.max_spans_per_message());
      if (!view.ok()) {
        status = ToGrpc(view.status());
        break;
      }
      const bool fresh = !view->spans.empty() || view->lost > 0;
      cursor = view->cursor;
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) break;
      if (fresh) {
        chunk_.Clear();
        ToProto(*view, &chunk_);
        writing_ = true;
        StartWrite(&chunk_);
        cv_.wait(lock, [this] { return !writing_; });
        if (stop_) break;
        continue;  // more may be waiting
      }
      if (!request_.follow()) break;
      cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; });
      if (stop_) break;
    }
    Finish(status);
  }

  NodeState* state_;
  const orion::v1::StreamTimelineRequest request_;
  orion::v1::TimelineChunk chunk_;  // the message being written (must outlive StartWrite)
  std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace

grpc::ServerWriteReactor<orion::v1::TimelineChunk>* AdminServiceImpl::StreamTimeline(
    grpc::CallbackServerContext* ctx, const orion::v1::StreamTimelineRequest* req) {
  if (auto caller = Admit(ctx, AdminRole::kReader, "StreamTimeline", *req); !caller.ok()) {
    class Refused final : public grpc::ServerWriteReactor<orion::v1::TimelineChunk> {
     public:
      explicit Refused(grpc::Status s) { Finish(std::move(s)); }
      void OnDone() override { delete this; }
    };
    return new Refused(ToGrpc(caller.status()));
  }
  return new TimelineStreamer(state_, *req);
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetRecording(grpc::CallbackServerContext* ctx,
                                                         const orion::v1::RecordingRequest* req,
                                                         orion::v1::RecordingState* resp) {
  if (auto caller = Admit(ctx, AdminRole::kOperator, "SetRecording", *req); !caller.ok()) {
    return Done(ctx, ToGrpc(caller.status()));
  }
  return DoneWith(ctx, state_->SetRecording(RecordingFromProto(*req)), resp);
}

grpc::ServerUnaryReactor* AgentSyncServiceImpl::UpsertPods(grpc::CallbackServerContext* ctx,
                                                           const orion::v1::UpsertPodsRequest* req,
                                                           orion::v1::UpsertPodsResponse* resp) {
  absl::StatusOr<std::vector<PodPolicy>> pods = PodsFromProto(*req);
  if (!pods.ok()) return Done(ctx, ToGrpc(pods.status()));
  return DoneWith(ctx, state_->UpsertPods(*std::move(pods), req->full_sync()), resp);
}

grpc::ServerUnaryReactor* AgentSyncServiceImpl::DeletePod(grpc::CallbackServerContext* ctx,
                                                          const orion::v1::DeletePodRequest* req,
                                                          orion::v1::DeletePodResponse*) {
  return Done(ctx, ToGrpc(state_->DeletePod(req->pod_uid())));
}

grpc::ServerUnaryReactor* AgentSyncServiceImpl::ListGpuLoad(grpc::CallbackServerContext* ctx,
                                                            const orion::v1::ListGpuLoadRequest*,
                                                            orion::v1::ListGpuLoadResponse* resp) {
  for (const GpuView& g : state_->ListGpus()) ToProto(g, resp->add_gpus());
  return Done(ctx, grpc::Status::OK);
}

}  // namespace orion::server
