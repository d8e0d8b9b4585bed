// The memory quota holds per pod: real processes under the interposer on the CUDA driver test
// double, registered with an in-process orion-server whose view of the kernel (/proc/<pid>/cgroup)
// is a recorded tree, so the test decides which pod each process is in. The pods' limits come
// from the agent's pod policies (orion/memory-limit).
//  - two processes of one pod hold 64 MiB together: a third process of that pod gets nothing, a
//    process of another pod still gets its whole 64 MiB; one of the pod's holders killed with
//    SIGKILL gives its share back (the server does, from what its area says it held);
//  - a process of the pod writes over the pod's quota counter (a huge value, a value that
//    wraps, garbage written all the while): the pod's next process is refused, exits cleanly,
//    and the other pod is untouched.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "contract/orion_contract.h"
#include "server/config.h"
#include "server/orion_server.h"
#include "tests/cuda_double/child_process.h"
#include "tests/registered_client.h"

namespace {

namespace c = orion::contract;
using orion::testing::NowS;
using orion::testing::ReadFile;

constexpr char kPodA[] = "aaaaaaaa-1111-2222-3333-444444444444";
constexpr char kPodB[] = "bbbbbbbb-1111-2222-3333-444444444444";
constexpr uint64_t kMi = 1ull << 20;
constexpr uint64_t kLimit = 64 * kMi;

template <typename F>
bool WaitUntil(F done, double seconds) {
  const double end = NowS() + seconds;
  while (NowS() < end) {
    if (done()) return true;
    usleep(5000);
  }
  return done();
}

class PodQuotaTest : public ::testing::Test {
 public:
  // Waits for a process to exit; its exit status (or -1) and its result line's fields.
  struct Finished {
    int status = -1;
    std::map<std::string, std::string> result;
    std::string log;
  };

