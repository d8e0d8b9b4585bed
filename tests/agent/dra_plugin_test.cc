// orion-agent's DRA kubelet plugin against a test kubelet (registration and the DRAPlugin calls
// over real gRPC on Unix sockets) and a test API server serving ResourceClaims and keeping
// ResourceSlices: device names, claim configuration, the CDI spec of a prepared claim (a claim of
// shares on two GPUs: both, each once, in the node's order), per-claim
// errors (bad config, unknown device, GPU gone, UID mismatch) that leave the other claims of the
// call prepared, unprepare idempotence, restart from the checkpoint, the ResourceSlice bodies,
// and the pod policies a claim gives orion-server.
#include "agent/dra_plugin.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/cdi_spec.h"
#include "agent/claim_policy_sink.h"
#include "tests/agent/test_dra_kubelet.h"
#include "tests/agent/test_resource_api_server.h"

namespace orion::agent {
namespace {

using testing::TestClaim;
using testing::TestDraKubelet;
using testing::TestResourceApiServer;
using Json = nlohmann::json;

constexpr char kGpu0[] = "GPU-8f4c2e1a-1111-2222-3333-444455556666";
constexpr char kGpu1[] = "GPU-0b1c2d3e-7777-8888-9999-aaaabbbbcccc";
constexpr char kNode[] = "gpu-node-a";
constexpr char kPod[] = "5d0c7e3a-1b2c-4d5e-8f90-0a1b2c3d4e5f";
constexpr char kNodeUid[] = "7e57a0de-0000-4000-8000-00000000a0de";

struct Result {
  std::string request, device;
  std::string pool = kNode;
  std::string driver = "gpu-share.orion.io";
};

// A ResourceClaim as the API server returns it once the scheduler has allocated it.
std::string ClaimJson(const std::string& uid, const std::string& name,
                      const std::vector<Result>& results, Json parameters = nullptr,
                      const std::string& pod = kPod) {
  Json res = Json::array();
  for (const Result& r : results) {
    res.push_back({{"request", r.request}, {"driver", r.driver}, {"pool", r.pool},
                   {"device", r.device}});
  }
  Json config = Json::array();
  if (!parameters.is_null()) {
    config.push_back({{"source", "FromClaim"},
                      {"opaque", {{"driver", "gpu-share.orion.io"}, {"parameters", parameters}}}});
  }
  return Json{{"apiVersion", "resource.k8s.io/v1"},
              {"kind", "ResourceClaim"},
              {"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", uid}}},
              {"spec", {{"devices", {{"requests", Json::array()}}}}},
              {"status",
               {{"allocation", {{"devices", {{"results", res}, {"config", config}}}}},
                {"reservedFor", Json::array({{{"resource", "pods"}, {"name", "p"}, {"uid", pod}}})}}}}
      .dump();
}

// Records what reaches orion-server.
class RecordingSink final : public PolicySink {
 public:
  absl::Status Upsert(const std::vector<orion::v1::PodPolicy>& pods, bool) override {
    for (const auto& p : pods) last[p.pod_uid()] = p;
    ++sends;
    return absl::OkStatus();
  }
  absl::Status Delete(const std::string& uid) override {
    last.erase(uid);
    return absl::OkStatus();
  }
  std::map<std::string, orion::v1::PodPolicy> last;
  int sends = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(DraDeviceNames, RoundTripAndRejects) {
  EXPECT_EQ(DraShareDeviceName(0, 3), "gpu-0-share-3");
  EXPECT_EQ(DraHighDeviceName(1, 0), "gpu-1-high");
  EXPECT_EQ(DraHighDeviceName(1, 2), "gpu-1-high-2");
  auto share = ParseDraDeviceName("gpu-12-share-7");
  ASSERT_TRUE(share.has_value());
  EXPECT_EQ(share->gpu_index, 12);
  EXPECT_FALSE(share->high);
  EXPECT_EQ(share->slot, 7);
  auto high = ParseDraDeviceName("gpu-1-high");
  ASSERT_TRUE(high.has_value());
  EXPECT_TRUE(high->high);
  EXPECT_EQ(high->slot, 0);
  for (const char* bad : {"gpu-0", "gpu--share-1", "gpu-0-share-", "gpu-0-share-01", "gpu-0-high-0",
                          "gpu-0-highx", "gpu-x-share-1", "cpu-0-share-1", "gpu-0-share-1-",
                          "gpu-99999-share-1"}) {
    EXPECT_FALSE(ParseDraDeviceName(bad).has_value()) << bad;
  }
}

TEST(DraClaimConfig, ParsesAndNamesBadFields) {
  auto ok = ParseDraClaimConfig(Json{{"apiVersion", "gpu-share.orion.io/v1alpha1"},
                                     {"kind", "GpuShareConfig"},
                                     {"priority", "high"},
                                     {"memoryLimit", "4Gi"},
                                     {"latencyTargetMs", 2.5}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->priority, PodPriority::kHigh);
  EXPECT_EQ(ok->memory_limit_bytes, 4ull << 30);
  EXPECT_EQ(ok->latency_target_us, 2500u);
  EXPECT_EQ(ParseDraClaimConfig(Json{{"latencyTargetMs", "7"}})->latency_target_us, 7000u);
  struct Case {
    Json params;
    std::string names;
  } cases[] = {
      {Json{{"priority", "urgent"}}, "parameters.priority"},
      {Json{{"memoryLimit", "lots"}}, "parameters.memoryLimit"},
      {Json{{"memoryLimit", 4}}, "parameters.memoryLimit"},
      {Json{{"latencyTargetMs", -1}}, "parameters.latencyTargetMs"},
      {Json{{"latencyTargetMs", true}}, "parameters.latencyTargetMs"},
      {Json{{"apiVersion", "v1"}}, "parameters.apiVersion"},
      {Json{{"kind", "Pod"}}, "parameters.kind"},
      {Json{{"priorty", "high"}}, "parameters.priorty: unknown field"},
      {Json::array(), "not a JSON object"},
  };
  for (const Case& c : cases) {
    auto r = ParseDraClaimConfig(c.params);
    ASSERT_FALSE(r.ok()) << c.params.dump();
    EXPECT_NE(std::string(r.status().message()).find(c.names), std::string::npos)
        << r.status().message();
  }
}

TEST(ResourceClaimParsing, RefusesWhatIsNotAnAllocatedClaim) {
  EXPECT_FALSE(ParseResourceClaim("{", "u").ok());
  EXPECT_FALSE(ParseResourceClaim(R"({"kind":"Pod"})", "u").ok());
  // Not allocated.
  auto r = ParseResourceClaim(
      R"({"kind":"ResourceClaim","metadata":{"uid":"u","namespace":"ml","name":"c"}})", "u");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("claim ml/c is not allocated"),
            std::string::npos);
  // Another driver's results are not ours; ours are kept.
  auto mixed = ParseResourceClaim(
      ClaimJson("u", "c", {{.request = "gpu", .device = "gpu-0-share-1"},
                           {.request = "nic", .device = "eth0", .driver = "net.example.com"}}),
      "u");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  ASSERT_EQ(mixed->devices.size(), 1u);
  EXPECT_EQ(mixed->devices[0].device, "gpu-0-share-1");
  EXPECT_EQ(mixed->pod_uids, std::vector<std::string>{kPod});
  // A body over the bound is refused before parsing.
  EXPECT_EQ(ParseResourceClaim(std::string(300 << 10, ' '), "u").status().code(),
            absl::StatusCode::kResourceExhausted);
}

class DraPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/orion-dra-XXXXXX";
    dir_ = mkdtemp(tmpl);
    api_ = std::make_unique<kube::CurlKubeApi>(kube::KubeApiConfig{.base_url = server_.base_url()});
    server_.AddNode(kNode, kNodeUid);
    StartPlugin();
  }
  void TearDown() override {
    plugin_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartPlugin(std::vector<DraGpu> gpus = {{.index = 0, .uuid = kGpu0, .product = "NVIDIA H100 80GB HBM3", .memory_bytes = 80ull << 30},
                                               {.index = 1, .uuid = kGpu1}}) {
    DraPluginConfig config;
    config.node_name = kNode;
    config.plugin_dir = dir_ + "/plugins/gpu-share.orion.io";
    config.registry_dir = dir_ + "/plugins_registry";
    config.cdi_dir = dir_ + "/cdi";
    config.shares_per_gpu = 4;
    config.high_per_gpu = 1;
    config.min_latency_target_us = 1000;  // a server with policy.min_latency_target_ms: 1
    config.retry_interval = std::chrono::milliseconds(50);
    config.layout.host_lib_dir = "/var/lib/orion/versions/0123abcd";
    plugin_ = std::make_unique<DraPlugin>(config, api_.get());
    plugin_->SetGpus(std::move(gpus));
    ASSERT_TRUE(plugin_->Start().ok());
    auto info = kubelet_.Register(plugin_->registration_socket());
    ASSERT_TRUE(info.ok()) << info.status();
  }

  std::string CdiPath(const std::string& uid) {
    return dir_ + "/cdi/" + ClaimCdiFileName(uid);
  }

  TestResourceApiServer server_;
  std::string dir_;
  std::unique_ptr<kube::CurlKubeApi> api_;
  std::unique_ptr<DraPlugin> plugin_;
  TestDraKubelet kubelet_;
};

