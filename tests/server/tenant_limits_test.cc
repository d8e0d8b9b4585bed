// What one tenant may take of the node: client slots per pod and per uid (limits.clients_per_*),
// connections on the registration socket that never finish their request (a cap and a
// deadline), and a process out of descriptors (the accept loop must not spin). Each test plays
// the attack and asserts the bound.
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "orion/v1/agent.grpc.pb.h"
#include "server/node_state.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Priority;
using contract::RegisterStatus;

int ConnectOnly(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Waits (up to timeout_ms) for the server to close fd; true if it did.
bool ClosedByServer(int fd, int timeout_ms) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[512];
  for (;;) {
    const ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r == 0) return true;
    if (r < 0) return errno == ECONNRESET;
  }
}

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

TEST(TenantLimitsTest, OnePodOrUidCannotTakeEverySlot) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.max_clients_per_pod = 4;
  cfg.max_clients_per_uid = 3;
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  const auto req = testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kBestEffort);
  PeerIdentity hostile_pod = IdentifyPid(getpid(), 1000, 1000, "/proc");
  hostile_pod.cgroup.pod_uid = "11111111-2222-3333-4444-555555555555";
  int ok = 0;
  NodeState::Admission refused;
  for (int i = 0; i < 300; ++i) {
    NodeState::Admission a = state.Register(hostile_pod, req);
    if (a.status == RegisterStatus::kOk) {
      ++ok;
    } else {
      refused = a;
    }
  }
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(refused.status, RegisterStatus::kRefused);
  EXPECT_EQ(refused.message,
            "pod 11111111-2222-3333-4444-555555555555 holds 4 client slots, its cap "
            "(limits.clients_per_pod)");
  EXPECT_LT(refused.message.size(), sizeof(contract::RegisterReply::message));
  // Another pod of the same uid still registers: the cap is the pod's.
  PeerIdentity other_pod = hostile_pod;
  other_pod.cgroup.pod_uid = "99999999-2222-3333-4444-555555555555";
  EXPECT_EQ(state.Register(other_pod, req).status, RegisterStatus::kOk);

  // Outside pods, per uid.
  PeerIdentity user = IdentifyPid(getpid(), 1000, 1000, "/proc");
  user.cgroup.pod_uid.clear();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(state.Register(user, req).status, RegisterStatus::kOk);
  NodeState::Admission over = state.Register(user, req);
  EXPECT_EQ(over.status, RegisterStatus::kRefused);
  EXPECT_EQ(over.message, "uid 1000 holds 3 client slots, its cap (limits.clients_per_uid)");
  PeerIdentity other_user = user;
  other_user.uid = 1001;
  EXPECT_EQ(state.Register(other_user, req).status, RegisterStatus::kOk);
  PeerIdentity root = user;
  root.uid = 0;  // root on the node is not capped
  for (int i = 0; i < 5; ++i) EXPECT_EQ(state.Register(root, req).status, RegisterStatus::kOk);
  const MetricsSnapshot snap = state.Snapshot();
  EXPECT_EQ(snap.registrations_failed.at("pod-cap"), 296u);
  EXPECT_EQ(snap.registrations_failed.at("uid-cap"), 1u);
  // A slot given back makes room again.
  for (const ClientView& c : state.ListClients({})) {
    if (c.uid == 1000 && c.pod_uid.empty()) {
      state.Unregister(c.client_id);
      break;
    }
  }
  EXPECT_EQ(state.Register(user, req).status, RegisterStatus::kOk);
}

