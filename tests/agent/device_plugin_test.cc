// orion-agent's device plugin against a test kubelet (a double of the kubelet's device manager
// and the scheduler's resource fit) built from the real v1beta1 protocol: registration of both
// resources, ListAndWatch updates, Allocate contents, preferred allocation and placement (high
// slots one per GPU, best-effort shares to the idlest GPU, a container of N shares on N distinct
// GPUs, each GPU listed once in the node's order whatever devices the kubelet chose), bad device
// IDs, kubelet restart.
#include "agent/device_plugin.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_split.h"
#include "agent/pod_gpus.h"
#include "tests/agent/test_kubelet.h"

namespace orion::agent {
namespace {

using testing::TestKubelet;

constexpr char kGpu0[] = "GPU-8f4c2e1a-1111-2222-3333-444455556666";
constexpr char kGpu1[] = "GPU-0b1c2d3e-7777-8888-9999-aaaabbbbcccc";
constexpr char kShare[] = "orion.io/gpu";
constexpr char kHigh[] = "orion.io/gpu-high";

class DevicePluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/orion-dp-XXXXXX";
    dir_ = mkdtemp(tmpl);
    kubelet_ = std::make_unique<TestKubelet>(dir_);
    kubelet_->Start();
    DevicePluginConfig config;
    config.plugin_dir = dir_;
    config.shares_per_gpu = 4;
    config.poll_interval = std::chrono::milliseconds(50);
    config.layout.host_lib_dir = "/var/lib/orion/versions/0123abcd";
    plugin_ = std::make_unique<DevicePlugin>(config);
    plugin_->SetGpus({kGpu0, kGpu1});
    plugin_->Start();
  }
  void TearDown() override {
    plugin_->Stop();
    kubelet_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::unique_ptr<TestKubelet> kubelet_;
  std::unique_ptr<DevicePlugin> plugin_;
};

TEST_F(DevicePluginTest, RegistersAndListsShares) {
  ASSERT_TRUE(kubelet_->WaitFor([&] {
    return kubelet_->num_lists_unlocked() >= 1 && kubelet_->num_lists_unlocked(kHigh) >= 1;
  }));
  auto requests = kubelet_->requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].version(), "v1beta1");
  EXPECT_EQ(requests[0].endpoint(), "orion-gpu.sock");
  EXPECT_EQ(requests[0].resource_name(), "orion.io/gpu");
  EXPECT_TRUE(requests[0].options().get_preferred_allocation_available());
  // The second resource, on its own socket: one high-priority slot per GPU.
  EXPECT_EQ(requests[1].version(), "v1beta1");
  EXPECT_EQ(requests[1].endpoint(), "orion-gpu-high.sock");
  EXPECT_EQ(requests[1].resource_name(), kHigh);
  EXPECT_TRUE(requests[1].options().get_preferred_allocation_available());
  auto high = kubelet_->lists(kHigh);
  ASSERT_EQ(high[0].devices_size(), 2);
  EXPECT_EQ(high[0].devices(0).id(), std::string(kGpu0) + "::high-0");
  EXPECT_EQ(high[0].devices(1).id(), std::string(kGpu1) + "::high-0");
  // The kubelet may call ListAndWatch before the plugin's Register call has returned to it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!plugin_->Registered() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(plugin_->Registered());

  auto lists = kubelet_->lists();
  ASSERT_EQ(lists[0].devices_size(), 8);
  EXPECT_EQ(lists[0].devices(0).id(), std::string(kGpu0) + "::0");
  EXPECT_EQ(lists[0].devices(7).id(), std::string(kGpu1) + "::3");
  for (const auto& d : lists[0].devices()) EXPECT_EQ(d.health(), "Healthy");

  auto stub = kubelet_->DialPlugin("orion-gpu.sock");
  grpc::ClientContext ctx;
  v1beta1::Empty empty;
  v1beta1::DevicePluginOptions options;
  ASSERT_TRUE(stub->GetDevicePluginOptions(&ctx, empty, &options).ok());
  EXPECT_TRUE(options.get_preferred_allocation_available());
  EXPECT_FALSE(options.pre_start_required());
}

