// Registration through the real Unix socket of a running server, from forked processes:
// identity from SO_PEERCRED, slot assignment, release on exit/SIGKILL, bad requests, standalone
// priority decisions, 300 processes registering at once, and the socket's folder made when
// missing.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <vector>

#include "server/node_state.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Priority;
using contract::RegisterReply;
using contract::RegisterStatus;

class RegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    cfg_ = testing::TestConfig(dir_);
    cfg_.rules.push_back(PriorityRule{"orion-ruled*", std::nullopt, Priority::kHigh, 123456, 0});
    server_ = testing::StartServer(cfg_);
    ASSERT_NE(server_, nullptr);
  }
  std::string dir_;
  ServerConfig cfg_;
  std::unique_ptr<OrionServer> server_;
};

TEST_F(RegistrationTest, ForkedClientIsIdentifiedByTheKernelAndReleasedOnExit) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    RegisterReply reply{};
    auto req = testing::MakeRequest(cfg_.gpus[1].c_str(), Priority::kHigh, 1 << 30);
    req.claimed_pid = 1;  // lies about its pid: must not matter
    req.usable_millicpus = 1500;  // informative: shown as it came
    testing::ClientMaps maps;
    const int fd = testing::RegisterClient(cfg_.socket_path, req, &reply, &maps);
    if (fd < 0 || reply.status != 0) _exit(3);
    const contract::Board* b = maps.board;
    if (!b || !contract::BoardLooksValid(*b, sizeof(contract::Board))) _exit(4);
    if (b->slots[reply.slot].generation.load() != reply.generation) _exit(5);
    if (!maps.area || !contract::AreaLooksValid(*maps.area, sizeof(contract::ClientArea),
                                                reply.slot, reply.generation)) {
      _exit(6);
    }
    if (!maps.gate ||
        !contract::GateLooksValid(*maps.gate, sizeof(contract::GateArea), reply.gpu)) {
      _exit(7);
    }
    maps.area->counters.memory_used_bytes.store(777);
    char go = 0;
    (void)!write(pipe_fds[1], &go, 1);
    pause();  // stay registered until killed
    _exit(0);
  }
  char go = 0;
  ASSERT_EQ(read(pipe_fds[0], &go, 1), 1);
  auto clients = server_->state().ListClients({});
  ASSERT_EQ(clients.size(), 1u);
  EXPECT_EQ(clients[0].host_pid, static_cast<uint32_t>(child));
  EXPECT_EQ(clients[0].uid, getuid());
  EXPECT_EQ(clients[0].gpu, 1u);
  EXPECT_EQ(clients[0].policy.priority, orion::contract::Priority::kHigh);
  EXPECT_EQ(clients[0].policy.source, "orion-run");
  EXPECT_EQ(clients[0].policy.memory_limit_bytes, 1ull << 30);
  EXPECT_EQ(clients[0].memory_used_bytes, 777u);
  EXPECT_EQ(clients[0].usable_millicpus, 1500u);
  // High-priority slots are visible to the gate through the GPU's mask.
  const auto& gpu = server_->state().board().board().gpus[1];
  EXPECT_NE(gpu.hp_slot_mask[clients[0].slot / 64].load() & (1ull << (clients[0].slot % 64)),
            0u);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(testing::WaitFor([&] { return server_->state().ListClients({}).empty(); }));
  EXPECT_EQ(gpu.hp_slot_mask[clients[0].slot / 64].load(), 0u);
}