 protected:
  void SetUp() override {
    dir_ = orion::testing::MakeTestDir("orion-pod-quota");
    ASSERT_FALSE(dir_.empty());
    ASSERT_EQ(mkdir((dir_ + "/proc").c_str(), 0755), 0);
    auto config = orion::server::ParseServerConfig("", "<test>");
    ASSERT_TRUE(config.ok()) << config.status();
    config->socket_path = dir_ + "/orion.sock";
    config->agent_socket = dir_ + "/agent/agent.sock";
    config->admin_address = "127.0.0.1:0";
    config->metrics_address = "127.0.0.1:0";
    config->trust_client_requests = false;  // a cluster node: limits come from pods only
    orion::server::ServerOptions options;
    options.discover_gpus = false;
    options.proc_root = dir_ + "/proc";
    auto server = orion::server::OrionServer::Start(*config, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    env_ = orion::testing::ClientEnv(dir_, "4Gi", ORION_INTERPOSE_LIB, ORION_CUDA_DOUBLE_DIR);
    std::vector<orion::server::PodPolicy> pods;
    for (const char* uid : {kPodA, kPodB}) {
      orion::server::PodPolicy p;
      p.pod_uid = uid;
      p.ns = "ml";
      p.name = uid == kPodA ? std::string("pod-a") : std::string("pod-b");
      p.memory_limit_bytes = kLimit;
      pods.push_back(p);
    }
    ASSERT_TRUE(server_->state().UpsertPods(pods, /*full_sync=*/true).ok());
  }

  void TearDown() override {
    for (auto& [pid, log] : running_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    server_.reset();
    if (!dir_.empty()) ASSERT_EQ(system(("rm -rf " + dir_).c_str()), 0);
  }

  // What the kernel would show the server for a process of `pod`.
  void PutInPod(pid_t pid, const char* pod) {
    const std::string proc = dir_ + "/proc/" + std::to_string(pid);
    mkdir(proc.c_str(), 0755);
    std::ofstream(proc + "/cgroup") << "0::/kubepods/burstable/pod" << pod << "/"
                                    << std::string(64, 'c') << "\n";
    std::ofstream(proc + "/comm") << "orion-sample-al\n";
  }

  // Starts orion-sample-alloc (16 MiB chunks, `extra` flags) as a process of `pod`: it waits
  // until its cgroup is recorded, then runs under the interposer on the test double.
  pid_t StartAlloc(const char* pod, std::vector<std::string> extra, const std::string& name) {
    int go[2];
    if (pipe(go) != 0) return -1;
    const std::string log = dir_ + "/" + name + ".log";
    const pid_t pid = fork();
    if (pid == 0) {
      close(go[1]);
      char byte;
      if (read(go[0], &byte, 1) != 1) _exit(125);
      for (const std::string& kv : env_) putenv(const_cast<char*>(kv.c_str()));
      if (freopen(log.c_str(), "w", stdout) == nullptr) _exit(126);
      dup2(STDOUT_FILENO, STDERR_FILENO);
      std::vector<std::string> args = {ORION_SAMPLE_ALLOC, "--chunk", "16Mi"};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(go[0]);
    PutInPod(pid, pod);
    if (write(go[1], "g", 1) != 1) ADD_FAILURE() << "cannot start " << name;
    close(go[1]);
    running_[pid] = log;
    return pid;
  }

  Finished Wait(pid_t pid, double seconds = 30) {
    Finished f;
    int status = 0;
    const double end = NowS() + seconds;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (NowS() > end) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      usleep(10000);
    }
    f.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    f.log = ReadFile(running_[pid]);
    running_.erase(pid);
    f.result = orion::testing::ResultFields(f.log);
    return f;
  }

  // A process that allocated `chunks` and now holds them (its "after N chunks" line).
  bool Holds(pid_t pid, int chunks) {
    return WaitUntil(
        [&] {
          return ReadFile(running_[pid]).find("after " + std::to_string(chunks) + " chunks") !=
                 std::string::npos;
        },
        30);
  }

  // The live client of a process, if registered.
  bool ClientOf(pid_t pid, orion::server::ClientView* out) {
    for (const auto& v : server_->state().ListClients({})) {
      if (v.host_pid == static_cast<uint32_t>(pid)) {
        *out = v;
        return true;
      }
    }
    return false;
  }

  uint64_t PodUsed(pid_t holder) {
    orion::server::ClientView v;
    if (!ClientOf(holder, &v)) return ~0ull;
    const c::QuotaArea* q = server_->state().board().quota(v.slot);
    return q == nullptr ? ~0ull : q->counters.used_bytes.load();
  }

  std::string dir_;
  std::unique_ptr<orion::server::OrionServer> server_;
  std::vector<std::string> env_;  // a client of this server on the test double
  std::map<pid_t, std::string> running_;
};

// A field of a finished process's result line ("" when it printed none).
std::string Field(const PodQuotaTest::Finished& f, const std::string& key) {
  auto it = f.result.find(key);
  return it == f.result.end() ? std::string() : it->second;
}

TEST_F(PodQuotaTest, OnePodsProcessesShareOneLimitAndAnotherPodIsUnaffected) {
  // Two processes of pod A hold 32 MiB each: the pod's 64 MiB.
  const pid_t a1 = StartAlloc(kPodA, {"--max", "32Mi", "--hold", "60"}, "a1");
  ASSERT_TRUE(Holds(a1, 2)) << ReadFile(dir_ + "/a1.log");
  const pid_t a2 = StartAlloc(kPodA, {"--max", "32Mi", "--hold", "60"}, "a2");
  ASSERT_TRUE(Holds(a2, 2)) << ReadFile(dir_ + "/a2.log");
  EXPECT_EQ(PodUsed(a1), kLimit);
  EXPECT_EQ(PodUsed(a2), kLimit);  // the same area
  EXPECT_EQ(server_->state().board().quota_areas(), 1u);

  // A third process of pod A: refused at its first allocation, and cuMemGetInfo shows no room.
  const Finished a3 = Wait(StartAlloc(kPodA, {}, "a3"));
  EXPECT_EQ(a3.status, 0) << a3.log;
  EXPECT_EQ(Field(a3, "chunks"), "0") << a3.log;
  EXPECT_EQ(Field(a3, "failure"), "CUDA_ERROR_OUT_OF_MEMORY") << a3.log;
  EXPECT_EQ(Field(a3, "free_before"), "0") << a3.log;
  EXPECT_EQ(Field(a3, "total"), std::to_string(kLimit)) << a3.log;

  // Pod B is untouched: its whole 64 MiB.
  const Finished b1 = Wait(StartAlloc(kPodB, {}, "b1"));
  EXPECT_EQ(b1.status, 0) << b1.log;
  EXPECT_EQ(Field(b1, "chunks"), "4") << b1.log;
  EXPECT_EQ(Field(b1, "failure"), "CUDA_ERROR_OUT_OF_MEMORY") << b1.log;

  // One of pod A's holders killed: the server gives its 32 MiB back to the pod.
  kill(a1, SIGKILL);
  waitpid(a1, nullptr, 0);
  running_.erase(a1);
  orion::server::ClientView gone;
  ASSERT_TRUE(WaitUntil([&] { return !ClientOf(a1, &gone); }, 10));
  EXPECT_EQ(PodUsed(a2), 32 * kMi);
  const Finished a4 = Wait(StartAlloc(kPodA, {}, "a4"));
  EXPECT_EQ(a4.status, 0) << a4.log;
  EXPECT_EQ(Field(a4, "chunks"), "2") << a4.log;

  // The last holder leaves on its own: the pod's area goes with it; a new process of the pod
  // starts from zero.
  kill(a2, SIGKILL);
  waitpid(a2, nullptr, 0);
  running_.erase(a2);
  ASSERT_TRUE(WaitUntil([&] { return server_->state().board().quota_areas() == 0; }, 10));
  const Finished a5 = Wait(StartAlloc(kPodA, {}, "a5"));
  EXPECT_EQ(Field(a5, "chunks"), "4") << a5.log;
}

TEST_F(PodQuotaTest, ATamperedCounterHurtsOnlyItsOwnPodAndCrashesNothing) {
  // A holder of pod A, so the GPU is known and the pod's area lives.
  const pid_t a1 = StartAlloc(kPodA, {"--max", "16Mi", "--hold", "60"}, "a1");
  ASSERT_TRUE(Holds(a1, 1)) << ReadFile(dir_ + "/a1.log");
  const auto gpus = server_->state().ListGpus();
  ASSERT_EQ(gpus.size(), 1u);

  // The attacker: this process, registered as a process of pod A, maps the pod's quota area as
  // any of its processes can.
  PutInPod(getpid(), kPodA);
  c::RegisterRequest req{};
  req.header = c::MakeHeader(c::MessageType::kRegister, sizeof(req));
  std::snprintf(req.gpu_uuid, sizeof(req.gpu_uuid), "%s", gpus[0].uuid.c_str());
  req.requested_priority = c::kNoValue32;
  c::RegisterReply reply{};
  orion::testing::ClientMaps maps;
  const int sock = orion::testing::RegisterClient(dir_ + "/orion.sock", req, &reply, &maps);
  ASSERT_GE(sock, 0);
  ASSERT_EQ(reply.status, 0u) << reply.message;
  ASSERT_NE(maps.quota, nullptr);
  EXPECT_EQ(maps.quota->counters.used_bytes.load(), 16 * kMi);  // the holder's, shared

  // A huge value, and one that wraps on the next add: pod A's next process is refused cleanly.
  for (uint64_t forged : {~0ull - 5, ~0ull, 1ull << 63}) {
    maps.quota->counters.used_bytes.store(forged);
    const Finished a = Wait(StartAlloc(kPodA, {}, "a-forged"));
    EXPECT_EQ(a.status, 0) << a.log;
    EXPECT_EQ(Field(a, "chunks"), "0") << forged << "\n" << a.log;
    EXPECT_EQ(Field(a, "failure"), "CUDA_ERROR_OUT_OF_MEMORY") << a.log;
  }
  // Pod B never sees it.
  const Finished b1 = Wait(StartAlloc(kPodB, {}, "b1"));
  EXPECT_EQ(b1.status, 0) << b1.log;
  EXPECT_EQ(Field(b1, "chunks"), "4") << b1.log;

  // Garbage written all the while (and the area's header too): the pod's process neither
  // crashes nor hangs, and its allocations stay within the limit or are refused.
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    std::mt19937_64 rng(7);
    while (!stop.load()) {
      maps.quota->counters.used_bytes.store(rng() % 2 == 0 ? rng() : rng() % kLimit);
      maps.quota->counters.peak_bytes.store(rng());
      maps.quota->header.magic = static_cast<uint32_t>(rng());
    }
  });
  const Finished a2 = Wait(StartAlloc(kPodA, {}, "a-scribbled"), 60);
  stop = true;
  scribbler.join();
  EXPECT_EQ(a2.status, 0) << a2.log;
  ASSERT_FALSE(Field(a2, "chunks").empty()) << a2.log;
  EXPECT_LE(std::stoi(Field(a2, "chunks")), 4) << a2.log;
  const Finished b2 = Wait(StartAlloc(kPodB, {}, "b2"));
  EXPECT_EQ(Field(b2, "chunks"), "4") << b2.log;

  // A process frees what it holds under a forged counter and exits cleanly too.
  maps.quota->counters.used_bytes.store(0);
  const pid_t a3 = StartAlloc(kPodA, {"--max", "32Mi", "--hold", "1"}, "a-frees");
  ASSERT_TRUE(Holds(a3, 2)) << ReadFile(dir_ + "/a-frees.log");
  maps.quota->counters.used_bytes.store(~0ull);
  const Finished a3_end = Wait(a3);
  EXPECT_EQ(a3_end.status, 0) << a3_end.log;
  EXPECT_EQ(Field(a3_end, "chunks"), "2") << a3_end.log;
  close(sock);
}

}  // namespace