TEST(TenantLimitsTest, IdleAndHalfSentConnectionsAreCappedAndTimedOut) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.max_pending_connections = 16;
  cfg.request_timeout_ms = 1000;
  auto server = testing::StartServer(cfg);
  ASSERT_NE(server, nullptr);
  // A hostile process holds 200 connections open.
  const auto req = testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kBestEffort);
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectOnly(cfg.socket_path);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  // The server never holds more than the cap of them: the oldest make room.
  EXPECT_TRUE(testing::WaitFor([&] {
    return server->state().Snapshot().registrations_failed.count("pending-cap") != 0;
  }));
  // A client that sends its request is answered anyway, at once.
  const uint64_t t0 = MonotonicNs();
  contract::RegisterReply reply{};
  const int fd = testing::RegisterClient(cfg.socket_path, req, &reply);
  const double register_ms = (MonotonicNs() - t0) / 1e6;
  ASSERT_GE(fd, 0);
  EXPECT_EQ(reply.status, 0u) << reply.message;
  // Behind 200 idle connections in the accept queue; the interposer waits 2 s.
  EXPECT_LT(register_ms, 500);
  EXPECT_LE(server->registration_connections(), cfg.max_pending_connections + 1);
  for (int c : idle) EXPECT_TRUE(ClosedByServer(c, 3000));
  for (int c : idle) close(c);
  // Half a request is closed after about the deadline.
  const int half = ConnectOnly(cfg.socket_path);
  ASSERT_GE(half, 0);
  ASSERT_EQ(send(half, &req, sizeof(req) / 2, MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof(req) / 2));
  const uint64_t half_sent_at = MonotonicNs();
  ASSERT_TRUE(ClosedByServer(half, 5000));
  const double closed_after_ms = (MonotonicNs() - half_sent_at) / 1e6;
  std::printf("200 idle connections (cap 16, deadline 1000 ms): a registration answered in "
              "%.2f ms, %zu connections held; half a request closed after %.0f ms\n",
              register_ms, server->registration_connections(), closed_after_ms);
  EXPECT_GE(closed_after_ms, 900);
  EXPECT_LT(closed_after_ms, 2000);
  const MetricsSnapshot snap = server->state().Snapshot();
  EXPECT_GT(snap.registrations_failed.at("request-timeout"), 0u);
  close(half);
  close(fd);
}

TEST(TenantLimitsTest, OutOfDescriptorsTheAcceptLoopDoesNotSpin) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.max_pending_connections = 4096;
  cfg.request_timeout_ms = 60000;
  auto server = testing::StartServer(cfg);
  ASSERT_NE(server, nullptr);
  // The server (this process) may open only a few more descriptors.
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  int highest = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    if (fcntl(fd, F_GETFD) >= 0) highest = fd;
  }
  rlimit low = saved;
  low.rlim_cur = highest + 24;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  // Another process connects 300 times and holds the connections.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    setrlimit(RLIMIT_NOFILE, &saved);
    int n = 0;
    for (int i = 0; i < 300; ++i) n += ConnectOnly(cfg.socket_path) >= 0;
    (void)!write(ready[1], &n, sizeof(n));
    pause();
    _exit(0);
  }
  int connected = 0;
  ASSERT_EQ(read(ready[0], &connected, sizeof(connected)), static_cast<ssize_t>(sizeof(connected)));
  EXPECT_GT(connected, 0);
  EXPECT_TRUE(testing::WaitFor([&] {
    return server->state().Snapshot().registrations_failed.count("out-of-descriptors") != 0;
  }));
  // Out of descriptors with connections waiting: the process stays nearly idle.
  const double cpu0 = ProcessCpuSeconds();
  const uint64_t t0 = MonotonicNs();
  usleep(1000000);  // the measured interval, not a synchronisation
  const double cpu_share = (ProcessCpuSeconds() - cpu0) / ((MonotonicNs() - t0) / 1e9);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  std::printf("out of descriptors, %d connections made: the server process used %.0f%% of a "
              "CPU\n",
              connected, cpu_share * 100);
  EXPECT_LT(cpu_share, 0.5);
  // Descriptors back: registrations work again.
  contract::RegisterReply reply{};
  int fd = -1;
  ASSERT_TRUE(testing::WaitFor([&] {
    fd = testing::RegisterClient(cfg.socket_path,
                                 testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kHigh),
                                 &reply);
    return fd >= 0 && reply.status == 0;
  }));
  close(fd);
  close(ready[0]);
  close(ready[1]);
}

TEST(TenantLimitsTest, StartRaisesTheDescriptorLimit) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max < 2048) GTEST_SKIP() << "hard limit too low to lower the soft one";
  rlimit low = saved;
  low.rlim_cur = 1024;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  EXPECT_EQ(RaiseDescriptorLimit(), saved.rlim_max);
  rlimit now{};
  getrlimit(RLIMIT_NOFILE, &now);
  EXPECT_EQ(now.rlim_cur, saved.rlim_max);
}

}  // namespace
}  // namespace orion::server

