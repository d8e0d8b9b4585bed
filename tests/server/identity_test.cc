// Identity comes only from the kernel: standalone rules match the peer's comm and executable,
// never the name a request gives itself; a peer is pinned when it connects (SO_PEERCRED and a
// pidfd, or the start-time fallback) and a socket handed on by a connector that has exited
// cannot register; and the cluster admin bounds what pods declare (namespaces allowed high, a
// floor on latency targets).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "server/admission.h"
#include "server/peer_identity.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Priority;
using contract::RegisterReply;
using contract::RegisterStatus;

contract::RegisterRequest NamedRequest(const char* name) {
  contract::RegisterRequest r{};
  r.header = contract::MakeHeader(contract::MessageType::kRegister, sizeof(r));
  r.requested_priority = contract::kNoValue32;
  std::snprintf(r.process_name, sizeof(r.process_name), "%s", name);
  return r;
}

PeerIdentity Peer(const std::string& comm, const std::string& exe) {
  PeerIdentity p;
  p.pid = 4242;
  p.uid = 1000;
  p.process_name = comm;
  p.exe = exe;
  p.cgroup.reason = "not in a pod: test";
  return p;
}

TEST(IdentityTest, RulesMatchTheKernelsNamesNeverTheRequests) {
  ServerConfig config =
      *ParseServerConfig("standalone: {rules: [{process: tritonserver, priority: high}]}", "t");
  // A Python process calling itself tritonserver in its request.
  const ClientPolicy python = DecidePolicy(Peer("python3", "/usr/bin/python3.11"),
                                           NamedRequest("tritonserver"), config, nullptr, nullptr);
  EXPECT_EQ(python.priority, Priority::kBestEffort);
  EXPECT_EQ(python.source, "default");
  // The real one, by comm or (comm truncated to 15 bytes, say) by its executable's file name.
  EXPECT_EQ(DecidePolicy(Peer("tritonserver", "/opt/tritonserver/bin/tritonserver"),
                         NamedRequest("x"), config, nullptr, nullptr)
                .priority,
            Priority::kHigh);
  EXPECT_EQ(DecidePolicy(Peer("tritonserv", "/opt/tritonserver/bin/tritonserver"),
                         NamedRequest("x"), config, nullptr, nullptr)
                .priority,
            Priority::kHigh);
  // An exe rule holds even against a process that set its own comm.
  ServerConfig by_exe =
      *ParseServerConfig("standalone: {rules: [{exe: /opt/*/tritonserver, priority: high}]}", "t");
  EXPECT_EQ(DecidePolicy(Peer("tritonserver", "/usr/bin/python3.11"), NamedRequest("tritonserver"),
                         by_exe, nullptr, nullptr)
                .priority,
            Priority::kBestEffort);
  EXPECT_EQ(DecidePolicy(Peer("tritonserver", "/opt/triton/tritonserver"), NamedRequest("x"),
                         by_exe, nullptr, nullptr)
                .priority,
            Priority::kHigh);
}

class IdentityServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    cfg_ = testing::TestConfig(dir_);
    cfg_.rules.push_back(PriorityRule{"orion-ruled*", std::nullopt, Priority::kHigh, 0, 0});
    server_ = testing::StartServer(cfg_);
    ASSERT_NE(server_, nullptr);
  }
  int Connect() {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", cfg_.socket_path.c_str());
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }
  std::string dir_;
  ServerConfig cfg_;
  std::unique_ptr<OrionServer> server_;
};

TEST_F(IdentityServerTest, ARequestNamingARuledProcessGetsNothingFromIt) {
  // This process's comm is the test binary's; its request says orion-ruled-x.
  auto req = testing::MakeRequest(cfg_.gpus[0].c_str(), Priority::kBestEffort);
  req.requested_priority = contract::kNoValue32;
  std::snprintf(req.process_name, sizeof(req.process_name), "orion-ruled-x");
  RegisterReply reply{};
  const int fd = testing::RegisterClient(cfg_.socket_path, req, &reply);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kOk)) << reply.message;
  EXPECT_EQ(reply.priority, static_cast<uint32_t>(Priority::kBestEffort));
  close(fd);
}