// The socket file deleted, then replaced by something else, while the server runs: a new socket
// is bound at the path within about 250 ms each time, the client registered before keeps its
// registration, new clients register, and each repair is counted.
TEST_F(RegistrationTest, DeletedOrReplacedSocketIsBoundAgain) {
  RegisterReply first{};
  const int f1 = testing::RegisterClient(
      cfg_.socket_path, testing::MakeRequest(cfg_.gpus[0].c_str(), Priority::kHigh), &first);
  ASSERT_GE(f1, 0);
  ASSERT_EQ(first.status, 0u);

  ASSERT_EQ(unlink(cfg_.socket_path.c_str()), 0);
  ASSERT_TRUE(testing::WaitFor([&] { return access(cfg_.socket_path.c_str(), F_OK) == 0; }));
  RegisterReply second{};
  const int f2 = testing::RegisterClient(
      cfg_.socket_path, testing::MakeRequest(cfg_.gpus[0].c_str(), Priority::kBestEffort), &second);
  ASSERT_GE(f2, 0);
  EXPECT_EQ(second.status, 0u);

  ASSERT_EQ(unlink(cfg_.socket_path.c_str()), 0);
  { std::ofstream(cfg_.socket_path) << "not a socket\n"; }
  RegisterReply third{};
  int f3 = -1;
  ASSERT_TRUE(testing::WaitFor([&] {
    if (f3 >= 0) close(f3);
    f3 = testing::RegisterClient(
        cfg_.socket_path, testing::MakeRequest(cfg_.gpus[1].c_str(), Priority::kBestEffort), &third);
    return f3 >= 0 && third.status == 0u;
  }));

  EXPECT_EQ(server_->state().ListClients({}).size(), 3u);  // the first one kept its registration
  const MetricsSnapshot snap = server_->state().Snapshot();
  EXPECT_EQ(snap.repairs.at("socket-deleted"), 1u);
  EXPECT_EQ(snap.repairs.at("socket-replaced"), 1u);
  for (int fd : {f1, f2, f3}) close(fd);
}

TEST(SocketFolderTest, AMissingFolderIsMadeWithSafePermissions) {
  // A fresh machine has no /run/orion: the server makes it (0755, its own user) whatever the
  // umask, and the socket in it stays open to every user (identity comes from SO_PEERCRED).
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.socket_path = dir + "/run/orion/orion.sock";
  cfg.agent_socket = dir + "/run/orion/agent.sock";
  const mode_t old_umask = umask(077);
  std::unique_ptr<OrionServer> server = testing::StartServer(cfg);
  umask(old_umask);
  ASSERT_NE(server, nullptr);
  for (const std::string& folder : {dir + "/run", dir + "/run/orion"}) {
    struct stat st {};
    ASSERT_EQ(stat(folder.c_str(), &st), 0) << folder;
    EXPECT_TRUE(S_ISDIR(st.st_mode)) << folder;
    EXPECT_EQ(st.st_mode & 07777, 0755u) << folder;
    EXPECT_EQ(st.st_uid, getuid()) << folder;
  }
  struct stat sock {};
  ASSERT_EQ(stat(cfg.socket_path.c_str(), &sock), 0);
  EXPECT_TRUE(S_ISSOCK(sock.st_mode));
  EXPECT_EQ(sock.st_mode & 0777, 0666u);
}

TEST(SocketFolderTest, AFolderThatCannotBeMadeIsNamedWithTheFix) {
  const std::string dir = testing::MakeTempDir();
  { std::ofstream(dir + "/file") << "a file, not a folder\n"; }
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.socket_path = dir + "/file/orion/orion.sock";
  ServerOptions opts;
  opts.discover_gpus = false;
  auto s = OrionServer::Start(cfg, opts);
  ASSERT_FALSE(s.ok());
  const std::string message(s.status().message());
  EXPECT_NE(message.find("socket_path: cannot create the folder " + dir + "/file/orion"),
            std::string::npos) << message;
  EXPECT_NE(message.find("run orion-server as root"), std::string::npos) << message;
  EXPECT_NE(message.find("set socket_path to a path in a folder"), std::string::npos) << message;
}

