// The admin API through a real gRPC channel: health, reflection listing (what grpcurl does),
// every RPC's happy path, and error codes with actionable messages.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <thread>
#include <atomic>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

#include "health_v1.pb.h"
#include "orion/v1/admin.grpc.pb.h"
#include "orion/v1/agent.grpc.pb.h"
#include "reflection_v1alpha.pb.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Priority;

class AdminApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    cfg_ = testing::TestConfig(dir_);
    server_ = testing::StartServer(cfg_);
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->admin_port()),
                                   grpc::InsecureChannelCredentials());
    admin_ = orion::v1::Admin::NewStub(channel_);
  }
  int Register(Priority p, int gpu, contract::RegisterReply* reply,
               testing::ClientMaps* maps = nullptr) {
    return testing::RegisterClient(cfg_.socket_path,
                                   testing::MakeRequest(cfg_.gpus[gpu].c_str(), p), reply, maps);
  }
  std::string dir_;
  ServerConfig cfg_;
  std::unique_ptr<OrionServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<orion::v1::Admin::Stub> admin_;
};

TEST_F(AdminApiTest, HealthServiceServes) {
  // The standard method path, as grpc_health_probe and kubelet gRPC probes call it.
  const grpc::internal::RpcMethod check("/grpc.health.v1.Health/Check",
                                        grpc::internal::RpcMethod::NORMAL_RPC, channel_);
  grpc::ClientContext ctx;
  orion::test::wire::HealthCheckRequest req;
  orion::test::wire::HealthCheckResponse resp;
  ASSERT_TRUE((grpc::internal::BlockingUnaryCall<orion::test::wire::HealthCheckRequest,
                                                 orion::test::wire::HealthCheckResponse>(
                   channel_.get(), check, &ctx, req, &resp))
                  .ok());
  EXPECT_EQ(resp.status(), orion::test::wire::HealthCheckResponse::SERVING);
}

