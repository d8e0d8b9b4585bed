// A pod's whole path through one node, without a cluster: the real orion-agent binary (device
// plugin against a test kubelet speaking the real v1beta1 protocol, pod watcher against a test
// API server replaying recorded API-server JSON), the real orion-server (in process, with a
// recorded /proc tree standing in for the kernel's view of the pod's cgroup), the webhook's
// handling of the AdmissionReview a real API server sends, and then the container the kubelet
// would start: the Allocate response's environment and mounts applied to a process (the mounts by
// rewriting container paths to their host paths), running a sample on the CUDA driver test
// double. It checks, in order: the webhook's patch, the device plugin's registration and
// allocation, the interposer loaded from the mounted (versioned) folder, registration with the
// pod's identity from its cgroup, priority high on the board from the pod's annotation (the
// process asked for nothing), metrics labelled with the pod's namespace and name, the timeline's
// spans, an upgrade that installs newer interposers while the pod runs (its version stays), an
// agent restart that re-registers the device plugin and re-applies the pod's (changed)
// annotation to the running client, and the pod's removal when the API server reports it
// deleted (then its version is pruned).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "podresources/v1/api.grpc.pb.h"
#include "tests/http_get.h"
#include "tests/registered_client.h"
#include "absl/strings/escaping.h"
#include "tests/agent/test_pod_resources.h"
#include "agent/admission.h"
#include "agent/interposer_install.h"
#include "server/orion_server.h"
#include "tests/agent/test_api_server.h"
#include "tests/agent/test_kubelet.h"

namespace {

using orion::agent::testing::TestApiServer;
using orion::agent::testing::TestKubelet;

constexpr char kPodUid[] = "5d3b2a1c-0f9e-4d8c-b7a6-951e2f3a4b5c";
constexpr char kPodName[] = "resnet-inference-7d9c8b6f5d-x2x9q";
// The node's GPU: the CUDA driver test double's device 0, by the UUID its processes see (the
// server refuses a pod's registration on a GPU the device plugin did not allocate it).
constexpr char kGpu[] = "GPU-6f72696f-6e2d-7369-6d00-000000000000";

using orion::agent::test_doubles::TestPodResources;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitUntil(const std::function<bool()>& pred, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}


class PodPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/orion-pod-path-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const char* sub : {"/dp", "/lib", "/run", "/proc", "/sim"}) {
      ASSERT_EQ(mkdir((dir_ + sub).c_str(), 0755), 0);
    }
  }
  void TearDown() override {
    for (pid_t pid : {container_, agent_}) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    if (server_) server_->Shutdown();
    ASSERT_EQ(system(("rm -rf " + dir_).c_str()), 0);
  }

  std::string dir_;
  std::unique_ptr<orion::server::OrionServer> server_;
  pid_t agent_ = -1;
  pid_t container_ = -1;
};