namespace orion::server {
namespace {

// The server decides which GPUs a client may use: with a list (config gpus, or found at start)
// only those; made-up UUIDs are refused and never enter the board's table.
TEST(TenantGpusTest, OnlyTheNodesGpusAreGiven) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity peer = IdentifyPid(getpid(), 1000, 1000, "/proc");
  for (int i = 0; i < 20; ++i) {
    const std::string fake = "GPU-made-up-" + std::to_string(i);
    NodeState::Admission a =
        state.Register(peer, testing::MakeRequest(fake.c_str(), Priority::kBestEffort));
    EXPECT_EQ(a.status, RegisterStatus::kUnknownGpu);
    if (i == 0) {
      EXPECT_EQ(a.message, "GPU 'GPU-made-up-0' is not a GPU of this node (config gpus, or found)");
    }
  }
  auto empty = testing::MakeRequest("", Priority::kBestEffort);  // ordinal only
  EXPECT_EQ(state.Register(peer, empty).status, RegisterStatus::kUnknownGpu);
  EXPECT_EQ(state.ListGpus().size(), 2u);
  for (const std::string& uuid : cfg.gpus) {
    EXPECT_EQ(state.Register(peer, testing::MakeRequest(uuid.c_str(), Priority::kBestEffort))
                  .status,
              RegisterStatus::kOk);
  }
}

// Without a list (no driver found, as on the CUDA test double) GPUs join on demand, a few per
// tenant: one tenant's made-up UUIDs cannot fill the table.
TEST(TenantGpusTest, WithoutAListEachTenantAddsAFewGpus) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.gpus.clear();
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity user = IdentifyPid(getpid(), 1000, 1000, "/proc");
  user.cgroup.pod_uid.clear();
  int ok = 0;
  std::string refusal;
  for (int i = 0; i < 14; ++i) {
    const std::string fake = "GPU-made-up-" + std::to_string(i);
    NodeState::Admission a =
        state.Register(user, testing::MakeRequest(fake.c_str(), Priority::kBestEffort));
    if (a.status == RegisterStatus::kOk) {
      ++ok;
    } else {
      refusal = a.message;
    }
  }
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(refusal, "uid 1000 added 2 GPUs not in config gpus, its cap (limits.unlisted_gpus)");
  EXPECT_EQ(state.ListGpus().size(), 2u);
  // The GPUs already on the board stay usable by everyone, and another tenant adds its own.
  EXPECT_EQ(state.Register(user, testing::MakeRequest("GPU-made-up-0", Priority::kHigh)).status,
            RegisterStatus::kOk);
  PeerIdentity pod = user;
  pod.cgroup.pod_uid = "11111111-2222-3333-4444-555555555555";
  EXPECT_EQ(state.Register(pod, testing::MakeRequest("GPU-real", Priority::kHigh)).status,
            RegisterStatus::kOk);
  EXPECT_EQ(state.ListGpus().size(), 3u);
}

}  // namespace
}  // namespace orion::server

namespace orion::server {
namespace {

ino_t InodeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A second orion-server with the same config refuses to start and touches nothing of the first.
TEST(SecondServerTest, RefusesAndLeavesTheFirstAlone) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  auto first = testing::StartServer(cfg);
  ASSERT_NE(first, nullptr);
  const ino_t client_socket = InodeOf(cfg.socket_path);
  const ino_t agent_socket = InodeOf(cfg.agent_socket);
  ASSERT_NE(client_socket, 0u);
  ASSERT_NE(agent_socket, 0u);
  ServerOptions opts;
  opts.discover_gpus = false;
  auto second = OrionServer::Start(cfg, opts);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another orion-server runs with this config"),
            std::string::npos)
      << second.status();
  // The same client socket with another agent socket (another lock): the live socket is seen.
  ServerConfig other = cfg;
  other.agent_socket = dir + "/agent2/agent.sock";
  auto third = OrionServer::Start(other, opts);
  ASSERT_FALSE(third.ok());
  EXPECT_NE(third.status().message().find("another process listens on this socket"),
            std::string::npos)
      << third.status();
  EXPECT_EQ(InodeOf(cfg.socket_path), client_socket);
  EXPECT_EQ(InodeOf(cfg.agent_socket), agent_socket);
  EXPECT_TRUE(SocketAnswers(cfg.agent_socket));
  contract::RegisterReply reply{};
  const int fd = testing::RegisterClient(
      cfg.socket_path, testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kHigh), &reply);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(reply.status, 0u) << reply.message;
  close(fd);
  // Once the first is gone, a new one starts over its stale files.
  first.reset();
  auto next = testing::StartServer(cfg);
  EXPECT_NE(next, nullptr);
}

