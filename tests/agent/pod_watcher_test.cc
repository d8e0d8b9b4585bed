// The pod watcher against a test API server replaying recorded API-server JSON (list, watch
// stream, 410 Gone, relist) and a real gRPC AgentSync server standing in for orion-server.
#include "agent/pod_watcher.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "agent/agent_sync_client.h"
#include "agent/json.h"
#include "grpcpp/grpcpp.h"
#include "orion/v1/agent.grpc.pb.h"
#include "tests/agent/test_api_server.h"
#include "tests/agent/testdata.h"

namespace orion::agent {
namespace {

using testing::ReadTestdata;
using testing::TestApiServer;

constexpr char kPodA[] = "5d3b2a1c-0f9e-4d8c-b7a6-951e2f3a4b5c";   // inference, high
constexpr char kPodB[] = "8c7b6a59-4e3d-4c2b-a190-8f7e6d5c4b3a";   // training, best-effort
constexpr char kPodC[] = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d";   // no annotations
constexpr char kPodE[] = "c0ffee00-1234-4abc-9def-0123456789ab";   // malformed annotations
constexpr char kPodF[] = "f00dbabe-aaaa-4bbb-8ccc-dddddddddddd";   // new after 410

// orion-server's AgentSync, recording what the agent sends.
class RecordingAgentSync final : public orion::v1::AgentSync::Service {
 public:
  struct Call {
    bool full_sync = false;
    std::vector<orion::v1::PodPolicy> pods;
    std::string deleted;  // DeletePod
  };

  grpc::Status UpsertPods(grpc::ServerContext*, const orion::v1::UpsertPodsRequest* request,
                          orion::v1::UpsertPodsResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    Call c;
    c.full_sync = request->full_sync();
    c.pods.assign(request->pods().begin(), request->pods().end());
    calls_.push_back(c);
    if (c.full_sync) known_.clear();
    for (const auto& p : c.pods) known_.insert(p.pod_uid());
    response->set_pods_known(static_cast<uint32_t>(known_.size()));
    cv_.notify_all();
    return grpc::Status::OK;
  }
  // What a restarted orion-server knows: nothing.
  void Restart() {
    std::lock_guard<std::mutex> lock(mu_);
    known_.clear();
  }
  grpc::Status DeletePod(grpc::ServerContext*, const orion::v1::DeletePodRequest* request,
                         orion::v1::DeletePodResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    known_.erase(request->pod_uid());
    Call c;
    c.deleted = request->pod_uid();
    calls_.push_back(c);
    cv_.notify_all();
    return grpc::Status::OK;
  }
  bool WaitForCalls(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return calls_.size() >= n; });
  }
  std::vector<Call> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
  std::set<std::string> known_;
};

const orion::v1::PodPolicy* FindPod(const std::vector<orion::v1::PodPolicy>& pods,
                                    const std::string& uid) {
  for (const auto& p : pods) {
    if (p.pod_uid() == uid) return &p;
  }
  return nullptr;
}

class PodWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&server_sync_);
    grpc_server_ = builder.BuildAndStart();
    ASSERT_NE(grpc_server_, nullptr);
    sink_ = std::make_unique<AgentSyncClient>("127.0.0.1:" + std::to_string(port));
    api_ = std::make_unique<kube::CurlKubeApi>(
        kube::KubeApiConfig{.base_url = api_server_.base_url()});
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    grpc_server_->Shutdown();
  }
  void StartWatcher() {
    watcher_ = std::make_unique<PodWatcher>(
        PodWatcherConfig{.node_name = "gpu-node-a", .retry_delay = std::chrono::milliseconds(50)},
        api_.get(), sink_.get());
    thread_ = std::thread([this] { watcher_->Run(&stop_); });
  }

  TestApiServer api_server_;
  RecordingAgentSync server_sync_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<AgentSyncClient> sink_;
  std::unique_ptr<kube::CurlKubeApi> api_;
  std::unique_ptr<PodWatcher> watcher_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(PodWatcherTest, ListWatchGoneRelist) {
  api_server_.AddList({200, ReadTestdata("pods-list.json")});
  api_server_.AddWatch({200, ReadTestdata("pods-watch.jsonl")});
  api_server_.AddWatch({200, ReadTestdata("pods-watch-410.jsonl")});
  api_server_.AddList({200, ReadTestdata("pods-list-after-410.json")});
  StartWatcher();

  // list -> full sync; watch: A changed, E added, B finished (forgotten once), B deleted
  // (already gone: no call), bookmark; 410 -> relist -> full sync.
  ASSERT_TRUE(server_sync_.WaitForCalls(5));
  auto calls = server_sync_.calls();

  ASSERT_TRUE(calls[0].full_sync);
  ASSERT_EQ(calls[0].pods.size(), 3u);
  const auto* a = FindPod(calls[0].pods, kPodA);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->priority(), orion::v1::PRIORITY_HIGH);
  EXPECT_EQ(a->memory_limit_bytes(), 8ull << 30);
  EXPECT_EQ(a->latency_target_us(), 10000u);
  EXPECT_EQ(a->namespace_(), "ml");
  EXPECT_EQ(a->name(), "resnet-inference-7d9c8b6f5d-x2x9q");
  EXPECT_EQ(FindPod(calls[0].pods, kPodB)->priority(), orion::v1::PRIORITY_BEST_EFFORT);
  EXPECT_EQ(FindPod(calls[0].pods, kPodB)->memory_limit_bytes(), 40ull << 30);
  EXPECT_EQ(FindPod(calls[0].pods, kPodC)->priority(), orion::v1::PRIORITY_BEST_EFFORT);

  // A changed annotation on a running pod takes effect.
  ASSERT_FALSE(calls[1].full_sync);
  ASSERT_EQ(calls[1].pods.size(), 1u);
  EXPECT_EQ(calls[1].pods[0].pod_uid(), kPodA);
  EXPECT_EQ(calls[1].pods[0].memory_limit_bytes(), 4ull << 30);

  // Malformed annotations: the pod keeps the defaults.
  ASSERT_EQ(calls[2].pods.size(), 1u);
  EXPECT_EQ(calls[2].pods[0].pod_uid(), kPodE);
  EXPECT_EQ(calls[2].pods[0].priority(), orion::v1::PRIORITY_BEST_EFFORT);
  EXPECT_EQ(calls[2].pods[0].memory_limit_bytes(), 0u);

  EXPECT_EQ(calls[3].deleted, kPodB);

  ASSERT_TRUE(calls[4].full_sync);
  ASSERT_EQ(calls[4].pods.size(), 3u);
  EXPECT_EQ(FindPod(calls[4].pods, kPodA)->priority(), orion::v1::PRIORITY_BEST_EFFORT);
  EXPECT_NE(FindPod(calls[4].pods, kPodF), nullptr);
  EXPECT_EQ(FindPod(calls[4].pods, kPodE), nullptr);
  EXPECT_TRUE(watcher_->Synced());
  EXPECT_EQ(watcher_->Lists(), 2);

  // Requests: node field selector, resourceVersion from the list, then from the bookmark.
  ASSERT_TRUE(api_server_.WaitFor([&] { return api_server_.num_watches_unlocked() >= 3; }));
  std::vector<std::string> watches;
  for (const std::string& r : api_server_.requests()) {
    if (r.find("watch=1") != std::string::npos) watches.push_back(r);
    if (r.rfind("GET /api/v1/pods", 0) == 0) {
      EXPECT_NE(r.find("fieldSelector=spec.nodeName%3Dgpu-node-a"), std::string::npos) << r;
    }
  }
  ASSERT_GE(watches.size(), 3u);
  EXPECT_NE(watches[0].find("resourceVersion=184467"), std::string::npos) << watches[0];
  EXPECT_NE(watches[0].find("allowWatchBookmarks=true"), std::string::npos);
  EXPECT_NE(watches[1].find("resourceVersion=184600"), std::string::npos) << watches[1];
  EXPECT_NE(watches[2].find("resourceVersion=185102"), std::string::npos) << watches[2];

  // One Warning Event per malformed annotation of pod E, not repeated on the relist.
  auto events = api_server_.posted_events();
  ASSERT_EQ(events.size(), 2u);
  absl::StatusOr<JsonValue> ev = ParseJson(events[0]);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(StringAt(*ev, {"kind"}), "Event");
  EXPECT_EQ(StringAt(*ev, {"type"}), "Warning");
  EXPECT_EQ(StringAt(*ev, {"reason"}), "InvalidOrionAnnotation");
  EXPECT_EQ(StringAt(*ev, {"involvedObject", "uid"}), kPodE);
  EXPECT_EQ(StringAt(*ev, {"involvedObject", "kind"}), "Pod");
  EXPECT_EQ(StringAt(*ev, {"metadata", "namespace"}), "ml");
  EXPECT_NE(StringAt(*ev, {"message"}).find("orion/priority=\"urgent\""), std::string::npos);
}