TEST_F(DevicePluginTest, ListAndWatchSendsHealthAndInventoryChanges) {
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 1; }));
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked(kHigh) >= 1; }));
  plugin_->SetGpuHealthy(kGpu1, false);
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 2; }));
  auto lists = kubelet_->lists();
  EXPECT_EQ(lists[1].devices(0).health(), "Healthy");
  EXPECT_EQ(lists[1].devices(4).health(), "Unhealthy");
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked(kHigh) >= 2; }));
  EXPECT_EQ(kubelet_->lists(kHigh)[1].devices(1).health(), "Unhealthy");

  plugin_->SetGpus({kGpu0});
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 3; }));
  EXPECT_EQ(kubelet_->lists()[2].devices_size(), 4);
}

TEST_F(DevicePluginTest, AllocateHandsOutGpuInterposerAndSocket) {
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 1; }));
  auto stub = kubelet_->DialPlugin("orion-gpu.sock");
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(std::string(kGpu1) + "::2");
  auto* two = request.add_container_requests();
  two->add_devices_ids(std::string(kGpu0) + "::0");
  two->add_devices_ids(std::string(kGpu0) + "::1");
  grpc::ClientContext ctx;
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(stub->Allocate(&ctx, request, &response).ok());
  ASSERT_EQ(response.container_responses_size(), 2);

  const auto& first = response.container_responses(0);
  EXPECT_EQ(first.envs().at("NVIDIA_VISIBLE_DEVICES"), kGpu1);
  EXPECT_EQ(first.envs().at("LD_PRELOAD"), "/usr/local/orion/lib/liborion_interpose.so");
  EXPECT_EQ(first.envs().at("NVTX_INJECTION64_PATH"), "/usr/local/orion/lib/liborion_interpose.so");
  EXPECT_EQ(first.envs().at("ORION_SOCKET"), "/run/orion/orion.sock");
  ASSERT_EQ(first.mounts_size(), 2);
  EXPECT_EQ(first.mounts(0).host_path(), "/var/lib/orion/versions/0123abcd");
  EXPECT_EQ(first.mounts(0).container_path(), "/usr/local/orion/lib");
  EXPECT_TRUE(first.mounts(0).read_only());
  EXPECT_EQ(first.mounts(1).host_path(), "/run/orion");
  EXPECT_EQ(first.mounts(1).container_path(), "/run/orion");
  EXPECT_TRUE(first.mounts(1).read_only());  // the socket only: nothing there to write
  // Two shares of one GPU: the GPU is listed once.
  EXPECT_EQ(response.container_responses(1).envs().at("NVIDIA_VISIBLE_DEVICES"), kGpu0);

  // A newly installed interposer version is handed to the next containers.
  plugin_->SetHostLibDir("/var/lib/orion/versions/feedbeef");
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub->Allocate(&ctx2, request, &response).ok());
  EXPECT_EQ(response.container_responses(0).mounts(0).host_path(),
            "/var/lib/orion/versions/feedbeef");


  grpc::ClientContext ctx4;
  v1beta1::PreStartContainerRequest pre;
  v1beta1::PreStartContainerResponse pre_out;
  EXPECT_TRUE(stub->PreStartContainer(&ctx4, pre, &pre_out).ok());
}

TEST_F(DevicePluginTest, PreferredAllocationPutsAContainersSharesOnDistinctGpus) {
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 1; }));
  auto stub = kubelet_->DialPlugin("orion-gpu.sock");
  v1beta1::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  // GPU0 has one free share, GPU1 three: a container of two shares (two ranks) gets one on
  // each, not two on the GPU with more room.
  for (const char* id : {"::3"}) c->add_available_deviceids(std::string(kGpu0) + id);
  for (const char* id : {"::0", "::1", "::2"}) c->add_available_deviceids(std::string(kGpu1) + id);
  c->set_allocation_size(2);
  grpc::ClientContext ctx;
  v1beta1::PreferredAllocationResponse response;
  ASSERT_TRUE(stub->GetPreferredAllocation(&ctx, request, &response).ok());
  ASSERT_EQ(response.container_responses_size(), 1);
  const auto& ids = response.container_responses(0).deviceids();
  ASSERT_EQ(ids.size(), 2);
  EXPECT_EQ(std::set<std::string>({GpuOfShare(ids[0]), GpuOfShare(ids[1])}),
            std::set<std::string>({kGpu0, kGpu1}));
}