// In a cluster a pod may use the GPUs the device plugin allocated to it, which the agent tells
// the server over AgentSync (the real gRPC path, its Unix socket): a registration from the pod
// naming another GPU of the node is refused, saying what was asked and what is allowed. A pod
// the agent has not reported (or reported without an allocation) may use any GPU of the node.
TEST(TenantGpusTest, APodGetsOnlyTheGpusTheDevicePluginAllocatedIt) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  ServerOptions opts;
  opts.discover_gpus = false;
  opts.proc_root = dir + "/proc";  // what the kernel shows the server of this process
  const std::string proc = opts.proc_root + "/" + std::to_string(getpid());
  ASSERT_EQ(system(("mkdir -p " + proc).c_str()), 0);
  const std::string pod_uid = "0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab";
  auto put_in_pod = [&](const std::string& uid) {
    std::ofstream(proc + "/cgroup") << "0::/kubepods/burstable/pod" << uid << "/"
                                    << std::string(64, 'c') << "\n";
    std::ofstream(proc + "/comm") << "test-client\n";
  };
  put_in_pod(pod_uid);
  auto server = OrionServer::Start(cfg, opts);
  ASSERT_TRUE(server.ok()) << server.status();
  auto register_on = [&](const std::string& uuid, contract::RegisterReply* reply) {
    const int fd = testing::RegisterClient(
        cfg.socket_path, testing::MakeRequest(uuid.c_str(), Priority::kBestEffort), reply);
    if (fd >= 0) close(fd);
    return fd >= 0;
  };
  const std::string& allowed = cfg.gpus[0];
  const std::string& other = cfg.gpus[1];
  contract::RegisterReply reply{};

  // Not reported yet: the node's GPUs.
  ASSERT_TRUE(register_on(other, &reply));
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kOk)) << reply.message;

  auto agent = orion::v1::AgentSync::NewStub(
      grpc::CreateChannel("unix:" + cfg.agent_socket, grpc::InsecureChannelCredentials()));
  orion::v1::UpsertPodsRequest up;
  auto* pod = up.add_pods();
  pod->set_pod_uid(pod_uid);
  pod->set_namespace_("ml");
  pod->set_name("serve-0");
  pod->set_priority(orion::v1::PRIORITY_BEST_EFFORT);
  pod->add_gpu_uuids(allowed);
  pod->add_gpu_uuids("");  // malformed: the whole update is refused, naming the entry
  orion::v1::UpsertPodsResponse upr;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = agent->UpsertPods(&ctx, up, &upr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("pods[0].gpu_uuids[1] (ml/serve-0)"), std::string::npos)
        << s.error_message();
  }
  pod->clear_gpu_uuids();
  pod->add_gpu_uuids(allowed);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(agent->UpsertPods(&ctx, up, &upr).ok());
  }

  // Reported with its allocation: the other GPU is refused, clearly; its own is given.
  ASSERT_TRUE(register_on(other, &reply));
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kRefused));
  EXPECT_EQ(std::string(reply.message),
            "GPU " + other + " is not allocated to this pod; allowed: " + allowed);
  ASSERT_TRUE(register_on(allowed, &reply));
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kOk)) << reply.message;
  // Made-up UUIDs are refused too, before they could reach the board.
  ASSERT_TRUE(register_on("GPU-made-up", &reply));
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kRefused));
  EXPECT_EQ((*server)->state().ListGpus().size(), 2u);
  const MetricsSnapshot snap = (*server)->state().Snapshot();
  EXPECT_EQ(snap.registrations_failed.at("gpu-not-allocated"), 2u);

  // Another pod, not reported: the node's GPUs still.
  put_in_pod("11111111-2222-3333-4444-555555555555");
  ASSERT_TRUE(register_on(other, &reply));
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kOk)) << reply.message;
  // A pod reported without an allocation (the agent does not know it yet): likewise.
  put_in_pod(pod_uid);
  pod->clear_gpu_uuids();
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(agent->UpsertPods(&ctx, up, &upr).ok());
  }
  ASSERT_TRUE(register_on(other, &reply));
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kOk)) << reply.message;
  (*server)->Shutdown();
}

}  // namespace
}  // namespace orion::server