TEST_F(PodWatcherTest, HttpGoneOnWatchRelists) {
  api_server_.AddList({200, ReadTestdata("pods-list.json")});
  api_server_.AddWatch({410, ReadTestdata("status-410-gone.json")});
  api_server_.AddList({200, ReadTestdata("pods-list-after-410.json")});
  StartWatcher();
  ASSERT_TRUE(server_sync_.WaitForCalls(2));
  auto calls = server_sync_.calls();
  EXPECT_TRUE(calls[0].full_sync);
  EXPECT_TRUE(calls[1].full_sync);
  EXPECT_NE(FindPod(calls[1].pods, kPodF), nullptr);
}

// orion-server restarted (it knows no pods): the agent's periodic check finds it knows fewer pods
// than the node has and sends them all again; while it knows them all, the check sends nothing.
TEST_F(PodWatcherTest, RestartedServerGetsEveryPodAgain) {
  api_server_.AddList({200, ReadTestdata("pods-list.json")});
  StartWatcher();
  ASSERT_TRUE(server_sync_.WaitForCalls(1));
  for (int i = 0; i < 200 && !watcher_->Synced(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(watcher_->Synced());
  const size_t node_pods = server_sync_.calls()[0].pods.size();
  ASSERT_GT(node_pods, 0u);
  const size_t before = server_sync_.calls().size();
  ASSERT_TRUE(watcher_->CheckServer().ok());
  EXPECT_EQ(watcher_->Resyncs(), 0);
  // The probe (no pods, no full sync) is all that was sent.
  auto calls = server_sync_.calls();
  ASSERT_EQ(calls.size(), before + 1);
  EXPECT_FALSE(calls.back().full_sync);
  EXPECT_TRUE(calls.back().pods.empty());

  server_sync_.Restart();
  ASSERT_TRUE(watcher_->CheckServer().ok());
  EXPECT_EQ(watcher_->Resyncs(), 1);
  calls = server_sync_.calls();
  ASSERT_EQ(calls.size(), before + 3);  // probe, probe, full sync
  EXPECT_TRUE(calls.back().full_sync);
  EXPECT_EQ(calls.back().pods.size(), node_pods);
  const orion::v1::PodPolicy* a = FindPod(calls.back().pods, kPodA);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->priority(), orion::v1::PRIORITY_HIGH);

  // A server that cannot be reached: the check says so.
  grpc_server_->Shutdown();
  EXPECT_FALSE(watcher_->CheckServer().ok());
}

TEST_F(PodWatcherTest, ServerDownThenUpGetsAFullSync) {
  grpc_server_->Shutdown();
  grpc_server_->Wait();
  api_server_.AddList({200, ReadTestdata("pods-list.json")});
  StartWatcher();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(watcher_->Synced());
  stop_ = true;
  thread_.join();
}

// The pod's job reaches the server in its PodPolicy: a JobSet's pods carry the JobSet's name,
// and a pod that names none is sent with no job (the server makes it a job of its own).
TEST(PolicyForPodTest, CarriesThePodsJob) {
  absl::StatusOr<WatchEvent> e = ParseWatchEvent(R"({"type":"ADDED","object":{"metadata":{
      "uid":"5d3b2a1c-0f9e-4d8c-b7a6-951e2f3a4b5c","namespace":"training","name":"llama-w-0-1",
      "labels":{"jobset.sigs.k8s.io/jobset-name":"llama"}}}})");
  ASSERT_TRUE(e.ok()) << e.status();
  const ParsedAnnotations parsed = ParsePodAnnotations(e->pod.annotations, e->pod.labels);
  EXPECT_EQ(PolicyForPod(e->pod, parsed.settings).job(), "llama");
  e->pod.labels.clear();
  EXPECT_EQ(PolicyForPod(e->pod, ParsePodAnnotations(e->pod.annotations, e->pod.labels).settings)
                .job(),
            "");
}

}  // namespace
}  // namespace orion::agent
