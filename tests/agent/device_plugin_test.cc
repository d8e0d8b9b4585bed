// orion-agent's device plugin against a test kubelet built from the real v1beta1 protocol:
// registration, ListAndWatch updates, Allocate contents, preferred allocation, kubelet restart.
#include "agent/device_plugin.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/agent/test_kubelet.h"

namespace orion::agent {
namespace {

using testing::TestKubelet;

constexpr char kGpu0[] = "GPU-8f4c2e1a-1111-2222-3333-444455556666";
constexpr char kGpu1[] = "GPU-0b1c2d3e-7777-8888-9999-aaaabbbbcccc";

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
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 1; }));
  auto requests = kubelet_->requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].version(), "v1beta1");
  EXPECT_EQ(requests[0].endpoint(), "orion-gpu.sock");
  EXPECT_EQ(requests[0].resource_name(), "orion.io/gpu");
  EXPECT_TRUE(requests[0].options().get_preferred_allocation_available());
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
  plugin_->SetGpuHealthy(kGpu1, false);
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 2; }));
  auto lists = kubelet_->lists();
  EXPECT_EQ(lists[1].devices(0).health(), "Healthy");
  EXPECT_EQ(lists[1].devices(4).health(), "Unhealthy");

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

  v1beta1::AllocateRequest bad;
  bad.add_container_requests()->add_devices_ids("GPU-not-ours::0");
  grpc::ClientContext ctx3;
  EXPECT_EQ(stub->Allocate(&ctx3, bad, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext ctx4;
  v1beta1::PreStartContainerRequest pre;
  v1beta1::PreStartContainerResponse pre_out;
  EXPECT_TRUE(stub->PreStartContainer(&ctx4, pre, &pre_out).ok());
}

TEST_F(DevicePluginTest, PreferredAllocationKeepsSharesOfOneGpuTogether) {
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 1; }));
  auto stub = kubelet_->DialPlugin("orion-gpu.sock");
  v1beta1::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  // GPU0 has one free share, GPU1 three: two shares go to GPU1.
  for (const char* id : {"::3"}) c->add_available_deviceids(std::string(kGpu0) + id);
  for (const char* id : {"::0", "::1", "::2"}) c->add_available_deviceids(std::string(kGpu1) + id);
  c->set_allocation_size(2);
  grpc::ClientContext ctx;
  v1beta1::PreferredAllocationResponse response;
  ASSERT_TRUE(stub->GetPreferredAllocation(&ctx, request, &response).ok());
  ASSERT_EQ(response.container_responses_size(), 1);
  const auto& ids = response.container_responses(0).deviceids();
  ASSERT_EQ(ids.size(), 2);
  EXPECT_EQ(GpuOfShare(ids[0]), kGpu1);
  EXPECT_EQ(GpuOfShare(ids[1]), kGpu1);
}

TEST_F(DevicePluginTest, RegistersAgainAfterKubeletRestart) {
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 1; }));
  EXPECT_EQ(plugin_->Registrations(), 1);
  kubelet_->Restart();
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_requests_unlocked() >= 2; }));
  ASSERT_TRUE(kubelet_->WaitFor([&] { return kubelet_->num_lists_unlocked() >= 2; }));
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
  v1beta1::ContainerAllocateResponse cri = ContainerAllocation(shares, layout);
  ASSERT_EQ(cri.cdi_devices_size(), 2);
  EXPECT_EQ(cri.cdi_devices(0).name(), std::string("nvidia.com/gpu=") + kGpu0);
  EXPECT_EQ(cri.cdi_devices(1).name(), std::string("nvidia.com/gpu=") + kGpu1);
  EXPECT_EQ(cri.envs().at("NVIDIA_VISIBLE_DEVICES"), "void");
  EXPECT_TRUE(cri.annotations().empty());
  EXPECT_EQ(cri.envs().at("LD_PRELOAD"), "/usr/local/orion/lib/liborion_interpose.so");

  ASSERT_TRUE(ParseDeviceListStrategy("cdi-annotations", &strategy));
  layout.device_list = strategy;
  v1beta1::ContainerAllocateResponse annotated = ContainerAllocation(shares, layout);
  EXPECT_EQ(annotated.cdi_devices_size(), 0);
  EXPECT_EQ(annotated.annotations().at("cdi.k8s.io/orion-gpu-share_gpus"),
            std::string("nvidia.com/gpu=") + kGpu0 + ",nvidia.com/gpu=" + kGpu1);

  ASSERT_TRUE(ParseDeviceListStrategy("envvar", &strategy));
  layout.device_list = strategy;
  v1beta1::ContainerAllocateResponse plain = ContainerAllocation(shares, layout);
  EXPECT_EQ(plain.envs().at("NVIDIA_VISIBLE_DEVICES"), std::string(kGpu0) + "," + kGpu1);
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

TEST(PreferredShares, MustIncludeFirstThenSameGpu) {
  std::vector<std::string> available = ShareIds({"GPU-a", "GPU-b"}, 3);
  std::vector<std::string> chosen = PreferredShares(available, {"GPU-b::1"}, 3);
  ASSERT_EQ(chosen.size(), 3u);
  EXPECT_EQ(chosen[0], "GPU-b::1");
  EXPECT_EQ(GpuOfShare(chosen[1]), "GPU-b");
  EXPECT_EQ(GpuOfShare(chosen[2]), "GPU-b");
  EXPECT_EQ(PreferredShares({"GPU-a::0"}, {}, 2).size(), 1u);
}

}  // namespace
}  // namespace orion::agent