TEST_F(DraPluginTest, RegistersAsDraPlugin) {
  TestDraKubelet kubelet;
  auto info = kubelet.Register(plugin_->registration_socket());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->type(), "DRAPlugin");
  EXPECT_EQ(info->name(), "gpu-share.orion.io");
  EXPECT_EQ(info->endpoint(), plugin_->plugin_socket());
  EXPECT_EQ(std::vector<std::string>(info->supported_versions().begin(),
                                     info->supported_versions().end()),
            (std::vector<std::string>{"v1.DRAPlugin", "v1beta1.DRAPlugin"}));
  EXPECT_TRUE(plugin_->Registered());
  ASSERT_TRUE(kubelet.Register(plugin_->registration_socket(), /*accept=*/false).ok());
  EXPECT_FALSE(plugin_->Registered());
}

TEST_F(DraPluginTest, PreparesBestEffortClaimWithCdiSpec) {
  const std::string uid = "0f6a3c1e-2b4d-4e6f-8a9b-0c1d2e3f4a5b";
  server_.PutClaim("ml", "train", ClaimJson(uid, "train", {{.request = "gpu", .device = "gpu-1-share-2"}},
                                            Json{{"memoryLimit", "4Gi"}, {"latencyTargetMs", 2.5}}));
  auto reply = kubelet_.Prepare({{"ml", uid, "train"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->claims().count(uid), 1u);
  const auto& claim = reply->claims().at(uid);
  EXPECT_EQ(claim.error(), "");
  ASSERT_EQ(claim.devices_size(), 1);
  EXPECT_EQ(claim.devices(0).pool_name(), kNode);
  EXPECT_EQ(claim.devices(0).device_name(), "gpu-1-share-2");
  EXPECT_EQ(claim.devices(0).request_names(0), "gpu");
  EXPECT_EQ(std::vector<std::string>(claim.devices(0).cdi_device_ids().begin(),
                                     claim.devices(0).cdi_device_ids().end()),
            std::vector<std::string>{"gpu-share.orion.io/claim=" + uid});

  const Json spec = Json::parse(ReadFile(CdiPath(uid)));
  EXPECT_EQ(spec["cdiVersion"], "0.6.0");
  EXPECT_EQ(spec["kind"], "gpu-share.orion.io/claim");
  ASSERT_EQ(spec["devices"].size(), 1u);
  EXPECT_EQ(spec["devices"][0]["name"], uid);
  const Json& edits = spec["devices"][0]["containerEdits"];
  std::vector<std::string> env = edits["env"];
  auto has = [&](const std::string& e) {
    return std::find(env.begin(), env.end(), e) != env.end();
  };
  EXPECT_TRUE(has(std::string("NVIDIA_VISIBLE_DEVICES=") + kGpu1)) << edits.dump();
  EXPECT_TRUE(has("LD_PRELOAD=/usr/local/orion/lib/liborion_interpose.so"));
  EXPECT_TRUE(has("ORION_SOCKET=/run/orion/orion.sock"));
  EXPECT_TRUE(has("ORION_PRIORITY=best-effort"));
  EXPECT_TRUE(has("ORION_MEMORY_LIMIT=4294967296"));
  EXPECT_TRUE(has("ORION_LATENCY_TARGET_MS=2.5"));
  ASSERT_EQ(edits["mounts"].size(), 2u);
  EXPECT_EQ(edits["mounts"][0]["hostPath"], "/var/lib/orion/versions/0123abcd");
  EXPECT_EQ(edits["mounts"][0]["containerPath"], "/usr/local/orion/lib");
  EXPECT_EQ(edits["mounts"][0]["options"][0], "ro");
  EXPECT_EQ(edits["mounts"][1]["hostPath"], "/run/orion");

  auto pods = plugin_->PodPolicies();
  ASSERT_EQ(pods.count(kPod), 1u);
  EXPECT_EQ(pods[kPod].settings.priority, PodPriority::kBestEffort);
  EXPECT_EQ(pods[kPod].settings.memory_limit_bytes, 4ull << 30);
  EXPECT_EQ(pods[kPod].gpu_uuids, std::vector<std::string>{kGpu1});

  // Asked again (a kubelet retry): the same answer, no second read of the claim.
  const size_t reads = server_.requests().size();
  auto again = kubelet_.Prepare({{"ml", uid, "train"}});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->claims().at(uid).devices(0).device_name(), "gpu-1-share-2");
  EXPECT_EQ(server_.requests().size(), reads);
}

// A torchrun pod of 2 ranks with one claim of two requests, one share each, kept on distinct
// GPUs by the requests' selectors (docs/kubernetes.md): the claim's CDI spec gives the container
// both GPUs, each once, in the node's order (index 0 first, though the allocation lists it
// second and its UUID sorts last), and the pod's GPUs at orion-server are the same two. Two
// shares of one GPU (a claim without such selectors) give that GPU once.
TEST_F(DraPluginTest, ClaimOfSharesOnTwoGpusGivesBothGpusEachOnce) {
  const std::string uid = "2f6a3c1e-2b4d-4e6f-8a9b-0c1d2e3f4a5b";
  server_.PutClaim("ml", "ddp", ClaimJson(uid, "ddp", {{.request = "rank-1", .device = "gpu-1-share-0"},
                                                      {.request = "rank-0", .device = "gpu-0-share-3"}}));
  auto reply = kubelet_.Prepare({{"ml", uid, "ddp"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  const auto& claim = reply->claims().at(uid);
  ASSERT_EQ(claim.error(), "");
  ASSERT_EQ(claim.devices_size(), 2);
  EXPECT_EQ(claim.devices(0).request_names(0), "rank-1");
  EXPECT_EQ(claim.devices(0).device_name(), "gpu-1-share-0");
  EXPECT_EQ(claim.devices(1).request_names(0), "rank-0");
  EXPECT_EQ(claim.devices(1).device_name(), "gpu-0-share-3");
  // One CDI device for the claim: the runtime applies its edits once.
  EXPECT_EQ(claim.devices(0).cdi_device_ids_size() + claim.devices(1).cdi_device_ids_size(), 1);
  const Json spec = Json::parse(ReadFile(CdiPath(uid)));
  std::vector<std::string> env = spec["devices"][0]["containerEdits"]["env"];
  std::vector<std::string> visible;
  for (const std::string& e : env) {
    if (e.rfind("NVIDIA_VISIBLE_DEVICES=", 0) == 0) visible.push_back(e);
  }
  EXPECT_EQ(visible, std::vector<std::string>{std::string("NVIDIA_VISIBLE_DEVICES=") + kGpu0 +
                                              "," + kGpu1});
  EXPECT_EQ(plugin_->PodPolicies()[kPod].gpu_uuids, (std::vector<std::string>{kGpu0, kGpu1}));

  const std::string same = "3f6a3c1e-2b4d-4e6f-8a9b-0c1d2e3f4a5b";
  server_.PutClaim("ml", "same", ClaimJson(same, "same", {{.request = "gpus", .device = "gpu-1-share-0"},
                                                         {.request = "gpus", .device = "gpu-1-share-2"}},
                                           nullptr, "6d0c7e3a-1b2c-4d5e-8f90-0a1b2c3d4e5f"));
  reply = kubelet_.Prepare({{"ml", same, "same"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->claims().at(same).error(), "");
  const std::string text = ReadFile(CdiPath(same));
  EXPECT_NE(text.find(std::string("\"NVIDIA_VISIBLE_DEVICES=") + kGpu1 + "\""), std::string::npos)
      << text;
  EXPECT_EQ(plugin_->PodPolicies()["6d0c7e3a-1b2c-4d5e-8f90-0a1b2c3d4e5f"].gpu_uuids,
            std::vector<std::string>{kGpu1});
}

// The CDI spec of GPUs handed out through CDI: each GPU's device once, beside the claim's.
TEST(ClaimCdiSpec, EachGpuOnceUnderTheCdiStrategy) {
  ContainerLayout layout;
  layout.host_lib_dir = "/var/lib/orion/versions/0123abcd";
  layout.device_list = DeviceListStrategy::kCdiCri;
  const std::string uid = "4f6a3c1e-2b4d-4e6f-8a9b-0c1d2e3f4a5b";
  ClaimCdi cdi = ClaimCdiSpec(uid, {kGpu0, kGpu1, kGpu0}, PodSettings{}, layout);
  EXPECT_EQ(cdi.device_ids, (std::vector<std::string>{"gpu-share.orion.io/claim=" + uid,
                                                      std::string("nvidia.com/gpu=") + kGpu0,
                                                      std::string("nvidia.com/gpu=") + kGpu1}));
  layout.device_list = DeviceListStrategy::kEnvVar;
  cdi = ClaimCdiSpec(uid, {kGpu0, kGpu1, kGpu0}, PodSettings{}, layout);
  const std::string text = WriteJson(cdi.spec);
  EXPECT_NE(text.find(std::string("\"NVIDIA_VISIBLE_DEVICES=") + kGpu0 + "," + kGpu1 + "\""),
            std::string::npos)
      << text;
}

TEST_F(DraPluginTest, HighDeviceGivesHighPriorityAndGpuCdiDeviceUnderCdiStrategy) {
  plugin_.reset();
  // A node whose GPUs are handed out through CDI (nvidia-ctk): the claim names the GPU's CDI
  // device too and NVIDIA_VISIBLE_DEVICES is void.
  DraPluginConfig config;
  config.node_name = kNode;
  config.plugin_dir = dir_ + "/p2";
  config.registry_dir = dir_ + "/r2";
  config.cdi_dir = dir_ + "/cdi";
  config.layout.device_list = DeviceListStrategy::kCdiAnnotations;
  plugin_ = std::make_unique<DraPlugin>(config, api_.get());
  plugin_->SetGpus({{.index = 0, .uuid = kGpu0}});
  ASSERT_TRUE(plugin_->Start().ok());
  ASSERT_TRUE(kubelet_.Register(plugin_->registration_socket()).ok());
  const std::string uid = "1f6a3c1e-2b4d-4e6f-8a9b-0c1d2e3f4a5b";
  server_.PutClaim("ml", "serve", ClaimJson(uid, "serve", {{.request = "gpu", .device = "gpu-0-high"}},
                                            Json{{"priority", "high"}}));
  auto reply = kubelet_.Prepare({{"ml", uid, "serve"}}, /*v1beta1=*/true);
  ASSERT_TRUE(reply.ok()) << reply.status();
  const auto& claim = reply->claims().at(uid);
  ASSERT_EQ(claim.error(), "");
  EXPECT_EQ(std::vector<std::string>(claim.devices(0).cdi_device_ids().begin(),
                                     claim.devices(0).cdi_device_ids().end()),
            (std::vector<std::string>{"gpu-share.orion.io/claim=" + uid,
                                      std::string("nvidia.com/gpu=") + kGpu0}));
  const std::string spec = ReadFile(CdiPath(uid));
  EXPECT_NE(spec.find("ORION_PRIORITY=high"), std::string::npos);
  EXPECT_NE(spec.find("NVIDIA_VISIBLE_DEVICES=void"), std::string::npos);
  EXPECT_EQ(plugin_->PodPolicies()[kPod].settings.priority, PodPriority::kHigh);
}

TEST_F(DraPluginTest, PerClaimErrorsLeaveTheOtherClaimsPrepared) {
  const std::string good = "00000000-0000-4000-8000-000000000001";
  const std::string bad_config = "00000000-0000-4000-8000-000000000002";
  const std::string unknown = "00000000-0000-4000-8000-000000000003";
  const std::string other_pool = "00000000-0000-4000-8000-000000000004";
  const std::string wrong_uid = "00000000-0000-4000-8000-000000000005";
  const std::string high_on_share = "00000000-0000-4000-8000-000000000006";
  const std::string missing = "00000000-0000-4000-8000-000000000007";
  server_.PutClaim("ml", "good", ClaimJson(good, "good", {{.request = "gpu", .device = "gpu-0-share-0"}}));
  server_.PutClaim("ml", "bad-config",
                   ClaimJson(bad_config, "bad-config", {{.request = "gpu", .device = "gpu-0-share-1"}},
                             Json{{"memoryLimit", "a lot"}}));
  server_.PutClaim("ml", "unknown",
                   ClaimJson(unknown, "unknown", {{.request = "gpu", .device = "gpu-7-share-0"}}));
  server_.PutClaim("ml", "other-pool",
                   ClaimJson(other_pool, "other-pool",
                             {{.request = "gpu", .device = "gpu-0-share-2", .pool = "gpu-node-b"}}));
  server_.PutClaim("ml", "recreated",
                   ClaimJson("99999999-0000-4000-8000-000000000000", "recreated",
                             {{.request = "gpu", .device = "gpu-0-share-2"}}));
  server_.PutClaim("ml", "high-on-share",
                   ClaimJson(high_on_share, "high-on-share", {{.request = "gpu", .device = "gpu-0-share-3"}},
                             Json{{"priority", "high"}}));
  auto reply = kubelet_.Prepare({{"ml", good, "good"},
                                 {"ml", bad_config, "bad-config"},
                                 {"ml", unknown, "unknown"},
                                 {"ml", other_pool, "other-pool"},
                                 {"ml", wrong_uid, "recreated"},
                                 {"ml", high_on_share, "high-on-share"},
                                 {"ml", missing, "missing"},
                                 {"ml", "../../etc", "x"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->claims_size(), 8);
  auto error = [&](const std::string& uid) { return reply->claims().at(uid).error(); };
  EXPECT_EQ(error(good), "");
  EXPECT_TRUE(std::filesystem::exists(CdiPath(good)));
  auto contains = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  EXPECT_TRUE(contains(error(bad_config), "claim ml/bad-config")) << error(bad_config);
  EXPECT_TRUE(contains(error(bad_config), "status.allocation.devices.config[0].opaque.parameters.memoryLimit"))
      << error(bad_config);
  EXPECT_TRUE(contains(error(unknown), "device \"gpu-7-share-0\"")) << error(unknown);
  EXPECT_TRUE(contains(error(unknown), "names GPU 7, not one of this node's")) << error(unknown);
  EXPECT_TRUE(contains(error(other_pool), "not in this node's pool \"gpu-node-a\""))
      << error(other_pool);
  EXPECT_TRUE(contains(error(wrong_uid), "has UID 99999999")) << error(wrong_uid);
  EXPECT_TRUE(contains(error(high_on_share), "needs a gpu-<i>-high device")) << error(high_on_share);
  EXPECT_TRUE(contains(error(missing), "claim ml/missing")) << error(missing);
  EXPECT_TRUE(contains(error(missing), "HTTP 404")) << error(missing);
  EXPECT_TRUE(contains(error("../../etc"), "not a Kubernetes UID")) << error("../../etc");
  for (const std::string& uid : {bad_config, unknown, other_pool, wrong_uid, high_on_share, missing}) {
    EXPECT_FALSE(std::filesystem::exists(CdiPath(uid))) << uid;
  }
  EXPECT_EQ(plugin_->Claims().size(), 1u);
}

// Names that would change the API path they go into ("..", "."), or are no Kubernetes name, are
// refused before the API server is asked.
TEST_F(DraPluginTest, RefusesNamesThatAreNotKubernetesNames) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"..", "c"}, {".", "c"}, {"ml", ".."}, {"ml", "."}, {"ml", "a..b"}, {"ml", ".c"},
      {"ml", "c."}, {"-ml", "c"}, {"ml.x", "c"}, {"ML", "c"}, {"ml", "c/d"}, {"", "c"},
      {"ml", std::string(254, 'a')}, {std::string(64, 'a'), "c"}};
  std::vector<TestClaim> claims;
  for (size_t i = 0; i < bad.size(); ++i) {
    claims.push_back({bad[i].first, "00000000-0000-4000-8000-0000000001" + std::to_string(10 + i),
                      bad[i].second});
  }
  const size_t reads = server_.requests().size();
  auto reply = kubelet_.Prepare(claims);
  ASSERT_TRUE(reply.ok()) << reply.status();
  for (const TestClaim& c : claims) {
    const std::string error = reply->claims().at(c.uid).error();
    EXPECT_NE(error.find("is not a DNS"), std::string::npos) << c.ns << "/" << c.name << ": " << error;
    EXPECT_NE(error.find(c.uid), std::string::npos) << error;
  }
  // No claim was asked for (the plugin's own ResourceSlice traffic may go on meanwhile).
  const std::vector<std::string> after = server_.requests();
  for (size_t i = reads; i < after.size(); ++i) {
    EXPECT_EQ(after[i].find("resourceclaims"), std::string::npos) << after[i];
  }
  // Valid names with dots and dashes still pass the check (the claim is then not found).
  auto ok = kubelet_.Prepare({{"ml-2", "00000000-0000-4000-8000-000000000199", "train.v2-a"}});
  ASSERT_TRUE(ok.ok());
  EXPECT_NE(ok->claims().at("00000000-0000-4000-8000-000000000199").error().find("HTTP 404"),
            std::string::npos);
}

// One UID twice in a call: neither is prepared, and the answer names the UID (before, the one
// answer of the UID listed the first claim's devices twice).
TEST_F(DraPluginTest, RefusesAClaimUidListedTwiceInOneCall) {
  const std::string uid = "00000000-0000-4000-8000-000000000040";
  const std::string other = "00000000-0000-4000-8000-000000000041";
  server_.PutClaim("ml", "a", ClaimJson(uid, "a", {{.request = "gpu", .device = "gpu-0-share-0"}}));
  server_.PutClaim("ml", "b", ClaimJson(uid, "b", {{.request = "gpu", .device = "gpu-1-share-0"}}));
  server_.PutClaim("ml", "o", ClaimJson(other, "o", {{.request = "gpu", .device = "gpu-1-share-1"}}));
  auto reply = kubelet_.Prepare({{"ml", uid, "a"}, {"ml", other, "o"}, {"ml", uid, "b"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  const auto& dup = reply->claims().at(uid);
  EXPECT_EQ(dup.devices_size(), 0);
  EXPECT_NE(dup.error().find("claim UID \"" + uid + "\" is listed 2 times"), std::string::npos)
      << dup.error();
  EXPECT_FALSE(std::filesystem::exists(CdiPath(uid)));
  EXPECT_EQ(reply->claims().at(other).error(), "");  // the others are prepared
  EXPECT_EQ(plugin_->Claims().count(uid), 0u);
}

// A latency target under orion-server's floor (policy.min_latency_target_ms: 1 here, 5 unless the
// agent is told otherwise) is refused at prepare with a message naming both.
TEST_F(DraPluginTest, RefusesALatencyTargetBelowTheServersFloor) {
  const std::string tiny = "00000000-0000-4000-8000-000000000050";
  const std::string floor = "00000000-0000-4000-8000-000000000051";
  server_.PutClaim("ml", "tiny", ClaimJson(tiny, "tiny", {{.request = "gpu", .device = "gpu-0-share-0"}},
                                           Json{{"latencyTargetMs", "0.000001"}}));
  server_.PutClaim("ml", "floor", ClaimJson(floor, "floor", {{.request = "gpu", .device = "gpu-0-share-1"}},
                                            Json{{"latencyTargetMs", 1}}));
  auto reply = kubelet_.Prepare({{"ml", tiny, "tiny"}, {"ml", floor, "floor"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  const std::string error = reply->claims().at(tiny).error();
  EXPECT_NE(error.find("claim ml/tiny: latencyTargetMs 0.001 is below orion-server's floor of 1 ms"),
            std::string::npos)
      << error;
  EXPECT_FALSE(std::filesystem::exists(CdiPath(tiny)));
  EXPECT_EQ(reply->claims().at(floor).error(), "");  // the floor itself is allowed
}

// Symlinks planted at the names of the checkpoint's and the CDI spec's temporary files are not
// followed: their targets keep their content, and the claim is still prepared.
TEST_F(DraPluginTest, TemporaryFilesDoNotFollowPlantedSymlinks) {
  const std::string uid = "00000000-0000-4000-8000-000000000060";
  const std::string checkpoint = dir_ + "/plugins/gpu-share.orion.io/checkpoint.json";
  const std::string pid = std::to_string(getpid());
  const std::string victim = dir_ + "/victim";
  { std::ofstream(victim) << "precious"; }
  std::filesystem::create_symlink(victim, checkpoint + ".tmp." + pid);
  std::filesystem::create_symlink(victim, CdiPath(uid) + ".tmp." + pid);
  server_.PutClaim("ml", "c", ClaimJson(uid, "c", {{.request = "gpu", .device = "gpu-0-share-0"}}));
  auto reply = kubelet_.Prepare({{"ml", uid, "c"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->claims().at(uid).error(), "");
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(checkpoint + ".tmp." + pid));
  EXPECT_TRUE(std::filesystem::is_symlink(CdiPath(uid) + ".tmp." + pid));
  EXPECT_NE(ReadFile(CdiPath(uid)).find("gpu-share.orion.io/claim"), std::string::npos);
  EXPECT_NE(ReadFile(checkpoint).find(uid), std::string::npos);
  EXPECT_FALSE(std::filesystem::is_symlink(CdiPath(uid)));
}

TEST(WriteFileAtomically, NeverFollowsOrReusesAFileAtItsTemporaryName) {
  char tmpl[] = "/tmp/orion-atomic-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/spec.json";
  const std::string victim = dir + "/victim";
  { std::ofstream(victim) << "precious"; }
  std::filesystem::create_symlink(victim, path + ".tmp." + std::to_string(getpid()));
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(ReadFile(path), "new");
  EXPECT_EQ(ReadFile(victim), "precious");
  // A folder that cannot hold the file: the error names the path.
  absl::Status s = WriteFileAtomically(dir + "/missing/spec.json", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find(dir + "/missing/spec.json"), std::string::npos) << s;
  std::filesystem::remove_all(dir);
}

// Priority is per GPU: a pod is high only where it holds a high device. A claim of a high device
// and shares (on another GPU, or the same) is refused, naming the devices; before, its CDI spec
// said ORION_PRIORITY=high with both GPUs and orion-server was told the pod is high on both.
TEST_F(DraPluginTest, RefusesAClaimMixingHighDevicesAndShares) {
  const std::string other_gpu = "00000000-0000-4000-8000-000000000070";
  const std::string same_gpu = "00000000-0000-4000-8000-000000000071";
  server_.PutClaim("ml", "mixed", ClaimJson(other_gpu, "mixed", {{.request = "hp", .device = "gpu-0-high"},
                                                                 {.request = "be", .device = "gpu-1-share-2"}}));
  server_.PutClaim("ml", "mixed-one-gpu",
                   ClaimJson(same_gpu, "mixed-one-gpu", {{.request = "be", .device = "gpu-0-share-1"},
                                                         {.request = "hp", .device = "gpu-0-high"}},
                             nullptr, "6d0c7e3a-1b2c-4d5e-8f90-0a1b2c3d4e5f"));
  auto reply = kubelet_.Prepare({{"ml", other_gpu, "mixed"}, {"ml", same_gpu, "mixed-one-gpu"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  const std::string error = reply->claims().at(other_gpu).error();
  EXPECT_NE(error.find("claim ml/mixed mixes high devices (gpu-0-high (GPU 0)) with shares "
                       "(gpu-1-share-2 (GPU 1))"),
            std::string::npos)
      << error;
  EXPECT_NE(reply->claims().at(same_gpu).error().find("mixes high devices (gpu-0-high (GPU 0)) "
                                                      "with shares (gpu-0-share-1 (GPU 0))"),
            std::string::npos)
      << reply->claims().at(same_gpu).error();
  for (const std::string& uid : {other_gpu, same_gpu}) {
    EXPECT_EQ(reply->claims().at(uid).devices_size(), 0);
    EXPECT_FALSE(std::filesystem::exists(CdiPath(uid)));
  }
  EXPECT_TRUE(plugin_->PodPolicies().empty());
}

// Two claims of one pod, one of a high device and one of a share, merge the same way: the second
// prepared is refused, whichever comes first, naming both claims; the pod keeps what the first
// gives it (high on GPU 0 only, or best-effort on GPU 1 only).
TEST_F(DraPluginTest, RefusesAPodsClaimsMixingHighDevicesAndShares) {
  RecordingSink server;
  ClaimPolicySink sink(&server, [&] { return plugin_->PodPolicies(); });
  plugin_->OnClaimsChanged([&] { (void)sink.Refresh(); });
  orion::v1::PodPolicy pod;
  pod.set_pod_uid(kPod);
  pod.set_priority(orion::v1::PRIORITY_BEST_EFFORT);
  ASSERT_TRUE(sink.Upsert({pod}, true).ok());

  const std::string high = "00000000-0000-4000-8000-000000000080";
  const std::string share = "00000000-0000-4000-8000-000000000081";
  server_.PutClaim("ml", "hp", ClaimJson(high, "hp", {{.request = "gpu", .device = "gpu-0-high"}}));
  server_.PutClaim("ml", "be", ClaimJson(share, "be", {{.request = "gpu", .device = "gpu-1-share-2"}}));
  auto reply = kubelet_.Prepare({{"ml", high, "hp"}, {"ml", share, "be"}});
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->claims().at(high).error(), "");
  const std::string error = reply->claims().at(share).error();
  EXPECT_NE(error.find("claim ml/be (shares gpu-1-share-2) and claim ml/hp (high devices "
                       "gpu-0-high), prepared already, are both for pod " + std::string(kPod)),
            std::string::npos)
      << error;
  EXPECT_FALSE(std::filesystem::exists(CdiPath(share)));
  EXPECT_EQ(server.last[kPod].priority(), orion::v1::PRIORITY_HIGH);
  EXPECT_EQ(std::vector<std::string>(server.last[kPod].gpu_uuids().begin(),
                                     server.last[kPod].gpu_uuids().end()),
            std::vector<std::string>{kGpu0});

  // The other way round, for another pod: the share first, then the high device is refused.
  const std::string pod2 = "6d0c7e3a-1b2c-4d5e-8f90-0a1b2c3d4e5f";
  const std::string share2 = "00000000-0000-4000-8000-000000000082";
  const std::string high2 = "00000000-0000-4000-8000-000000000083";
  server_.PutClaim("ml", "be2", ClaimJson(share2, "be2", {{.request = "gpu", .device = "gpu-0-share-0"}},
                                          nullptr, pod2));
  server_.PutClaim("ml", "hp2", ClaimJson(high2, "hp2", {{.request = "gpu", .device = "gpu-1-high"}},
                                          nullptr, pod2));
  ASSERT_EQ(kubelet_.Prepare({{"ml", share2, "be2"}})->claims().at(share2).error(), "");
  const std::string error2 = kubelet_.Prepare({{"ml", high2, "hp2"}})->claims().at(high2).error();
  EXPECT_NE(error2.find("claim ml/hp2 (high devices gpu-1-high) and claim ml/be2 (shares "
                        "gpu-0-share-0)"),
            std::string::npos)
      << error2;
  EXPECT_EQ(plugin_->PodPolicies()[pod2].settings.priority, PodPriority::kBestEffort);
  EXPECT_EQ(plugin_->PodPolicies()[pod2].gpu_uuids, std::vector<std::string>{kGpu0});
  // Claims of high devices on two GPUs, or of shares on two, are no mix.
  const std::string high3 = "00000000-0000-4000-8000-000000000084";
  server_.PutClaim("ml", "hp3", ClaimJson(high3, "hp3", {{.request = "gpu", .device = "gpu-1-high"}}));
  EXPECT_EQ(kubelet_.Prepare({{"ml", high3, "hp3"}})->claims().at(high3).error(), "");
  EXPECT_EQ(plugin_->PodPolicies()[kPod].settings.priority, PodPriority::kHigh);
  plugin_->OnClaimsChanged(nullptr);
}

// A high device is one pod's place on its GPU: a claim of one reserved for two pods is refused.
TEST_F(DraPluginTest, RefusesAHighClaimReservedForSeveralPods) {
  const std::string uid = "00000000-0000-4000-8000-000000000090";
  Json claim = Json::parse(ClaimJson(uid, "shared", {{.request = "gpu", .device = "gpu-0-high"}}));
  claim["status"]["reservedFor"].push_back(
      {{"resource", "pods"}, {"name", "q"}, {"uid", "6d0c7e3a-1b2c-4d5e-8f90-0a1b2c3d4e5f"}});
  server_.PutClaim("ml", "shared", claim.dump());
  const std::string error = kubelet_.Prepare({{"ml", uid, "shared"}})->claims().at(uid).error();
  EXPECT_NE(error.find("claim ml/shared holds high devices (gpu-0-high) and is reserved for 2 pods"),
            std::string::npos)
      << error;
  EXPECT_TRUE(plugin_->PodPolicies().empty());
}

TEST_F(DraPluginTest, GpuThatLeftTheNodeIsAnErrorNamingIt) {
  const std::string uid = "00000000-0000-4000-8000-000000000010";
  server_.PutClaim("ml", "late", ClaimJson(uid, "late", {{.request = "gpu", .device = "gpu-1-share-0"}}));
  plugin_->SetGpus({{.index = 0, .uuid = kGpu0}});  // GPU 1 is gone
  auto reply = kubelet_.Prepare({{"ml", uid, "late"}});
  ASSERT_TRUE(reply.ok());
  const std::string error = reply->claims().at(uid).error();
  EXPECT_NE(error.find("is on GPU 1 (" + std::string(kGpu1) + "), which has left this node"),
            std::string::npos)
      << error;
  EXPECT_FALSE(std::filesystem::exists(CdiPath(uid)));
}

TEST_F(DraPluginTest, UnprepareIsIdempotentAndSurvivesRestart) {
  const std::string uid = "00000000-0000-4000-8000-000000000020";
  server_.PutClaim("ml", "c", ClaimJson(uid, "c", {{.request = "gpu", .device = "gpu-0-high"}}));
  ASSERT_EQ(kubelet_.Prepare({{"ml", uid, "c"}})->claims().at(uid).error(), "");
  ASSERT_TRUE(std::filesystem::exists(CdiPath(uid)));

  // A restarted agent knows the claim from its checkpoint: its pod keeps the priority.
  plugin_.reset();
  StartPlugin();
  ASSERT_EQ(plugin_->Claims().count(uid), 1u);
  EXPECT_EQ(plugin_->PodPolicies()[kPod].settings.priority, PodPriority::kHigh);

  for (int i = 0; i < 2; ++i) {
    auto reply = kubelet_.Unprepare({{"ml", uid, "c"}});
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->claims().count(uid), 1u);
    EXPECT_EQ(reply->claims().at(uid).error(), "") << "round " << i;
    EXPECT_FALSE(std::filesystem::exists(CdiPath(uid)));
    EXPECT_TRUE(plugin_->Claims().empty());
    EXPECT_TRUE(plugin_->PodPolicies().empty());
  }
  // Gone after a restart too.
  plugin_.reset();
  StartPlugin();
  EXPECT_TRUE(plugin_->Claims().empty());
}

TEST_F(DraPluginTest, UnreadableCheckpointIsMovedAsideNotLost) {
  plugin_.reset();
  const std::string checkpoint = dir_ + "/plugins/gpu-share.orion.io/checkpoint.json";
  { std::ofstream(checkpoint) << "{\"kind\": \"something else\"}"; }
  StartPlugin();
  EXPECT_TRUE(plugin_->Claims().empty());
  bool kept = false;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/plugins/gpu-share.orion.io")) {
    if (e.path().filename().string().rfind("checkpoint.json.bad-", 0) == 0) {
      kept = ReadFile(e.path()) == "{\"kind\": \"something else\"}";
    }
  }
  EXPECT_TRUE(kept);
}

TEST_F(DraPluginTest, PublishesResourceSlicesAndFollowsGpuChanges) {
  const std::string name = std::string(kNode) + "-gpu-share.orion.io-0";
  ASSERT_TRUE(server_.WaitFor([&] { return server_.slices_unlocked().count(name) > 0; }));
  Json slice = server_.slices()[name];
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["spec"]["driver"], "gpu-share.orion.io");
  EXPECT_EQ(slice["spec"]["nodeName"], kNode);
  EXPECT_EQ(slice["spec"]["pool"]["name"], kNode);
  EXPECT_EQ(slice["spec"]["pool"]["resourceSliceCount"], 1);
  // Owned by the Node: the garbage collector removes it with a deleted node.
  EXPECT_EQ(slice["metadata"]["ownerReferences"],
            Json::parse(R"([{"apiVersion":"v1","kind":"Node","name":"gpu-node-a",
                            "uid":"7e57a0de-0000-4000-8000-00000000a0de","controller":true}])"));
  const int64_t generation = slice["spec"]["pool"]["generation"];
  const Json& devices = slice["spec"]["devices"];
  ASSERT_EQ(devices.size(), 10u);  // 2 GPUs x (4 shares + 1 high)
  EXPECT_EQ(devices[0]["name"], "gpu-0-share-0");
  EXPECT_EQ(devices[0]["attributes"]["uuid"]["string"], kGpu0);
  EXPECT_EQ(devices[0]["attributes"]["index"]["int"], 0);
  EXPECT_EQ(devices[0]["attributes"]["high"]["bool"], false);
  EXPECT_EQ(devices[0]["attributes"]["mode"]["string"], "time-sliced");
  EXPECT_EQ(devices[0]["attributes"]["product"]["string"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(devices[0]["capacity"]["memory"]["value"], std::to_string(80ull << 30));
  EXPECT_EQ(devices[4]["name"], "gpu-0-high");
  EXPECT_EQ(devices[4]["attributes"]["high"]["bool"], true);
  EXPECT_EQ(devices[9]["name"], "gpu-1-high");
  EXPECT_EQ(devices[9]["attributes"]["uuid"]["string"], kGpu1);
  EXPECT_FALSE(devices[9]["attributes"].contains("product"));  // unknown: not published
  EXPECT_FALSE(devices[9].contains("capacity"));

  // GPU 1 leaves: the slice is replaced (PUT) with a newer generation.
  plugin_->SetGpus({{.index = 0, .uuid = kGpu0}});
  ASSERT_TRUE(server_.WaitFor([&] {
    return server_.slices_unlocked().at(name)["spec"]["devices"].size() == 5u;
  }));
  EXPECT_GT(server_.slices()[name]["spec"]["pool"]["generation"].get<int64_t>(), generation);
  bool put = false;
  for (const std::string& r : server_.requests()) put |= r.rfind("PUT ", 0) == 0;
  EXPECT_TRUE(put);
}

TEST_F(DraPluginTest, SplitsLargePoolsAndDeletesSlicesNoLongerWanted) {
  std::vector<DraGpu> many;
  for (int i = 0; i < 30; ++i) many.push_back({.index = i, .uuid = "GPU-" + std::to_string(i)});
  plugin_->SetGpus(many);  // 30 x 5 = 150 devices: two slices
  const std::string second = std::string(kNode) + "-gpu-share.orion.io-1";
  ASSERT_TRUE(server_.WaitFor([&] { return server_.slices_unlocked().count(second) > 0; }));
  auto slices = server_.slices();
  EXPECT_EQ(slices.begin()->second["spec"]["devices"].size(), 128u);
  EXPECT_EQ(slices[second]["spec"]["devices"].size(), 22u);
  EXPECT_EQ(slices[second]["spec"]["pool"]["resourceSliceCount"], 2);
  EXPECT_EQ(slices.begin()->second["spec"]["pool"]["generation"],
            slices[second]["spec"]["pool"]["generation"]);
  plugin_->SetGpus({{.index = 0, .uuid = kGpu0}});
  ASSERT_TRUE(server_.WaitFor([&] { return server_.slices_unlocked().count(second) == 0; }));
  EXPECT_EQ(server_.slices().size(), 1u);
}

TEST_F(DraPluginTest, PublicationRetriesAfterApiServerErrors) {
  plugin_.reset();
  // The Node read and the list fail, then the Node read again: the slices go out without an
  // owner, and get it once the Node answers.
  server_.FailNext(3, 500);
  StartPlugin();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!plugin_->Published() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(plugin_->Published());
  const std::string name = std::string(kNode) + "-gpu-share.orion.io-0";
  EXPECT_TRUE(server_.WaitFor([&] {
    auto it = server_.slices_unlocked().find(name);
    return it != server_.slices_unlocked().end() &&
           it->second["metadata"].contains("ownerReferences") &&
           it->second["metadata"]["ownerReferences"][0]["uid"] == kNodeUid;
  }));
  int failed_lists = 0;
  for (const std::string& r : server_.requests()) {
    failed_lists += r.rfind("GET /apis/resource.k8s.io/v1/resourceslices?", 0) == 0;
  }
  EXPECT_GE(failed_lists, 3);  // the first plugin's, the failed one, the one that worked
}

TEST_F(DraPluginTest, SlicesWithoutOwnerWhenTheNodeCannotBeRead) {
  plugin_.reset();
  TestResourceApiServer bare;  // knows no Node: as without RBAC to read it
  api_ = std::make_unique<kube::CurlKubeApi>(kube::KubeApiConfig{.base_url = bare.base_url()});
  StartPlugin();
  const std::string name = std::string(kNode) + "-gpu-share.orion.io-0";
  ASSERT_TRUE(bare.WaitFor([&] { return bare.slices_unlocked().count(name) > 0; }));
  EXPECT_FALSE(bare.slices()[name]["metadata"].contains("ownerReferences"));
  EXPECT_EQ(bare.slices()[name]["spec"]["devices"].size(), 10u);
  plugin_.reset();
}

TEST_F(DraPluginTest, ClaimSettingsReachOrionServerThroughThePolicySink) {
  RecordingSink server;
  ClaimPolicySink sink(&server, [&] { return plugin_->PodPolicies(); });
  plugin_->OnClaimsChanged([&] { (void)sink.Refresh(); });
  // The pod watcher sends the pod first (no annotations: best-effort).
  orion::v1::PodPolicy pod;
  pod.set_pod_uid(kPod);
  pod.set_namespace_("ml");
  pod.set_name("p");
  pod.set_priority(orion::v1::PRIORITY_BEST_EFFORT);
  ASSERT_TRUE(sink.Upsert({pod}, true).ok());
  EXPECT_EQ(server.last[kPod].priority(), orion::v1::PRIORITY_BEST_EFFORT);

  const std::string uid = "00000000-0000-4000-8000-000000000030";
  server_.PutClaim("ml", "serve", ClaimJson(uid, "serve", {{.request = "gpu", .device = "gpu-1-high"}},
                                            Json{{"latencyTargetMs", 5}, {"memoryLimit", "8Gi"}}));
  ASSERT_EQ(kubelet_.Prepare({{"ml", uid, "serve"}})->claims().at(uid).error(), "");
  EXPECT_EQ(server.last[kPod].priority(), orion::v1::PRIORITY_HIGH);
  EXPECT_EQ(server.last[kPod].latency_target_us(), 5000u);
  EXPECT_EQ(server.last[kPod].memory_limit_bytes(), 8ull << 30);
  ASSERT_EQ(server.last[kPod].gpu_uuids_size(), 1);
  EXPECT_EQ(server.last[kPod].gpu_uuids(0), kGpu1);
  // The watcher sends the pod again (an update): the claim still wins over the annotations.
  ASSERT_TRUE(sink.Upsert({pod}, false).ok());
  EXPECT_EQ(server.last[kPod].priority(), orion::v1::PRIORITY_HIGH);

  const int sends = server.sends;
  ASSERT_EQ(kubelet_.Unprepare({{"ml", uid, "serve"}})->claims().at(uid).error(), "");
  EXPECT_EQ(server.sends, sends + 1);
  EXPECT_EQ(server.last[kPod].priority(), orion::v1::PRIORITY_BEST_EFFORT);
  EXPECT_EQ(server.last[kPod].gpu_uuids_size(), 0);
  plugin_->OnClaimsChanged(nullptr);
}

}  // namespace
}  // namespace orion::agent
