// High-priority pods per GPU: the scheduler keeps one per GPU through orion.io/gpu-high, but a
// pod changed to orion/priority: high at run time can join another on its GPU. The server counts
// the high-priority pods of each GPU and flags more than policy.high_priority_per_gpu, in
// ListGpus (the admin API) and in /metrics (the PrometheusRule's alert).
#include <gtest/gtest.h>
#include <unistd.h>

#include "server/config.h"
#include "server/metrics.h"
#include "server/node_state.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Priority;
using contract::RegisterStatus;

constexpr char kPodA[] = "aaaaaaaa-1111-2222-3333-444444444444";
constexpr char kPodB[] = "bbbbbbbb-1111-2222-3333-444444444444";

PodPolicy Pod(const char* uid, const char* name, Priority priority) {
  PodPolicy p;
  p.pod_uid = uid;
  p.name = name;
  p.ns = "serving";
  p.priority = priority;
  return p;
}

TEST(HighPriorityPodsTest, APodChangedToHighBesideAnotherIsFlagged) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  ASSERT_EQ(cfg.policy.high_priority_per_gpu, 1u);  // the default
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  ASSERT_TRUE(state.UpsertPods({Pod(kPodA, "infer-a", Priority::kHigh),
                                Pod(kPodB, "infer-b", Priority::kBestEffort)},
                               /*full_sync=*/true)
                  .ok());
  PeerIdentity a = IdentifyPid(getpid(), 1000, 1000, "/proc");
  a.cgroup.pod_uid = kPodA;
  PeerIdentity b = a;
  b.cgroup.pod_uid = kPodB;
  const auto req = testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kBestEffort);
  // Two processes of pod A: one high-priority pod.
  ASSERT_EQ(state.Register(a, req).status, RegisterStatus::kOk);
  ASSERT_EQ(state.Register(a, req).status, RegisterStatus::kOk);
  ASSERT_EQ(state.Register(b, req).status, RegisterStatus::kOk);

  std::vector<GpuView> gpus = state.ListGpus();
  ASSERT_FALSE(gpus.empty());
  EXPECT_EQ(gpus[0].high_priority_clients, 2u);
  EXPECT_EQ(gpus[0].high_priority_pods, 1u);
  EXPECT_EQ(gpus[0].high_priority_pods_allowed, 1u);
  EXPECT_FALSE(gpus[0].high_priority_overcommitted);
  EXPECT_EQ(state.Snapshot().gpus[0].high_priority_pods, 1u);

  // Pod B is changed to high at run time, on the same GPU: flagged, and the next policy tick
  // logs it once, naming both pods.
  ASSERT_TRUE(state.UpsertPods({Pod(kPodB, "infer-b", Priority::kHigh)}, false).ok());
  ::testing::internal::CaptureStderr();
  state.PolicyTick(MonotonicNs());
  state.PolicyTick(MonotonicNs());
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("GPU 0 holds 2 high-priority pods, 1 allowed (policy.high_priority_per_gpu): "
                     "serving/infer-a, serving/infer-b"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("high-priority pods, 1 allowed"), log.rfind("high-priority pods, 1 allowed"))
      << "logged more than once: " << log;
  gpus = state.ListGpus();
  EXPECT_EQ(gpus[0].high_priority_pods, 2u);
  EXPECT_TRUE(gpus[0].high_priority_overcommitted);
  const MetricsSnapshot snap = state.Snapshot();
  EXPECT_EQ(snap.gpus[0].high_priority_pods, 2u);
  EXPECT_EQ(snap.high_priority_pods_allowed, 1u);
  // The other GPU holds none.
  ASSERT_GE(gpus.size(), 2u);
  EXPECT_EQ(gpus[1].high_priority_pods, 0u);
  EXPECT_FALSE(gpus[1].high_priority_overcommitted);

  // And back: B best-effort again clears the flag, and says so once.
  ASSERT_TRUE(state.UpsertPods({Pod(kPodB, "infer-b", Priority::kBestEffort)}, false).ok());
  EXPECT_FALSE(state.ListGpus()[0].high_priority_overcommitted);
  ::testing::internal::CaptureStderr();
  state.PolicyTick(MonotonicNs());
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("GPU 0 is back to 1 high-priority pods, 1 allowed"), std::string::npos) << log;
}

TEST(HighPriorityPodsTest, ConfigBoundsAndMetricFamilies) {
  auto two = ParseServerConfig("policy:\n  high_priority_per_gpu: 2\n", "<test>");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->policy.high_priority_per_gpu, 2u);
  auto zero = ParseServerConfig("policy:\n  high_priority_per_gpu: 0\n", "<test>");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("policy.high_priority_per_gpu"), std::string::npos)
      << zero.status();

  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.policy.high_priority_per_gpu = 2;
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  ASSERT_TRUE(state.UpsertPods({Pod(kPodA, "infer-a", Priority::kHigh),
                                Pod(kPodB, "infer-b", Priority::kHigh)}, true).ok());
  PeerIdentity a = IdentifyPid(getpid(), 1000, 1000, "/proc");
  a.cgroup.pod_uid = kPodA;
  PeerIdentity b = a;
  b.cgroup.pod_uid = kPodB;
  const auto req = testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kBestEffort);
  ASSERT_EQ(state.Register(a, req).status, RegisterStatus::kOk);
  ASSERT_EQ(state.Register(b, req).status, RegisterStatus::kOk);
  EXPECT_FALSE(state.ListGpus()[0].high_priority_overcommitted);  // 2 allowed

  MetricsCollector collector(&state, "node-a");
  bool pods = false, allowed = false;
  for (const auto& f : collector.Collect()) {
    if (f.name == "orion_gpu_high_priority_pods") {
      ASSERT_FALSE(f.metric.empty());
      EXPECT_EQ(f.metric[0].gauge.value, 2);
      pods = true;
    } else if (f.name == "orion_gpu_high_priority_pods_allowed") {
      ASSERT_FALSE(f.metric.empty());
      EXPECT_EQ(f.metric[0].gauge.value, 2);
      allowed = true;
    }
  }
  EXPECT_TRUE(pods);
  EXPECT_TRUE(allowed);
}

}  // namespace
}  // namespace orion::server