// The connector hands its socket to this process and exits; this process sends the request.
TEST_F(IdentityServerTest, ASocketHandedOnByAConnectorThatExitedCannotRegister) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  const pid_t child = fork();
  if (child == 0) {
    const int fd = Connect();
    if (fd < 0) _exit(3);
    char one = 1;
    _exit(contract::SendWithFds(pair[1], &one, 1, &fd, 1) ? 0 : 4);
  }
  char one = 0;
  int fds[contract::kRegisterFds] = {-1, -1, -1, -1};
  int nfds = 0;
  ASSERT_TRUE(contract::ReceiveWithFds(pair[0], &one, 1, fds, &nfds));
  ASSERT_EQ(nfds, 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // the connector is gone, reaped
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const int sock = fds[0];
  const auto req = testing::MakeRequest(cfg_.gpus[0].c_str(), Priority::kHigh);
  ASSERT_EQ(send(sock, &req, sizeof(req), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(req)));
  RegisterReply reply{};
  int got[contract::kRegisterFds];
  int ngot = 0;
  ASSERT_TRUE(contract::ReceiveWithFds(sock, &reply, sizeof(reply), got, &ngot));
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kRefused));
  // Which words depend on when the server pinned the connector: "exited before the request was
  // read" if it was still alive then, "exited before it was identified" on a loaded host where
  // the accept came after the exit (server/peer_identity.cc PinPeer).
  EXPECT_NE(std::string(reply.message).find(") exited before "), std::string::npos)
      << reply.message;
  EXPECT_EQ(ngot, 0);
  close(sock);
  close(pair[0]);
  close(pair[1]);
  // A process that connects for itself still registers.
  RegisterReply own{};
  const int fd = testing::RegisterClient(cfg_.socket_path, req, &own);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(own.status, static_cast<uint32_t>(RegisterStatus::kOk)) << own.message;
  close(fd);
}

// PinPeer with and without a pidfd: alive while the connector lives, refused once it exited.
class PinPeerTest : public ::testing::TestWithParam<bool> {};

TEST_P(PinPeerTest, AliveUntilTheConnectorExits) {
  const std::string dir = testing::MakeTempDir();
  const std::string path = dir + "/pin.sock";
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  if (child == 0) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) _exit(3);
    char c;
    (void)!read(go[0], &c, 1);  // live until told to go
    _exit(0);
  }
  const int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(conn, 0);
  absl::StatusOr<PinnedPeer> pinned = PinPeer(conn, "/proc", GetParam());
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->identity.pid, child);
  EXPECT_FALSE(pinned->identity.exe.empty());
  EXPECT_NE(pinned->start_time, 0u);
  if (!GetParam()) EXPECT_EQ(pinned->pidfd, -1);
  std::printf("pinned pid %d with %s\n", static_cast<int>(child),
              pinned->pidfd >= 0 ? "a pidfd" : "its start time");
  EXPECT_TRUE(PinnedPeerAlive(*pinned, "/proc").ok());
  ASSERT_EQ(write(go[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const absl::Status gone = PinnedPeerAlive(*pinned, "/proc");
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gone.message().find(std::to_string(child)), absl::string_view::npos) << gone;
  if (pinned->pidfd >= 0) close(pinned->pidfd);
  close(conn);
  close(listener);
  close(go[0]);
  close(go[1]);
  unlink(path.c_str());
  rmdir(dir.c_str());
}

INSTANTIATE_TEST_SUITE_P(PidfdOrStartTime, PinPeerTest, ::testing::Bool());

TEST(IdentityTest, TheAdminDecidesWhoMayBeHighAndTheLatencyFloor) {
  auto config = ParseServerConfig(
      "policy: {high_priority_namespaces: [serving, ops], min_latency_target_ms: 5}", "t");
  ASSERT_TRUE(config.ok()) << config.status();
  PodPolicy pod;
  pod.pod_uid = "7e1f4a2b-9c3d-4e5f-a6b7-c8d9e0f1a2b3";
  pod.name = "sneaky";
  pod.ns = "team-a";
  pod.priority = Priority::kHigh;
  pod.latency_target_us = 1000;  // 1 ms would shrink the best-effort budget toward 0
  const std::string why = AdmitPodPolicy(config->policy, &pod);
  std::printf("pod team-a/sneaky: %s\n", why.c_str());
  EXPECT_EQ(pod.priority, Priority::kBestEffort);
  EXPECT_TRUE(pod.high_refused);
  EXPECT_EQ(pod.latency_target_us, 5000u);
  EXPECT_EQ(pod.latency_raised_from_us, 1000u);
  EXPECT_NE(why.find("namespace team-a is not in policy.high_priority_namespaces"),
            std::string::npos);
  EXPECT_NE(why.find("raised to the floor 5"), std::string::npos);
  PeerIdentity in_pod = Peer("python3", "/usr/bin/python3");
  in_pod.cgroup.pod_uid = pod.pod_uid;
  const ClientPolicy p = DecidePolicy(in_pod, NamedRequest("x"), *config, &pod, nullptr);
  EXPECT_EQ(p.priority, Priority::kBestEffort);
  EXPECT_EQ(p.source, "namespace-not-allowed");
  EXPECT_EQ(p.latency_target_us, 5000u);

  PodPolicy allowed = pod;
  allowed.ns = "serving";
  allowed.priority = Priority::kHigh;
  allowed.latency_target_us = 20000;
  EXPECT_EQ(AdmitPodPolicy(config->policy, &allowed), "");
  EXPECT_EQ(allowed.priority, Priority::kHigh);
  EXPECT_EQ(DecidePolicy(in_pod, NamedRequest("x"), *config, &allowed, nullptr).source,
            "pod-annotation");

  // The defaults keep the old behaviour for priority: every namespace may be high.
  auto defaults = ParseServerConfig("", "t");
  PodPolicy any = pod;
  any.priority = Priority::kHigh;
  any.latency_target_us = 0;
  EXPECT_EQ(AdmitPodPolicy(defaults->policy, &any), "");
  EXPECT_EQ(any.priority, Priority::kHigh);
  EXPECT_EQ(defaults->policy.min_latency_target_us, 5000u);
  EXPECT_FALSE(ParseServerConfig("policy: {high_priority_namespaces: ops}", "t").ok());
}

}  // namespace
}  // namespace orion::server