TEST_F(RegistrationTest, BadMagicGetsAClearRefusal) {
  auto req = testing::MakeRequest(cfg_.gpus[0].c_str(), Priority::kHigh);
  req.header.magic = 0x12345678;
  RegisterReply reply{};
  const int fd = testing::RegisterClient(cfg_.socket_path, req, &reply);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kBadRequest));
  EXPECT_NE(std::string(reply.message).find("bad magic"), std::string::npos) << reply.message;
  close(fd);
  EXPECT_TRUE(server_->state().ListClients({}).empty());
}

TEST_F(RegistrationTest, WrongVersionAndPriorityAreRejected) {
  auto req = testing::MakeRequest(cfg_.gpus[0].c_str(), Priority::kHigh);
  req.header.version = 99;
  RegisterReply reply{};
  int fd = testing::RegisterClient(cfg_.socket_path, req, &reply);
  ASSERT_GE(fd, 0);
  EXPECT_NE(std::string(reply.message).find("version 99"), std::string::npos) << reply.message;
  close(fd);
  req = testing::MakeRequest(cfg_.gpus[0].c_str(), Priority::kHigh);
  req.requested_priority = 7;
  fd = testing::RegisterClient(cfg_.socket_path, req, &reply);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(reply.status, static_cast<uint32_t>(RegisterStatus::kBadRequest));
  EXPECT_NE(std::string(reply.message).find("requested_priority 7"), std::string::npos);
  close(fd);
}

TEST_F(RegistrationTest, ConfigRuleBeatsTheClientsRequest) {
  const pid_t child = fork();
  if (child == 0) {
    // The server reads /proc/<pid>/comm, which the process sets itself (standalone mode trusts
    // the node's own users; pods are identified by cgroup instead).
    pthread_setname_np(pthread_self(), "orion-ruled-x");
    RegisterReply reply{};
    auto req = testing::MakeRequest(cfg_.gpus[0].c_str(), Priority::kBestEffort);
    const int fd = testing::RegisterClient(cfg_.socket_path, req, &reply);
    if (fd < 0 || reply.status != 0) _exit(3);
    _exit(reply.priority == static_cast<uint32_t>(Priority::kHigh) &&
                  reply.memory_limit_bytes == 123456
              ? 0
              : 4);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(RegistrationTest, ThreeHundredProcessesRegisterAtOnce) {
  constexpr int kClients = 300;
  // kMaxSlots is 256: the first 256 get slots, the rest a clear kNoSlot answer.
  int ready[2], release[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(release), 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> kids;
  for (int i = 0; i < kClients; ++i) {
    const pid_t p = fork();
    if (p == 0) {
      close(release[1]);
      RegisterReply reply{};
      auto req = testing::MakeRequest(cfg_.gpus[i % 2].c_str(), Priority::kBestEffort);
      const int fd = testing::RegisterClient(cfg_.socket_path, req, &reply);
      const char r = fd < 0 ? 'e' : reply.status == 0 ? 'o' : reply.status == 2 ? 'n' : 'x';
      (void)!write(ready[1], &r, 1);
      char c;
      (void)!read(release[0], &c, 1);  // hold the registration until the parent is done
      _exit(0);
    }
    kids.push_back(p);
  }
  int ok = 0, no_slot = 0, other = 0;
  for (int i = 0; i < kClients; ++i) {
    char r = 0;
    ASSERT_EQ(read(ready[0], &r, 1), 1);
    (r == 'o' ? ok : r == 'n' ? no_slot : other)++;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("seconds_for_300", std::to_string(secs));
  std::printf("300 processes: %d registered, %d refused (no slot) in %.3f s\n", ok, no_slot, secs);
  EXPECT_EQ(ok, static_cast<int>(contract::kMaxSlots));
  EXPECT_EQ(no_slot, kClients - static_cast<int>(contract::kMaxSlots));
  EXPECT_EQ(other, 0);
  close(release[1]);
  for (pid_t p : kids) waitpid(p, nullptr, 0);
  EXPECT_TRUE(testing::WaitFor([&] { return server_->state().ListClients({}).empty(); }));
}

}  // namespace
}  // namespace orion::server