TEST_F(AdminApiTest, ReflectionListsAndDescribesTheServices) {
  using Req = orion::test::wire::ServerReflectionRequest;
  using Resp = orion::test::wire::ServerReflectionResponse;
  const grpc::internal::RpcMethod info(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING, channel_);
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<Req, Resp>> stream(
      grpc::internal::ClientReaderWriterFactory<Req, Resp>::Create(channel_.get(), info, &ctx));
  Req req;
  req.set_list_services("");
  ASSERT_TRUE(stream->Write(req));
  Resp resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  for (const char* want : {"orion.v1.Admin", "grpc.health.v1.Health",
                           "grpc.reflection.v1alpha.ServerReflection"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  // AgentSync lives on the agent's Unix socket only.
  EXPECT_EQ(std::find(names.begin(), names.end(), "orion.v1.AgentSync"), names.end());
  // `grpcurl describe orion.v1.Admin` fetches the file that defines the symbol.
  req.set_file_containing_symbol("orion.v1.Admin");
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_GT(resp.file_descriptor_response().file_descriptor_proto_size(), 0);
  EXPECT_NE(resp.file_descriptor_response().file_descriptor_proto(0).find("SetPriority"),
            std::string::npos);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(AdminApiTest, ListGetPriorityPauseResume) {
  contract::RegisterReply reply{};
  const int fd = Register(Priority::kBestEffort, 0, &reply);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(reply.status, 0u);

  grpc::ClientContext c1;
  orion::v1::ListGpusResponse gpus;
  ASSERT_TRUE(admin_->ListGpus(&c1, {}, &gpus).ok());
  ASSERT_EQ(gpus.gpus_size(), 2);
  EXPECT_EQ(gpus.gpus(0).clients(), 1u);
  EXPECT_EQ(gpus.gpus(0).node(), "test-node");

  grpc::ClientContext c2;
  orion::v1::SetPriorityRequest sp;
  sp.set_client_id(reply.client_id);
  sp.set_priority(orion::v1::PRIORITY_HIGH);
  orion::v1::SetPriorityResponse spr;
  ASSERT_TRUE(admin_->SetPriority(&c2, sp, &spr).ok());
  ASSERT_EQ(spr.clients_size(), 1);
  EXPECT_EQ(spr.clients(0).priority(), orion::v1::PRIORITY_HIGH);
  EXPECT_EQ(spr.clients(0).priority_source(), "admin");
  // The interposer sees the change on the board at its next launch.
  const auto& slot = server_->state().board().board().slots[reply.slot];
  EXPECT_EQ(slot.priority.load(), static_cast<uint32_t>(Priority::kHigh));

  grpc::ClientContext c3;
  orion::v1::PauseRequest pr;
  pr.set_client_id(reply.client_id);
  orion::v1::Client paused;
  ASSERT_TRUE(admin_->PauseClient(&c3, pr, &paused).ok());
  EXPECT_TRUE(paused.paused());
  EXPECT_EQ(slot.paused.load(), 1u);
  grpc::ClientContext c4;
  orion::v1::ResumeRequest rr;
  rr.set_client_id(reply.client_id);
  ASSERT_TRUE(admin_->ResumeClient(&c4, rr, &paused).ok());
  EXPECT_FALSE(paused.paused());
  EXPECT_EQ(slot.paused.load(), 0u);

  grpc::ClientContext c5;
  orion::v1::GetClientRequest gc;
  gc.set_client_id(reply.client_id);
  orion::v1::Client got;
  ASSERT_TRUE(admin_->GetClient(&c5, gc, &got).ok());
  EXPECT_EQ(got.host_pid(), static_cast<uint32_t>(getpid()));
  close(fd);
}

TEST_F(AdminApiTest, ErrorsUseTheRightCodesAndSayWhatToDo) {
  grpc::ClientContext c1;
  orion::v1::GetClientRequest gc;
  gc.set_client_id(4242);
  orion::v1::Client got;
  auto s = admin_->GetClient(&c1, gc, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("4242"), std::string::npos);

  grpc::ClientContext c2;
  orion::v1::SetPriorityRequest sp;  // neither target nor priority
  orion::v1::SetPriorityResponse spr;
  s = admin_->SetPriority(&c2, sp, &spr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext c3;
  orion::v1::SetPolicyRequest pol;
  pol.add_fields("be_budget");
  orion::v1::PolicyKnobs knobs;
  s = admin_->SetPolicy(&c3, pol, &knobs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("unknown field 'be_budget'"), std::string::npos);

  grpc::ClientContext c4;
  orion::v1::GetPolicyRequest gp;
  gp.set_gpu(9);
  s = admin_->GetPolicy(&c4, gp, &knobs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("ListGpus"), std::string::npos);

  grpc::ClientContext c5;
  orion::v1::TimelineRequest tr;
  tr.set_since_unix_ms(2000);
  tr.set_until_unix_ms(1000);
  orion::v1::TimelineResponse tl;
  s = admin_->GetTimeline(&c5, tr, &tl);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Times whose nanoseconds do not fit an int64 are refused, naming the field (they overflowed).
  for (int64_t ms : {INT64_MAX / 1000, int64_t{-1}}) {
    grpc::ClientContext c6;
    orion::v1::TimelineRequest far;
    far.set_since_unix_ms(ms);
    s = admin_->GetTimeline(&c6, far, &tl);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ms;
    EXPECT_NE(s.error_message().find("since_unix_ms must be in [0, "), std::string::npos)
        << s.error_message();
  }
}

TEST_F(AdminApiTest, SetPolicyReachesTheBoard) {
  grpc::ClientContext ctx;
  orion::v1::SetPolicyRequest pol;
  pol.set_gpu(1);
  pol.add_fields("be_budget_us");
  pol.add_fields("mode");
  pol.add_fields("gpu_hold_release_ms");
  pol.mutable_knobs()->set_be_budget_us(123);
  pol.mutable_knobs()->set_mode(orion::v1::GATE_MODE_PASS_THROUGH);
  pol.mutable_knobs()->set_gpu_hold_release_ms(4500);
  orion::v1::PolicyKnobs knobs;
  ASSERT_TRUE(admin_->SetPolicy(&ctx, pol, &knobs).ok());
  EXPECT_EQ(knobs.be_budget_us(), 123u);
  EXPECT_EQ(knobs.gpu_hold_release_ms(), 4500u);
  EXPECT_EQ(knobs.spin_us(), 20u);  // untouched field keeps its value
  const auto& g = server_->state().board().board().gpus[1];
  EXPECT_EQ(g.be_budget_ns.load(), 123000u);
  EXPECT_EQ(g.gpu_hold_release_ns.load(), 4'500'000'000u);
  EXPECT_EQ(g.mode.load(), static_cast<uint32_t>(contract::GateMode::kPassThrough));
  EXPECT_EQ(server_->state().board().board().gpus[0].be_budget_ns.load(), 500000u);
  EXPECT_EQ(server_->state().board().board().gpus[0].gpu_hold_release_ns.load(),
            contract::kDefaultGpuHoldReleaseNs);
}

TEST_F(AdminApiTest, ModeChangeMovesADefaultBudgetButKeepsASetOne) {
  auto set = [&](uint32_t gpu, orion::v1::GateMode mode, int64_t budget_us) {
    grpc::ClientContext ctx;
    orion::v1::SetPolicyRequest pol;
    pol.set_gpu(gpu);
    pol.add_fields("mode");
    pol.mutable_knobs()->set_mode(mode);
    if (budget_us >= 0) {
      pol.add_fields("be_budget_us");
      pol.mutable_knobs()->set_be_budget_us(static_cast<uint64_t>(budget_us));
    }
    orion::v1::PolicyKnobs knobs;
    EXPECT_TRUE(admin_->SetPolicy(&ctx, pol, &knobs).ok());
    return knobs.be_budget_us();
  };
  // GPU 0 still has priority mode's default budget: it follows the mode both ways.
  EXPECT_EQ(set(0, orion::v1::GATE_MODE_MPS, -1), 5000u);
  EXPECT_EQ(server_->state().board().board().gpus[0].be_budget_ns.load(), 5'000'000u);
  EXPECT_EQ(set(0, orion::v1::GATE_MODE_PRIORITY, -1), 500u);
  // GPU 1's budget was set: a mode change leaves it alone.
  EXPECT_EQ(set(1, orion::v1::GATE_MODE_PRIORITY, 800), 800u);
  EXPECT_EQ(set(1, orion::v1::GATE_MODE_MPS, -1), 800u);
  // A budget set to the other mode's default is still a set budget.
  EXPECT_EQ(set(0, orion::v1::GATE_MODE_MPS, 500), 500u);
  EXPECT_EQ(set(0, orion::v1::GATE_MODE_PRIORITY, -1), 500u);
  EXPECT_EQ(set(0, orion::v1::GATE_MODE_MPS, -1), 500u);
  // Both in one request: the request's budget wins.
  EXPECT_EQ(set(0, orion::v1::GATE_MODE_MPS, 900), 900u);
}

// StreamTimeline: all spans after a cursor in arrival order, then, with follow, new ones as they
// are drained, until the caller cancels. SetRecording: spans outside the window are not kept.
TEST_F(AdminApiTest, StreamTimelineFollowsLiveSpansAndRecordingWindowFilters) {
  contract::RegisterReply reply{};
  testing::ClientMaps maps;
  const int fd = Register(Priority::kHigh, 0, &reply, &maps);
  ASSERT_GE(fd, 0);
  ASSERT_NE(maps.area, nullptr);
  auto& ring = maps.area->ring;
  uint64_t pushed = 0;
  auto launch = [&] {
    contract::Event e{};
    e.kind = contract::EventKind::kLaunch;
    e.func = 0x100 + pushed;
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e.cpu_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
    ASSERT_TRUE(ring.TryPush(e));
    ++pushed;
  };
  for (int i = 0; i < 3; ++i) launch();
  ASSERT_TRUE(testing::WaitFor([&] { return ring.tail.load() == pushed; }));

  // Everything so far, then the stream ends (no follow).
  orion::v1::StreamTimelineRequest req;
  req.set_gpu(0);
  req.set_max_spans_per_message(2);
  grpc::ClientContext c1;
  auto reader = admin_->StreamTimeline(&c1, req);
  orion::v1::TimelineChunk chunk;
  int spans = 0, messages = 0;
  uint64_t cursor = 0;
  while (reader->Read(&chunk)) {
    spans += chunk.spans_size();
    ++messages;
    cursor = chunk.cursor();
    EXPECT_EQ(chunk.lost(), 0u);
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(spans, 3);
  EXPECT_EQ(messages, 2);  // 2 + 1 with two per message
  EXPECT_EQ(cursor, 3u);

  // Follow from the cursor: new spans arrive while the stream is open.
  req.set_cursor(cursor);
  req.set_follow(true);
  grpc::ClientContext c2;
  auto follower = admin_->StreamTimeline(&c2, req);
  std::atomic<int> live{0};
  std::thread reading([&] {
    orion::v1::TimelineChunk c;
    while (follower->Read(&c)) live += c.spans_size();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  launch();
  launch();
  EXPECT_TRUE(testing::WaitFor([&] { return live.load() == 2; }));
  c2.TryCancel();
  reading.join();
  EXPECT_EQ(follower->Finish().error_code(), grpc::StatusCode::CANCELLED);

  // A recording window that starts in an hour: nothing new is kept.
  orion::v1::RecordingRequest window;
  window.set_all_gpus(true);
  window.set_from_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count() +
                          3'600'000);
  orion::v1::RecordingState state;
  grpc::ClientContext c3;
  ASSERT_TRUE(admin_->SetRecording(&c3, window, &state).ok());
  ASSERT_GE(state.gpus_size(), 1);
  EXPECT_EQ(state.gpus(0).spans_recorded(), 5u);
  launch();
  ASSERT_TRUE(testing::WaitFor([&] { return ring.tail.load() == pushed; }));
  grpc::ClientContext c4;
  req.set_cursor(5);
  req.set_follow(false);
  auto after = admin_->StreamTimeline(&c4, req);
  int kept = 0;
  while (after->Read(&chunk)) kept += chunk.spans_size();
  EXPECT_TRUE(after->Finish().ok());
  EXPECT_EQ(kept, 0);

  window.set_until_unix_ms(1);  // before from
  grpc::ClientContext c5;
  EXPECT_EQ(admin_->SetRecording(&c5, window, &state).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  req.set_gpu(9);
  grpc::ClientContext c6;
  auto none = admin_->StreamTimeline(&c6, req);
  while (none->Read(&chunk)) {
  }
  EXPECT_EQ(none->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  close(fd);
}

TEST_F(AdminApiTest, TimelineAndProfileFromDrainedEvents) {
  contract::RegisterReply reply{};
  testing::ClientMaps maps;
  const int fd = Register(Priority::kHigh, 0, &reply, &maps);
  ASSERT_GE(fd, 0);
  ASSERT_NE(maps.area, nullptr);
  auto& ring = maps.area->ring;
  contract::Event e{};
  e.kind = contract::EventKind::kKernelName;
  e.func = 0xabc;
  std::snprintf(e.name, sizeof(e.name), "ampere_sgemm_128x64_nn");
  ASSERT_TRUE(ring.TryPush(e));
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  e = {};
  e.kind = contract::EventKind::kLaunch;
  e.func = 0xabc;
  e.grid[0] = 108; e.grid[1] = 1; e.grid[2] = 1;
  e.block[0] = 256; e.block[1] = 1; e.block[2] = 1;
  const uint64_t t = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
  e.cpu_ns = t;
  e.flags = contract::kTimedLaunch;  // its span comes with its time
  ASSERT_TRUE(ring.TryPush(e));
  e.kind = contract::EventKind::kKernelTime;
  e.flags = contract::kOnHostClock;
  e.cpu_ns = t + 1000;  // the GPU started it 1 us after the launch
  e.duration_ns = 42000;
  ASSERT_TRUE(ring.TryPush(e));
  // An untimed launch of the same stream 2 us later: inferred, behind the measured one.
  e.kind = contract::EventKind::kLaunch;
  e.flags = 0;
  e.cpu_ns = t + 2000;
  e.duration_ns = 0;
  ASSERT_TRUE(ring.TryPush(e));
  ASSERT_TRUE(testing::WaitFor([&] { return ring.tail.load() == 4; }));

  grpc::ClientContext c1;
  orion::v1::TimelineRequest tr;
  tr.set_gpu(0);
  orion::v1::TimelineResponse tl;
  ASSERT_TRUE(admin_->GetTimeline(&c1, tr, &tl).ok());
  ASSERT_EQ(tl.spans_size(), 2);
  EXPECT_EQ(tl.spans(0).kind(), "kernel");
  EXPECT_EQ(tl.spans(0).name(), "ampere_sgemm_128x64_nn");
  EXPECT_EQ(tl.spans(0).priority(), orion::v1::PRIORITY_HIGH);
  EXPECT_TRUE(tl.spans(0).measured());
  EXPECT_EQ(tl.spans(0).duration_ns(), 42000u);
  EXPECT_FALSE(tl.spans(1).measured());
  EXPECT_EQ(tl.spans(1).start_unix_ns() - tl.spans(0).start_unix_ns(), 42000);
  EXPECT_EQ(tl.spans(1).duration_ns(), 42000u);  // the kernel's mean measured time

  grpc::ClientContext c2;
  orion::v1::KernelProfileRequest kr;
  kr.set_client_id(reply.client_id);
  orion::v1::KernelProfileResponse prof;
  ASSERT_TRUE(admin_->GetKernelProfile(&c2, kr, &prof).ok());
  ASSERT_EQ(prof.kernels_size(), 1);
  EXPECT_EQ(prof.kernels(0).max_blocks(), 108u);
  EXPECT_EQ(prof.kernels(0).kind(), "comp");
  EXPECT_DOUBLE_EQ(prof.kernels(0).mean_duration_us(), 42.0);
  EXPECT_NE(prof.orion_csv().find("ampere_sgemm_128x64_nn,1,0,108,42000"), std::string::npos)
      << prof.orion_csv();
  close(fd);
}

TEST_F(AdminApiTest, AgentSyncIsOnlyOnTheAgentSocket) {
  // Not on the admin port: whoever reaches the admin API cannot set pod priorities through it.
  auto over_tcp = orion::v1::AgentSync::NewStub(channel_);
  grpc::ClientContext c1;
  orion::v1::DeletePodRequest del;
  del.set_pod_uid("11111111-2222-3333-4444-555555555555");
  orion::v1::DeletePodResponse delr;
  EXPECT_EQ(over_tcp->DeletePod(&c1, del, &delr).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // The agent socket is for its owner only.
  struct stat st{};
  ASSERT_EQ(stat(cfg_.agent_socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(AdminApiTest, AgentPodPolicyAppliesToLiveAndFutureClients) {
  auto agent = orion::v1::AgentSync::NewStub(
      grpc::CreateChannel("unix:" + cfg_.agent_socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c1;
  orion::v1::UpsertPodsRequest up;
  auto* pod = up.add_pods();
  pod->set_pod_uid("short");
  pod->set_priority(orion::v1::PRIORITY_HIGH);
  orion::v1::UpsertPodsResponse upr;
  auto s = agent->UpsertPods(&c1, up, &upr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("pods[0].pod_uid 'short'"), std::string::npos);

  grpc::ClientContext c2;
  pod->set_pod_uid("0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab");
  pod->set_namespace_("ml");
  pod->set_name("resnet-serve-0");
  pod->set_memory_limit_bytes(8ull << 30);
  ASSERT_TRUE(agent->UpsertPods(&c2, up, &upr).ok());
  EXPECT_EQ(upr.pods_known(), 1u);

  // The agent's probe (no pods, no full sync) changes nothing and says how many pods are known.
  grpc::ClientContext probe;
  orion::v1::UpsertPodsRequest empty;
  ASSERT_TRUE(agent->UpsertPods(&probe, empty, &upr).ok());
  EXPECT_EQ(upr.pods_known(), 1u);
  EXPECT_EQ(upr.clients_updated(), 0u);

  grpc::ClientContext c3;
  orion::v1::DeletePodRequest del;
  del.set_pod_uid("11111111-2222-3333-4444-555555555555");
  orion::v1::DeletePodResponse delr;
  EXPECT_EQ(agent->DeletePod(&c3, del, &delr).error_code(), grpc::StatusCode::NOT_FOUND);
}

// With a tokens file: no token, no call; a reader reads but cannot change; an operator can; the
// health service stays open for probes.
class AdminAuthApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    cfg_ = testing::TestConfig(dir_);
    cfg_.admin_tokens_file = dir_ + "/tokens";
    std::ofstream(cfg_.admin_tokens_file) << "# who may call\n"
                                          << "operator alice op-0123456789abcdef\n"
                                          << "reader grafana rd-0123456789abcdef\n";
    server_ = testing::StartServer(cfg_);
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->admin_port()),
                                   grpc::InsecureChannelCredentials());
    admin_ = orion::v1::Admin::NewStub(channel_);
  }
  grpc::Status ListClients(const std::string& token) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    orion::v1::ListClientsResponse resp;
    return admin_->ListClients(&ctx, orion::v1::ListClientsRequest(), &resp);
  }
  grpc::Status SetBudget(const std::string& token, uint32_t budget_us) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    orion::v1::SetPolicyRequest req;
    req.set_gpu(0);
    req.mutable_knobs()->set_be_budget_us(budget_us);
    req.add_fields("be_budget_us");
    orion::v1::PolicyKnobs resp;
    return admin_->SetPolicy(&ctx, req, &resp);
  }
  uint64_t Budget() {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer rd-0123456789abcdef");
    orion::v1::GetPolicyRequest req;
    orion::v1::PolicyKnobs resp;
    EXPECT_TRUE(admin_->GetPolicy(&ctx, req, &resp).ok());
    return resp.be_budget_us();
  }
  std::string dir_;
  ServerConfig cfg_;
  std::unique_ptr<OrionServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<orion::v1::Admin::Stub> admin_;
};

TEST_F(AdminAuthApiTest, CallsWithoutAKnownTokenAreRefused) {
  grpc::Status none = ListClients("");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(none.error_message().find("authorization: Bearer"), std::string::npos);
  EXPECT_EQ(ListClients("not-a-token-of-this-server").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(SetBudget("", 123).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Health needs no token (kubelet probes).
  const grpc::internal::RpcMethod check("/grpc.health.v1.Health/Check",
                                        grpc::internal::RpcMethod::NORMAL_RPC, channel_);
  grpc::ClientContext ctx;
  orion::test::wire::HealthCheckRequest req;
  orion::test::wire::HealthCheckResponse resp;
  EXPECT_TRUE((grpc::internal::BlockingUnaryCall<orion::test::wire::HealthCheckRequest,
                                                 orion::test::wire::HealthCheckResponse>(
                   channel_.get(), check, &ctx, req, &resp))
                  .ok());
}

TEST_F(AdminAuthApiTest, ReadersReadAndOperatorsChange) {
  EXPECT_TRUE(ListClients("rd-0123456789abcdef").ok());
  EXPECT_TRUE(ListClients("op-0123456789abcdef").ok());
  const uint64_t before = Budget();
  grpc::Status reader = SetBudget("rd-0123456789abcdef", 123);
  EXPECT_EQ(reader.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(reader.error_message().find("grafana holds a reader token"), std::string::npos);
  EXPECT_EQ(Budget(), before);  // nothing changed
  EXPECT_TRUE(SetBudget("op-0123456789abcdef", 123).ok());
  EXPECT_EQ(Budget(), 123u);
}

}  // namespace
}  // namespace orion::server