namespace orion::server {
namespace {

// Priority is per GPU: a pod whose priority is high is high only on the GPUs where it holds a
// high-priority device (the agent's high_gpu_uuids), once its allocation is known; on its other
// GPUs its processes are best-effort, whatever the pod asked for.
TEST(IdentityTest, AHighPodIsHighOnlyOnTheGpusOfItsHighDevices) {
  ServerConfig config = *ParseServerConfig("{}", "t");
  PodPolicy pod;
  pod.pod_uid = "0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab";
  pod.priority = Priority::kHigh;
  pod.gpu_uuids = {"GPU-a", "GPU-b"};
  pod.high_gpu_uuids = {"GPU-a"};
  PeerIdentity peer = Peer("python3", "/usr/bin/python3");
  peer.cgroup.pod_uid = pod.pod_uid;
  contract::RegisterRequest on_a = NamedRequest("python3");
  std::snprintf(on_a.gpu_uuid, sizeof(on_a.gpu_uuid), "GPU-a");
  contract::RegisterRequest on_b = on_a;
  std::snprintf(on_b.gpu_uuid, sizeof(on_b.gpu_uuid), "GPU-b");
  const ClientPolicy a = DecidePolicy(peer, on_a, config, &pod, nullptr);
  const ClientPolicy b = DecidePolicy(peer, on_b, config, &pod, nullptr);
  EXPECT_EQ(a.priority, Priority::kHigh);
  EXPECT_EQ(a.source, "pod-annotation");
  EXPECT_EQ(b.priority, Priority::kBestEffort);
  EXPECT_EQ(b.source, "no-high-device-on-gpu");
  // Its allocation not known yet: as annotated (the server cannot tell its GPUs apart).
  pod.gpu_uuids.clear();
  pod.high_gpu_uuids.clear();
  EXPECT_EQ(DecidePolicy(peer, on_b, config, &pod, nullptr).priority, Priority::kHigh);
  // Known, with no high device at all (a share asked for beside the annotation): best-effort.
  pod.gpu_uuids = {"GPU-b"};
  EXPECT_EQ(DecidePolicy(peer, on_b, config, &pod, nullptr).priority, Priority::kBestEffort);
  // An admin's override of the pod still wins.
  const Priority high = Priority::kHigh;
  EXPECT_EQ(DecidePolicy(peer, on_b, config, &pod, &high).priority, Priority::kHigh);
}

}  // namespace
}  // namespace orion::server