// Waits until the test kubelet has both device lists (and so both plugin endpoints).
void WaitForBothLists(TestKubelet* kubelet) {
  ASSERT_TRUE(kubelet->WaitFor([&] {
    return kubelet->num_lists_unlocked(kShare) >= 1 && kubelet->num_lists_unlocked(kHigh) >= 1;
  }));
}

std::string GpuOf(const v1beta1::ContainerAllocateResponse& r) {
  return r.envs().at("NVIDIA_VISIBLE_DEVICES");
}

// Issue 34's node: 2 GPUs, 2 high-priority and 2 best-effort containers. One high-priority
// container lands on each GPU; a third is refused by the scheduler's fit (the double says so).
TEST_F(DevicePluginTest, OneHighPriorityContainerPerGpuAndAThirdRefusedByFit) {
  WaitForBothLists(kubelet_.get());
  std::map<std::string, std::vector<std::string>> devices;
  auto h1 = kubelet_->AdmitContainer("infer-1", {{kHigh, 1}}, &devices);
  ASSERT_TRUE(h1.ok()) << h1.status();
  ASSERT_EQ(devices[kHigh].size(), 1u);
  // The slot is the container's place: its GPU is the slot's, with the interposer and socket.
  const std::string gpu_h1 = GpuOfShare(devices[kHigh][0]);
  EXPECT_EQ(GpuOf(h1->at(kHigh)), gpu_h1);
  EXPECT_EQ(h1->at(kHigh).envs().at("LD_PRELOAD"), "/usr/local/orion/lib/liborion_interpose.so");
  EXPECT_EQ(h1->at(kHigh).envs().at("ORION_SOCKET"), "/run/orion/orion.sock");
  EXPECT_EQ(h1->at(kHigh).mounts_size(), 2);

  auto b1 = kubelet_->AdmitContainer("train-1", {{kShare, 1}});
  ASSERT_TRUE(b1.ok()) << b1.status();
  auto h2 = kubelet_->AdmitContainer("infer-2", {{kHigh, 1}}, &devices);
  ASSERT_TRUE(h2.ok()) << h2.status();
  auto b2 = kubelet_->AdmitContainer("train-2", {{kShare, 1}});
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_NE(GpuOf(h1->at(kHigh)), GpuOf(h2->at(kHigh)));
  EXPECT_EQ(GpuOf(h2->at(kHigh)), GpuOfShare(devices[kHigh][0]));
  // Without busy figures the best-effort shares spread over both GPUs.
  EXPECT_NE(GpuOf(b1->at(kShare)), GpuOf(b2->at(kShare)));

  auto h3 = kubelet_->AdmitContainer("infer-3", {{kHigh, 1}});
  ASSERT_FALSE(h3.ok());
  EXPECT_EQ(h3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(h3.status().message().find("Insufficient orion.io/gpu-high"), std::string::npos)
      << h3.status();
  // Once a high-priority pod goes, its GPU takes the next one.
  kubelet_->Release("infer-1");
  auto h4 = kubelet_->AdmitContainer("infer-4", {{kHigh, 1}});
  ASSERT_TRUE(h4.ok()) << h4.status();
  EXPECT_EQ(GpuOf(h4->at(kHigh)), gpu_h1);
}

// The GPUs of a container's answer, as NVIDIA_VISIBLE_DEVICES lists them.
std::vector<std::string> VisibleGpus(const v1beta1::ContainerAllocateResponse& r) {
  return absl::StrSplit(r.envs().at("NVIDIA_VISIBLE_DEVICES"), ',');
}

// A torchrun pod of 2 ranks on the 2-GPU node asks for orion.io/gpu: 2 and gets one share on
// each GPU; NVIDIA_VISIBLE_DEVICES lists both, each once, in the node's order (kGpu0 first,
// though its UUID sorts last and the kubelet hands the IDs in an order of its own), and the
// GPUs the agent tells orion-server the pod may register on (from the kubelet's pod resources)
// are the same two: what the ranks' interposers register on is what the container sees.
TEST_F(DevicePluginTest, ContainerOfTwoSharesGetsOneOnEachOfTwoGpus) {
  WaitForBothLists(kubelet_.get());
  auto single = kubelet_->AdmitContainer("train-1", {{kShare, 1}});  // one rank, as before
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(VisibleGpus(single->at(kShare)).size(), 1u);

  std::map<std::string, std::vector<std::string>> devices;
  auto ddp = kubelet_->AdmitContainer("ddp-0", {{kShare, 2}}, &devices);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  ASSERT_EQ(devices[kShare].size(), 2u);
  EXPECT_NE(GpuOfShare(devices[kShare][0]), GpuOfShare(devices[kShare][1]))
      << devices[kShare][0] << " " << devices[kShare][1];
  EXPECT_EQ(VisibleGpus(ddp->at(kShare)), (std::vector<std::string>{kGpu0, kGpu1}));
  EXPECT_EQ(ddp->at(kShare).envs().at("LD_PRELOAD"), "/usr/local/orion/lib/liborion_interpose.so");

  ::v1::ListPodResourcesResponse list;
  ::v1::PodResources* pod = list.add_pod_resources();
  pod->set_namespace_("ml");
  pod->set_name("ddp");
  ::v1::ContainerDevices* held = pod->add_containers()->add_devices();
  held->set_resource_name(kShare);
  for (const std::string& id : devices[kShare]) held->add_device_ids(id);
  std::vector<std::string> server_gpus = GpusByPod(list, {kShare, kHigh})["ml/ddp"];
  std::vector<std::string> visible = VisibleGpus(ddp->at(kShare));
  std::sort(visible.begin(), visible.end());
  EXPECT_EQ(server_gpus, visible);

  // Two more pods of two ranks: each again one share per GPU (4 shares per GPU: 1 + 1 + 1 + 1
  // taken on one, 1 + 1 + 1 on the other).
  for (const char* name : {"ddp-1", "ddp-2"}) {
    auto r = kubelet_->AdmitContainer(name, {{kShare, 2}}, &devices);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_EQ(VisibleGpus(r->at(kShare)), (std::vector<std::string>{kGpu0, kGpu1})) << name;
  }
}

// Allocate cannot change the devices the kubelet chose, which may sit on one GPU (a kubelet
// that skips the preferred answer, or a node with fewer GPUs with a free share than ranks): the
// container gets the GPUs they name, each once, in the node's order whatever order the IDs
// come in; and when only one GPU has free shares, the preferred answer is still full-sized.
TEST_F(DevicePluginTest, AllocateListsEachGpuOnceInTheNodesOrderWhateverTheKubeletChose) {
  WaitForBothLists(kubelet_.get());
  std::map<std::string, std::vector<std::string>> devices;
  auto own_choice = kubelet_->AdmitContainer("ddp-0", {{kShare, 3}}, &devices,
                                             TestKubelet::Admission{.use_preferred = false});
  ASSERT_TRUE(own_choice.ok()) << own_choice.status();
  // The test kubelet's own choice: the last free devices listed, all three on GPU1.
  for (const std::string& id : devices[kShare]) EXPECT_EQ(GpuOfShare(id), kGpu1) << id;
  EXPECT_EQ(VisibleGpus(own_choice->at(kShare)), std::vector<std::string>{kGpu1});

  auto stub = kubelet_->DialPlugin("orion-gpu.sock");
  const std::string g0 = kGpu0, g1 = kGpu1;
  for (const std::vector<std::string>& ids :
       {std::vector<std::string>{g1 + "::0", g0 + "::2", g1 + "::3"},
        std::vector<std::string>{g0 + "::2", g1 + "::3", g1 + "::0"}}) {
    v1beta1::AllocateRequest request;
    for (const std::string& id : ids) request.add_container_requests()->add_devices_ids(id);
    auto* all = request.add_container_requests();
    for (const std::string& id : ids) all->add_devices_ids(id);
    grpc::ClientContext ctx;
    v1beta1::AllocateResponse response;
    ASSERT_TRUE(stub->Allocate(&ctx, request, &response).ok());
    ASSERT_EQ(response.container_responses_size(), 4);
    EXPECT_EQ(VisibleGpus(response.container_responses(3)), (std::vector<std::string>{g0, g1}));
  }

  // GPU1 has one share left, GPU0 four: two ranks get one on each; three ranks cannot have three
  // GPUs, and the answer still names three shares, as spread as the free ones allow.
  std::vector<std::string> free = {g0 + "::0", g0 + "::1", g0 + "::2", g0 + "::3", g1 + "::3"};
  std::vector<std::string> two = PreferredShares(free, {}, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(GpusOfDevices(two, {g0, g1}), (std::vector<std::string>{g0, g1}));
  std::vector<std::string> three = PreferredShares(free, {}, 3);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(GpusOfDevices(three, {g0, g1}), (std::vector<std::string>{g0, g1}));
}

// Best-effort shares go to the GPU with the most idle time by orion-server's figures; within
// the tolerance they spread (most free shares); a GPU the server does not know counts as idle.
TEST_F(DevicePluginTest, BestEffortSharesGoToTheIdlestGpu) {
  WaitForBothLists(kubelet_.get());
  plugin_->SetGpuIdle({{kGpu0, 0.1}, {kGpu1, 0.7}});
  for (const char* name : {"train-1", "train-2", "train-3"}) {
    auto r = kubelet_->AdmitContainer(name, {{kShare, 1}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(GpuOf(r->at(kShare)), kGpu1) << name;
  }
  // Equal within kIdleTolerance: the GPU with more free shares (GPU0: 4, GPU1: 1).
  plugin_->SetGpuIdle({{kGpu0, 0.50}, {kGpu1, 0.53}});
  auto r = kubelet_->AdmitContainer("train-4", {{kShare, 1}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(GpuOf(r->at(kShare)), kGpu0);
  // GPU1 unknown to the server (never ran a client): idle, so preferred over a busy GPU0.
  plugin_->SetGpuIdle({{kGpu0, 0.2}});
  r = kubelet_->AdmitContainer("train-5", {{kShare, 1}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(GpuOf(r->at(kShare)), kGpu1);
  // High-priority slots follow the same rule among the GPUs with a free slot.
  plugin_->SetGpuIdle({{kGpu0, 0.9}, {kGpu1, 0.2}});
  r = kubelet_->AdmitContainer("infer-1", {{kHigh, 1}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(GpuOf(r->at(kHigh)), kGpu0);
}

// Bad device IDs get a clear error naming the device and the resource; nothing is handed out
// for the request and later good requests still work.
TEST_F(DevicePluginTest, UnknownDevicesAndGpusThatLeftAreRefusedClearly) {
  WaitForBothLists(kubelet_.get());
  auto share = kubelet_->DialPlugin("orion-gpu.sock");
  auto high = kubelet_->DialPlugin("orion-gpu-high.sock");
  auto allocate = [](v1beta1::DevicePlugin::Stub* stub, std::vector<std::string> ids,
                     v1beta1::AllocateResponse* out) {
    v1beta1::AllocateRequest request;
    auto* c = request.add_container_requests();
    for (const std::string& id : ids) c->add_devices_ids(id);
    grpc::ClientContext ctx;
    return stub->Allocate(&ctx, request, out);
  };
  v1beta1::AllocateResponse response;
  struct Case {
    v1beta1::DevicePlugin::Stub* stub;
    std::string id, want;
  };
  const std::string g0 = kGpu0;
  for (const Case& c : std::vector<Case>{
           {share.get(), "GPU-not-ours::0",
            "unknown device \"GPU-not-ours::0\" for orion.io/gpu: GPU GPU-not-ours is not one"},
           {share.get(), "no-separator", "no GPU UUID in it"},
           {share.get(), g0 + "::4", "index \"4\" is not in 0..3"},
           {share.get(), g0 + "::high-0", "unknown device"},
           {high.get(), g0 + "::0", "not a high slot"},
           {high.get(), g0 + "::high-1", "index \"1\" is not in 0..0"}}) {
    response.Clear();
    // A good device first: one bad ID fails the whole request.
    const std::string good = c.stub == share.get() ? g0 + "::0" : g0 + "::high-0";
    grpc::Status s = allocate(c.stub, {good, c.id}, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.id;
    EXPECT_NE(s.error_message().find(c.want), std::string::npos) << s.error_message();
    EXPECT_EQ(response.container_responses_size(), 0) << c.id;
  }
  // A GPU that left the node (the kubelet's checkpoint may still name it).
  plugin_->SetGpus({kGpu0});
  grpc::Status s = allocate(high.get(), {std::string(kGpu1) + "::high-0"}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find(std::string("names GPU ") + kGpu1 +
                                   ", which has left this node"),
            std::string::npos)
      << s.error_message();
  // Nothing lost: the GPU still on the node is handed out as before.
  ASSERT_TRUE(allocate(high.get(), {g0 + "::high-0"}, &response).ok());
  EXPECT_EQ(response.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), g0);
}

TEST(GpuIdleEstimator, IdleFractionBetweenTwoReadings) {
  GpuIdleEstimator e;
  EXPECT_TRUE(e.Update({{"GPU-a", 10.0}, {"GPU-b", 3.0}}, 100.0).empty());  // no interval yet
  GpuIdle idle = e.Update({{"GPU-a", 14.0}, {"GPU-b", 3.5}, {"GPU-c", 1.0}}, 105.0);
  EXPECT_NEAR(idle.at("GPU-a"), 0.2, 1e-9);
  EXPECT_NEAR(idle.at("GPU-b"), 0.9, 1e-9);
  EXPECT_EQ(idle.count("GPU-c"), 0u);  // first seen: no figure (counts as idle)
  // A restarted server's counters start again: no figure; more busy than wall time: 0.
  idle = e.Update({{"GPU-a", 0.5}, {"GPU-b", 20.0}, {"GPU-c", 1.0}}, 110.0);
  EXPECT_EQ(idle.count("GPU-a"), 0u);
  EXPECT_EQ(idle.at("GPU-b"), 0.0);
  EXPECT_EQ(idle.at("GPU-c"), 1.0);
}

TEST_F(DevicePluginTest, RegistersAgainAfterKubeletRestart) {
  WaitForBothLists(kubelet_.get());
  EXPECT_EQ(plugin_->Registrations(), 1);
  kubelet_->Restart();
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_requests_unlocked() >= 4; }));
  ASSERT_TRUE(kubelet_->WaitFor([&] {
    return kubelet_->num_lists_unlocked(kShare) >= 2 && kubelet_->num_lists_unlocked(kHigh) >= 2;
  }));
  // The plugin counts a registration when the kubelet's Register reply reaches it, which can be
  // after the kubelet already listed the devices: poll (kubelet notifications do not cover it).
  for (int i = 0; i < 500 && plugin_->Registrations() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(plugin_->Registrations(), 2);
  EXPECT_EQ(kubelet_->lists().back().devices_size(), 8);
  // The new socket serves Allocate.
  auto stub = kubelet_->DialPlugin("orion-gpu.sock");
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(std::string(kGpu0) + "::0");
  grpc::ClientContext ctx;
  v1beta1::AllocateResponse response;
  EXPECT_TRUE(stub->Allocate(&ctx, request, &response).ok());
}

// With a CDI-only container toolkit the GPUs go as CDI device names (through the CRI, or as an
// annotation), and NVIDIA_VISIBLE_DEVICES is "void" so an image's own "all" cannot widen them.
TEST(ContainerAllocation, CdiDeviceNamesInsteadOfTheVariable) {
  ContainerLayout layout;
  layout.host_lib_dir = "/var/lib/orion/versions/0123abcd";
  const std::vector<std::string> shares = {std::string(kGpu0) + "::0", std::string(kGpu0) + "::3",
                                           std::string(kGpu1) + "::1"};
  DeviceListStrategy strategy;
  ASSERT_TRUE(ParseDeviceListStrategy("cdi-cri", &strategy));
  layout.device_list = strategy;
  const std::vector<std::string> node = {kGpu0, kGpu1};
  v1beta1::ContainerAllocateResponse cri = ContainerAllocation(shares, layout, node);
  ASSERT_EQ(cri.cdi_devices_size(), 2);
  EXPECT_EQ(cri.cdi_devices(0).name(), std::string("nvidia.com/gpu=") + kGpu0);
  EXPECT_EQ(cri.cdi_devices(1).name(), std::string("nvidia.com/gpu=") + kGpu1);
  EXPECT_EQ(cri.envs().at("NVIDIA_VISIBLE_DEVICES"), "void");
  EXPECT_TRUE(cri.annotations().empty());
  EXPECT_EQ(cri.envs().at("LD_PRELOAD"), "/usr/local/orion/lib/liborion_interpose.so");

  ASSERT_TRUE(ParseDeviceListStrategy("cdi-annotations", &strategy));
  layout.device_list = strategy;
  v1beta1::ContainerAllocateResponse annotated = ContainerAllocation(shares, layout, node);
  EXPECT_EQ(annotated.cdi_devices_size(), 0);
  EXPECT_EQ(annotated.annotations().at("cdi.k8s.io/orion-gpu-share_gpus"),
            std::string("nvidia.com/gpu=") + kGpu0 + ",nvidia.com/gpu=" + kGpu1);

  ASSERT_TRUE(ParseDeviceListStrategy("envvar", &strategy));
  layout.device_list = strategy;
  v1beta1::ContainerAllocateResponse plain = ContainerAllocation(shares, layout, node);
  EXPECT_EQ(plain.envs().at("NVIDIA_VISIBLE_DEVICES"), std::string(kGpu0) + "," + kGpu1);
  // Without the node's order: by UUID, the same whatever order the IDs come in.
  const std::vector<std::string> reversed(shares.rbegin(), shares.rend());
  for (const auto& ids : {shares, reversed}) {
    EXPECT_EQ(ContainerAllocation(ids, layout).envs().at("NVIDIA_VISIBLE_DEVICES"),
              std::string(kGpu1) + "," + kGpu0);
  }
  // GPUs given whole (a DRA claim's), one named twice: listed once.
  EXPECT_EQ(ContainerAllocationForGpus({kGpu1, kGpu0, kGpu1}, layout)
                .envs()
                .at("NVIDIA_VISIBLE_DEVICES"),
            std::string(kGpu1) + "," + kGpu0);
  EXPECT_EQ(plain.cdi_devices_size(), 0);
  EXPECT_FALSE(ParseDeviceListStrategy("volume-mounts", &strategy));
}

// With the chart's MPS daemon, containers find its pipe and share its /dev/shm.
TEST(ContainerAllocation, MpsDaemonPipeAndSharedMemory) {
  ContainerLayout layout;
  layout.host_lib_dir = "/var/lib/orion/versions/0123abcd";
  v1beta1::ContainerAllocateResponse without = ContainerAllocation({std::string(kGpu0) + "::0"},
                                                                  layout);
  EXPECT_EQ(without.envs().count("CUDA_MPS_PIPE_DIRECTORY"), 0u);
  EXPECT_EQ(without.mounts_size(), 2);
  layout.mps_pipe_dir = "/run/orion/mps/pipe";
  layout.mps_shm_dir = "/run/orion/mps/shm";
  v1beta1::ContainerAllocateResponse with = ContainerAllocation({std::string(kGpu0) + "::0"},
                                                               layout);
  EXPECT_EQ(with.envs().at("CUDA_MPS_PIPE_DIRECTORY"), "/run/orion/mps/pipe");
  ASSERT_EQ(with.mounts_size(), 4);
  EXPECT_TRUE(with.mounts(1).read_only());
  EXPECT_EQ(with.mounts(2).host_path(), "/run/orion/mps/pipe");  // writable inside the ro run dir
  EXPECT_EQ(with.mounts(2).container_path(), "/run/orion/mps/pipe");
  EXPECT_FALSE(with.mounts(2).read_only());
  EXPECT_EQ(with.mounts(3).host_path(), "/run/orion/mps/shm");
  EXPECT_EQ(with.mounts(3).container_path(), "/dev/shm");
  EXPECT_FALSE(with.mounts(3).read_only());
}

TEST(PreferredShares, MustIncludeFirstThenOtherGpus) {
  std::vector<std::string> available = ShareIds({"GPU-a", "GPU-b", "GPU-c"}, 3);
  std::vector<std::string> chosen = PreferredShares(available, {"GPU-b::1"}, 3);
  ASSERT_EQ(chosen.size(), 3u);
  EXPECT_EQ(chosen[0], "GPU-b::1");
  // The GPU of must_include counts as the container's: the next two go to a and c.
  EXPECT_EQ(std::set<std::string>({GpuOfShare(chosen[1]), GpuOfShare(chosen[2])}),
            std::set<std::string>({"GPU-a", "GPU-c"}));
  EXPECT_EQ(PreferredShares({"GPU-a::0"}, {}, 2).size(), 1u);
}

TEST(PreferredShares, RanksGoToDistinctGpusIdlestFirst) {
  std::vector<std::string> available = ShareIds({"GPU-a", "GPU-b", "GPU-c", "GPU-d"}, 4);
  const GpuIdle idle = {{"GPU-a", 0.1}, {"GPU-b", 0.9}, {"GPU-c", 0.5}, {"GPU-d", 0.3}};
  std::vector<std::string> chosen = PreferredShares(available, {}, 3, idle);
  ASSERT_EQ(chosen.size(), 3u);
  EXPECT_EQ(GpuOfShare(chosen[0]), "GPU-b");
  EXPECT_EQ(GpuOfShare(chosen[1]), "GPU-c");
  EXPECT_EQ(GpuOfShare(chosen[2]), "GPU-d");
  // One share: the idlest GPU, as before.
  EXPECT_EQ(GpuOfShare(PreferredShares(available, {}, 1, idle)[0]), "GPU-b");
  // Without figures: the GPUs with the most free shares; then by UUID.
  std::vector<std::string> uneven = {"GPU-a::0", "GPU-b::0", "GPU-b::1", "GPU-c::0", "GPU-c::1",
                                     "GPU-c::2"};
  chosen = PreferredShares(uneven, {}, 2);
  EXPECT_EQ(GpuOfShare(chosen[0]), "GPU-c");
  EXPECT_EQ(GpuOfShare(chosen[1]), "GPU-b");
  // More ranks than GPUs with a free share: every GPU once, then a second share where most are
  // free, until the size is met.
  chosen = PreferredShares(uneven, {}, 5);
  ASSERT_EQ(chosen.size(), 5u);
  std::map<std::string, int> per_gpu;
  for (const std::string& id : chosen) ++per_gpu[GpuOfShare(id)];
  EXPECT_EQ(per_gpu, (std::map<std::string, int>{{"GPU-a", 1}, {"GPU-b", 2}, {"GPU-c", 2}}));
  EXPECT_EQ(std::set<std::string>(chosen.begin(), chosen.end()).size(), 5u);
}

TEST(GpusOfDevices, EachGpuOnceInTheNodesOrder) {
  const std::vector<std::string> node = {"GPU-z", "GPU-a", "GPU-m"};
  EXPECT_EQ(GpusOfDevices({"GPU-m::1", "GPU-z::0", "GPU-m::0", "GPU-a::high-0"}, node),
            (std::vector<std::string>{"GPU-z", "GPU-a", "GPU-m"}));
  EXPECT_EQ(GpusOfDevices({"GPU-m::1", "GPU-m::3"}, node), std::vector<std::string>{"GPU-m"});
  // A GPU the node does not list comes last, by UUID; an ID without a GPU names none.
  EXPECT_EQ(GpusOfDevices({"GPU-q::0", "GPU-b::0", "GPU-m::0", "junk"}, node),
            (std::vector<std::string>{"GPU-m", "GPU-b", "GPU-q"}));
}

}  // namespace
}  // namespace orion::agent