TEST_F(PodPathTest, AnnotatedPodRunsHighPriorityFromWebhookToDeletion) {
  // 1. The webhook: a pod annotated orion/priority: high gets a GPU's high-priority slot.
  const orion::agent::AdmissionReply review = orion::agent::ReviewPodAdmission(
      ReadFile(std::string(ORION_AGENT_TESTDATA) + "/admission-review-pod-high.json"), {});
  ASSERT_EQ(review.http_status, 200);
  ASSERT_NE(review.body.find("\"allowed\":true"), std::string::npos) << review.body;
  ASSERT_NE(review.body.find("\"patch\""), std::string::npos) << review.body;
  // The patch is base64 JSON; orion.io/gpu-high in it is what makes the scheduler place the pod
  // on a node with a free high-priority slot.
  const size_t p = review.body.find("\"patch\":\"") + 9;
  const std::string patch_b64 = review.body.substr(p, review.body.find('"', p) - p);
  std::string decoded;
  ASSERT_TRUE(absl::Base64Unescape(patch_b64, &decoded));
  EXPECT_NE(decoded.find("orion.io~1gpu-high"), std::string::npos) << decoded;

  // 2. The node: orion-server (in process), the test kubelet, the test API server, orion-agent.
  auto config = orion::server::ParseServerConfig("", "<test>");
  ASSERT_TRUE(config.ok());
  config->node_name = "gpu-node-a";
  config->socket_path = dir_ + "/run/orion.sock";
  config->agent_socket = dir_ + "/agent/agent.sock";  // out of the pods' run folder
  config->admin_address = "127.0.0.1:0";
  config->metrics_address = "127.0.0.1:0";
  config->trust_client_requests = false;  // a cluster node: priorities come from pods only
  orion::server::ServerOptions options;
  options.discover_gpus = false;
  options.proc_root = dir_ + "/proc";
  auto server = orion::server::OrionServer::Start(*config, options);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);

  TestKubelet kubelet(dir_ + "/dp");
  kubelet.Start();
  TestPodResources pod_resources;
  ASSERT_EQ(mkdir((dir_ + "/podres").c_str(), 0755), 0);
  grpc::ServerBuilder pod_resources_builder;
  pod_resources_builder.AddListeningPort("unix:" + dir_ + "/podres/kubelet.sock",
                                         grpc::InsecureServerCredentials());
  pod_resources_builder.RegisterService(&pod_resources);
  std::unique_ptr<grpc::Server> pod_resources_server = pod_resources_builder.BuildAndStart();
  ASSERT_NE(pod_resources_server, nullptr);
  TestApiServer api;
  const std::string pods = ReadFile(std::string(ORION_AGENT_TESTDATA) + "/pods-list.json");
  api.AddList({200, pods});
  std::ofstream(dir_ + "/kube-token") << "test-token\n";

  // The agent process; started again in step 9 (a restart, as a DaemonSet rollout does).
  auto start_agent = [&](const char* log_name) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string log = dir_ + "/" + log_name;
      if (freopen(log.c_str(), "w", stdout) == nullptr) _exit(126);
      dup2(STDOUT_FILENO, STDERR_FILENO);
      const std::vector<std::string> args = {
          ORION_AGENT, "--node-name=gpu-node-a", std::string("--gpus=") + kGpu,
          "--shares-per-gpu=4", "--device-plugin-dir=" + dir_ + "/dp",
          std::string("--interposer=") + ORION_INTERPOSE_LIB, "--host-lib-dir=" + dir_ + "/lib",
          "--run-dir=" + dir_ + "/run", "--server-address=unix:" + dir_ + "/agent/agent.sock",
          "--health-address=127.0.0.1:0",
          "--pod-resources-socket=" + dir_ + "/podres/kubelet.sock",
          "--kube-api-url=" + api.base_url(), "--kube-token-file=" + dir_ + "/kube-token"};
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    return pid;
  };
  agent_ = start_agent("agent.log");
  ASSERT_GT(agent_, 0);

  // 3. The device plugin registers both resources with the kubelet and lists their devices.
  ASSERT_TRUE(kubelet.WaitFor([&] {
    return kubelet.num_lists_unlocked("orion.io/gpu") >= 1 &&
           kubelet.num_lists_unlocked("orion.io/gpu-high") >= 1;
  })) << ReadFile(dir_ + "/agent.log");
  ASSERT_EQ(kubelet.requests().size(), 2u);
  EXPECT_EQ(kubelet.requests()[0].resource_name(), "orion.io/gpu");
  EXPECT_EQ(kubelet.requests()[1].resource_name(), "orion.io/gpu-high");
  ASSERT_EQ(kubelet.lists("orion.io/gpu").back().devices_size(), 4);
  const auto lists = kubelet.lists("orion.io/gpu-high");
  ASSERT_EQ(lists.back().devices_size(), 1);

  // 4. The kubelet allocates the GPU's high-priority slot to the pod's container.
  auto plugin = kubelet.DialPlugin(kubelet.requests()[1].endpoint());
  v1beta1::AllocateRequest request;
  request.add_container_requests()->add_devices_ids(lists.back().devices(0).id());
  v1beta1::AllocateResponse response;
  grpc::ClientContext ctx;
  ASSERT_TRUE(plugin->Allocate(&ctx, request, &response).ok());
  ASSERT_EQ(response.container_responses_size(), 1);
  const auto& container = response.container_responses(0);
  // The kubelet now lists the share among the pod's devices (its pod resources API).
  {
    ::v1::ListPodResourcesResponse allocated;
    auto* pr = allocated.add_pod_resources();
    pr->set_namespace_("ml");
    pr->set_name(kPodName);
    auto* c = pr->add_containers();
    c->set_name("main");
    auto* devices = c->add_devices();
    devices->set_resource_name("orion.io/gpu");
    devices->add_device_ids(lists.back().devices(0).id());
    pod_resources.Set(allocated);
  }
  EXPECT_EQ(container.envs().at("NVIDIA_VISIBLE_DEVICES"), kGpu);
  EXPECT_EQ(container.envs().at("ORION_SOCKET"), dir_ + "/run/orion.sock");
  ASSERT_EQ(container.mounts_size(), 2);
  const std::string lib_host = container.mounts(0).host_path();
  const std::string lib_container = container.mounts(0).container_path();
  EXPECT_EQ(lib_host.rfind(dir_ + "/lib/", 0), 0u) << lib_host;  // a versioned folder
  EXPECT_TRUE(container.mounts(0).read_only());
  EXPECT_TRUE(container.mounts(1).read_only());  // the run folder: the socket only
  EXPECT_EQ(container.mounts(1).host_path(), dir_ + "/run");

  // The agent pushed the pod's annotations to the server (its AgentSync socket): it watches,
  // and the server knows the recorded list's three pods of this node (an empty, partial
  // UpsertPods changes nothing and answers how many). A container registered before would run
  // best-effort until they arrive (seen once on a loaded 2-core machine: still best-effort 7 s
  // later), which is not what this step checks.
  ASSERT_TRUE(api.WaitFor([&] { return api.num_watches_unlocked() >= 1; }))
      << ReadFile(dir_ + "/agent.log");
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto known = server_->state().UpsertPods({}, /*full_sync=*/false);
        return known.ok() && known->pods_known >= 3;
      },
      30))
      << ReadFile(dir_ + "/agent.log");

  // 5. The container: the allocation's environment, container paths rewritten to host paths
  // (the mounts), the sample on the test double. It asks for no priority itself.
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  container_ = fork();
  if (container_ == 0) {
    close(go[1]);
    char byte;
    if (read(go[0], &byte, 1) != 1) _exit(125);
    std::vector<std::string> env = {"ORION_SIM_DIR=" + dir_ + "/sim", "ORION_SIM_MEMORY=4Gi",
                                    std::string("LD_LIBRARY_PATH=") + ORION_CUDA_DOUBLE_DIR,
                                    "PATH=/usr/bin:/bin"};
    for (const auto& [key, value] : container.envs()) {
      std::string v = value;
      if (v.rfind(lib_container, 0) == 0) v = lib_host + v.substr(lib_container.size());
      env.push_back(key + "=" + v);
    }
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string log = dir_ + "/container.log";
    if (freopen(log.c_str(), "w", stdout) == nullptr) _exit(126);
    dup2(STDOUT_FILENO, STDERR_FILENO);
    char* argv[] = {const_cast<char*>(ORION_SAMPLE_INFER), const_cast<char*>("--rate"),
                    const_cast<char*>("100"), const_cast<char*>("--requests"),
                    const_cast<char*>("700"), const_cast<char*>("--kernel-us"),
                    const_cast<char*>("300"), nullptr};
    execve(argv[0], argv, envp.data());
    _exit(127);
  }
  close(go[0]);
  // What the kernel would show the server for a container of this pod: its cgroup.
  const std::string proc = dir_ + "/proc/" + std::to_string(container_);
  ASSERT_EQ(mkdir(proc.c_str(), 0755), 0);
  std::ofstream(proc + "/cgroup") << "0::/kubepods/burstable/pod" << kPodUid << "/"
                                  << std::string(64, 'c') << "\n";
  std::ofstream(proc + "/comm") << "orion-sample-in\n";
  ASSERT_EQ(write(go[1], "g", 1), 1);
  close(go[1]);

  // 6. Registered with the pod's identity and the pod's priority.
  auto& state = server_->state();
  orion::server::ClientView client;
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const auto& c : state.ListClients({})) {
          if (c.host_pid == static_cast<uint32_t>(container_) &&
              c.policy.priority == orion::contract::Priority::kHigh) {
            client = c;
            return true;
          }
        }
        return false;
      },
      10))
      << ReadFile(dir_ + "/container.log") << ReadFile(dir_ + "/agent.log");
  EXPECT_EQ(client.pod_uid, kPodUid);
  EXPECT_EQ(client.pod, kPodName);
  EXPECT_EQ(client.ns, "ml");
  EXPECT_EQ(client.container_id, std::string(64, 'c'));
  const orion::contract::ClientSlot& slot = state.board().board().slots[client.slot];
  EXPECT_EQ(slot.priority.load(), static_cast<uint32_t>(orion::contract::Priority::kHigh));

  // The interposer came from the mounted, versioned folder the agent installed.
  const std::string maps = ReadFile("/proc/" + std::to_string(container_) + "/maps");
  EXPECT_NE(maps.find(lib_host + "/liborion_interpose.so"), std::string::npos) << lib_host;

  // 7. Metrics carry the pod's namespace and name; the timeline has its kernels.
  const orion::contract::ClientArea* area = state.board().area(client.slot);
  ASSERT_NE(area, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return area->counters.launches.load() > 20; }, 10));
  const std::string metrics = orion::testing::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_NE(metrics.find(std::string("namespace=\"ml\"")), std::string::npos);
  EXPECT_NE(metrics.find(std::string("pod=\"") + kPodName + "\""), std::string::npos);
  bool span = false;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto timeline = state.TimelineWindow(0, 0, 0, 0);
        if (!timeline.ok()) return false;
        for (const auto& s : timeline->spans) {
          if (s.span.client_id == client.client_id &&
              s.span.kind == orion::server::SpanKind::kKernel) {
            span = true;
          }
        }
        return span;
      },
      5));

  // 7b. The agent told the server which GPU the pod was allocated (the kubelet's pod resources
  // API, then AgentSync): a process of the pod naming another GPU of the node is refused.
  const std::string me = dir_ + "/proc/" + std::to_string(getpid());
  ASSERT_EQ(mkdir(me.c_str(), 0755), 0);
  std::ofstream(me + "/cgroup") << "0::/kubepods/burstable/pod" << kPodUid << "/"
                                << std::string(64, 'd') << "\n";
  std::ofstream(me + "/comm") << "intruder\n";
  orion::contract::RegisterRequest foreign{};
  foreign.header = orion::contract::MakeHeader(orion::contract::MessageType::kRegister,
                                               sizeof(foreign));
  std::snprintf(foreign.gpu_uuid, sizeof(foreign.gpu_uuid), "%s",
                "GPU-00000000-aaaa-bbbb-cccc-000000000001");
  foreign.requested_priority = orion::contract::kNoValue32;
  std::string refusal;
  ASSERT_TRUE(WaitUntil(
      [&] {
        orion::contract::RegisterReply reply{};
        const int fd = orion::testing::RegisterClient(dir_ + "/run/orion.sock", foreign, &reply);
        if (fd >= 0) close(fd);
        refusal = reply.message;
        return reply.status == static_cast<uint32_t>(orion::contract::RegisterStatus::kRefused) &&
               refusal.find("is not allocated to this pod") != std::string::npos;
      },
      10))
      << "last answer: " << refusal << "\n" << ReadFile(dir_ + "/agent.log");
  EXPECT_NE(refusal.find(std::string("allowed: ") + kGpu), std::string::npos) << refusal;

  // 8. An upgrade while the pod runs: newer interposers installed (as a new agent does at start)
  // with room for one version only. The pod's version stays: its process holds it.
  EXPECT_TRUE(orion::agent::InterposerVersionInUse(lib_host));
  for (int i = 0; i < 3; ++i) {
    const std::string newer = dir_ + "/newer.so";
    std::ofstream(newer, std::ios::binary) << ReadFile(ORION_INTERPOSE_LIB) << "upgrade " << i;
    ASSERT_TRUE(orion::agent::InstallInterposer(newer, dir_ + "/lib", /*keep_versions=*/1).ok());
    ASSERT_TRUE(std::filesystem::exists(lib_host + "/liborion_interpose.so"));
  }

  // 9. The agent restarts (a rollout) while the pod runs, and the pod's annotation changed to
  // best-effort meanwhile. The new agent registers the device plugin again, lists the pods again
  // and applies what it finds to the running client.
  kill(agent_, SIGTERM);
  ASSERT_EQ(waitpid(agent_, nullptr, 0), agent_);
  agent_ = -1;
  std::string changed = pods;
  const size_t high = changed.find("\"orion/priority\":\"high\"");
  ASSERT_NE(high, std::string::npos);
  changed.replace(high, std::string("\"orion/priority\":\"high\"").size(),
                  "\"orion/priority\":\"best-effort\"");
  api.DropOpenWatches();  // the old agent's watch is gone with it
  api.AddList({200, changed});
  size_t watches_before = 0;
  api.WaitFor([&] {
    watches_before = api.num_watches_unlocked();
    return true;
  });
  agent_ = start_agent("agent-2.log");
  ASSERT_TRUE(kubelet.WaitFor([&] { return kubelet.num_requests_unlocked() >= 4; }))
      << ReadFile(dir_ + "/agent-2.log");
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const auto& c : state.ListClients({})) {
          if (c.client_id == client.client_id) {
            return c.policy.priority == orion::contract::Priority::kBestEffort;
          }
        }
        return false;
      },
      10))
      << "the restarted agent did not apply the pod's new annotation\n"
      << ReadFile(dir_ + "/agent-2.log");
  EXPECT_EQ(slot.priority.load(), static_cast<uint32_t>(orion::contract::Priority::kBestEffort));
  ASSERT_TRUE(api.WaitFor([&] { return api.num_watches_unlocked() > watches_before; }));

  // 10. The container ends; the API server reports the pod deleted: the server forgets both.
  int status = -1;
  ASSERT_EQ(waitpid(container_, &status, 0), container_);
  container_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(dir_ + "/container.log");
  ASSERT_TRUE(WaitUntil([&] { return state.ListClients({}).empty(); }, 5));
  // No process uses the old version any more: the next install prunes it.
  EXPECT_FALSE(orion::agent::InterposerVersionInUse(lib_host));
  ASSERT_TRUE(orion::agent::InstallInterposer(dir_ + "/newer.so", dir_ + "/lib", 1).ok());
  EXPECT_FALSE(std::filesystem::exists(lib_host));
  // An empty, partial UpsertPods changes nothing and answers how many pods the server knows: the
  // three pods of the recorded list on this node.
  auto before = state.UpsertPods({}, /*full_sync=*/false);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->pods_known, 3u);
  // The deleted pod as a watch event: the first item of the recorded list.
  const size_t first = pods.find('{', pods.find("\"items\""));
  int depth = 0;
  size_t end = first;
  for (; end < pods.size(); ++end) {
    if (pods[end] == '{') ++depth;
    if (pods[end] == '}' && --depth == 0) break;
  }
  api.SendOnOpenWatch("{\"type\":\"DELETED\",\"object\":" + pods.substr(first, end - first + 1) +
                      "}\n");
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto known = state.UpsertPods({}, /*full_sync=*/false);
        return known.ok() && known->pods_known == 2;  // the other two stay
      },
      5))
      << ReadFile(dir_ + "/agent.log");
}

}  // namespace
