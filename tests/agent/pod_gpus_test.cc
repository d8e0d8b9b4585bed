// The GPUs each pod was allocated, as orion-agent learns them from the kubelet's pod resources
// API and adds them to the pod policies it sends orion-server: the pure mapping, and the sink in
// front of AgentSync against a test kubelet serving the real gRPC List on a Unix socket.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "tests/agent/test_pod_resources.h"
#include "agent/pod_gpus.h"
#include "agent/share_allocation.h"

namespace orion::agent {
namespace {

constexpr char kGpuA[] = "GPU-aaaaaaaa-1111-2222-3333-444444444444";
constexpr char kGpuB[] = "GPU-bbbbbbbb-1111-2222-3333-444444444444";

void AddContainer(::v1::PodResources* pod, const std::string& resource,
                  const std::vector<std::string>& ids) {
  auto* devices = pod->add_containers()->add_devices();
  devices->set_resource_name(resource);
  for (const std::string& id : ids) devices->add_device_ids(id);
}

TEST(GpusByPodTest, OurSharesOfEachPodByGpu) {
  ::v1::ListPodResourcesResponse list;
  auto* serve = list.add_pod_resources();
  serve->set_namespace_("ml");
  serve->set_name("serve-0");
  AddContainer(serve, "orion.io/gpu", {ShareId(kGpuB, 3), ShareId(kGpuB, 4)});
  AddContainer(serve, "orion.io/gpu", {ShareId(kGpuA, 0)});
  AddContainer(serve, "nvidia.com/gpu", {kGpuB});  // another plugin's: not ours
  auto* other = list.add_pod_resources();
  other->set_namespace_("ml");
  other->set_name("cpu-only");
  AddContainer(other, "orion.io/gpu", {"not-a-share"});
  const auto gpus = GpusByPod(list, {"orion.io/gpu"});
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus.at("ml/serve-0"), (std::vector<std::string>{kGpuA, kGpuB}));
}

using orion::agent::test_doubles::TestPodResources;

// Records what would go to orion-server.
class RecordingSink final : public PolicySink {
 public:
  absl::Status Upsert(const std::vector<orion::v1::PodPolicy>& pods, bool full_sync) override {
    sent.push_back({pods, full_sync});
    return absl::OkStatus();
  }
  absl::Status Delete(const std::string&) override { return absl::OkStatus(); }
  struct Send {
    std::vector<orion::v1::PodPolicy> pods;
    bool full_sync;
  };
  std::vector<Send> sent;
};

std::vector<std::string> Gpus(const orion::v1::PodPolicy& p) {
  return {p.gpu_uuids().begin(), p.gpu_uuids().end()};
}

// A pod holding the high-priority slot of GPU A and a share of GPU B: both are its GPUs, only A
// is where it is high (the server makes it best-effort on B). Without high-priority slots on
// the node, a high pod is high on all its GPUs.
TEST(GpuAllocationSinkTest, HighGpusAreThoseOfTheHighSlot) {
  ::v1::ListPodResourcesResponse list;
  auto* pr = list.add_pod_resources();
  pr->set_namespace_("ml");
  pr->set_name("serve-0");
  AddContainer(pr, "orion.io/gpu-high", {ShareId(kGpuA, 0)});
  AddContainer(pr, "orion.io/gpu", {ShareId(kGpuB, 1)});
  orion::v1::PodPolicy pod;
  pod.set_pod_uid("0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab");
  pod.set_namespace_("ml");
  pod.set_name("serve-0");
  pod.set_priority(orion::v1::PRIORITY_HIGH);
  pod.add_high_gpu_uuids("GPU-forged");  // replaced by the kubelet's word
  RecordingSink inner;
  GpuAllocationSink sink(&inner, [&] { return list; }, {"orion.io/gpu", "orion.io/gpu-high"},
                         "orion.io/gpu-high");
  ASSERT_TRUE(sink.Upsert({pod}, true).ok());
  const orion::v1::PodPolicy& sent = inner.sent.back().pods[0];
  EXPECT_EQ(Gpus(sent), (std::vector<std::string>{kGpuA, kGpuB}));
  EXPECT_EQ(std::vector<std::string>(sent.high_gpu_uuids().begin(), sent.high_gpu_uuids().end()),
            std::vector<std::string>{kGpuA});
  EXPECT_EQ(*sink.Refresh(), 0);  // nothing changed: nothing sent again

  RecordingSink no_slots_inner;
  GpuAllocationSink no_slots(&no_slots_inner, [&] { return list; },
                             {"orion.io/gpu", "orion.io/gpu-high"}, "");
  ASSERT_TRUE(no_slots.Upsert({pod}, true).ok());
  EXPECT_EQ(no_slots_inner.sent.back().pods[0].high_gpu_uuids_size(), 2);
  EXPECT_EQ(*no_slots.Refresh(), 0);
}

TEST(GpuAllocationSinkTest, PoliciesCarryTheKubeletsAllocationOnceKnown) {
  char tmpl[] = "/tmp/orion-podres-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string socket = std::string(tmpl) + "/kubelet.sock";
  TestPodResources kubelet;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&kubelet);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  PodResourcesClient client(socket);
  RecordingSink inner;
  GpuAllocationSink sink(&inner, [&] { return client.List(); }, {"orion.io/gpu"});
  orion::v1::PodPolicy pod;
  pod.set_pod_uid("0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab");
  pod.set_namespace_("ml");
  pod.set_name("serve-0");
  pod.set_priority(orion::v1::PRIORITY_HIGH);
  pod.add_gpu_uuids("GPU-forged");  // whatever came in is replaced by the kubelet's word

  // Seen before its containers exist: sent without GPUs (the server allows the node's).
  ASSERT_TRUE(sink.Upsert({pod}, /*full_sync=*/true).ok());
  ASSERT_EQ(inner.sent.size(), 1u);
  EXPECT_TRUE(inner.sent[0].full_sync);
  EXPECT_TRUE(Gpus(inner.sent[0].pods[0]).empty());
  EXPECT_EQ(*sink.Refresh(), 0);  // still nothing allocated: nothing to send

  // The kubelet allocated it a share of GPU B: the next refresh sends the pod again with it.
  ::v1::ListPodResourcesResponse list;
  auto* pr = list.add_pod_resources();
  pr->set_namespace_("ml");
  pr->set_name("serve-0");
  AddContainer(pr, "orion.io/gpu", {ShareId(kGpuB, 1)});
  kubelet.Set(list);
  EXPECT_EQ(*sink.Refresh(), 1);
  ASSERT_EQ(inner.sent.size(), 2u);
  EXPECT_FALSE(inner.sent[1].full_sync);
  EXPECT_EQ(inner.sent[1].pods[0].priority(), orion::v1::PRIORITY_HIGH);  // the rest unchanged
  EXPECT_EQ(Gpus(inner.sent[1].pods[0]), std::vector<std::string>{kGpuB});
  EXPECT_EQ(*sink.Refresh(), 0);  // unchanged since
  EXPECT_EQ(inner.sent.size(), 2u);

  // An update from the pod watcher carries the allocation too.
  pod.set_memory_limit_bytes(1 << 30);
  ASSERT_TRUE(sink.Upsert({pod}, false).ok());
  EXPECT_EQ(Gpus(inner.sent.back().pods[0]), std::vector<std::string>{kGpuB});

  // The kubelet gone: policies keep the last allocation known, nothing fails.
  server->Shutdown();
  server.reset();
  ASSERT_TRUE(sink.Upsert({pod}, false).ok());
  EXPECT_EQ(Gpus(inner.sent.back().pods[0]), std::vector<std::string>{kGpuB});
  EXPECT_EQ(*sink.Refresh(), 0);
  EXPECT_EQ(std::system((std::string("rm -rf ") + tmpl).c_str()), 0);
}

}  // namespace
}  // namespace orion::agent
