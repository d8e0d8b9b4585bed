// A hostile tenant, on the CUDA driver test double with the real orion-server: while a
// high-priority service and a best-effort trainer run, a process that has the board mapped (as
// every sharing pod has today) writes over everything it can reach for 2.5 s: random bytes at
// random places past the first 4 KiB, and on purpose every server-owned field (every client
// high priority, every client paused, the knobs, the priority mask, the header). Afterwards:
//  - the server put every server-owned field back within one policy tick, and counts it
//    (orion_board_corrections_total);
//  - no client is held forever: the trainer finishes its run within 3 s of its planned end (the
//    measured failure before: asleep in a futex wait 40 s after its run should have ended), and
//    the service finishes all its requests;
//  - the two keep the priorities the server gave them.
// What the attacker can still do while it writes (client-written counters and rings of other
// clients, forged busy state) is listed in docs/security.md; the split that removes it is not
// built yet.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "contract/gate_rules.h"
#include "contract/orion_contract.h"
#include "tests/cuda_double/board_view.h"
#include "tests/cuda_double/child_process.h"

namespace {

namespace c = orion::contract;

using orion::testing::FindSlot;
using orion::testing::NowS;
using orion::testing::ReadFile;
using orion::testing::StartProcess;

class HostileTenantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = orion::testing::MakeTestDir("orion-hostile");
    ASSERT_FALSE(dir_.empty());
    config_ = orion::testing::WriteServerConfig(dir_);
    env_ = orion::testing::ClientEnv(dir_, "4Gi", ORION_INTERPOSE_LIB, ORION_CUDA_DOUBLE_DIR);
  }
  void TearDown() override {
    for (pid_t pid : pids_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (!dir_.empty()) ASSERT_EQ(system(("rm -rf " + dir_).c_str()), 0);
  }
  std::string dir_, config_;
  std::vector<std::string> env_;
  std::vector<pid_t> pids_;
};

// Waits for `pid` to exit within `seconds`; its exit status, or -1 if it is still running.
int WaitExit(pid_t pid, double seconds) {
  const double t0 = NowS();
  int status = 0;
  while (NowS() - t0 < seconds) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(20'000);
  }
  return -1;
}


TEST_F(HostileTenantTest, WritingOverTheBoardHoldsNobodyForeverAndIsPutBack) {
  const pid_t server = StartProcess({ORION_SERVER, "--config", config_}, env_,
                                    dir_ + "/server.log");
  pids_.push_back(server);
  for (int i = 0; i < 200 && access((dir_ + "/orion.sock").c_str(), F_OK) != 0; ++i) usleep(25'000);
  ASSERT_EQ(access((dir_ + "/orion.sock").c_str(), F_OK), 0) << ReadFile(dir_ + "/server.log");

  std::vector<std::string> hp_env = env_, be_env = env_;
  hp_env.push_back("ORION_PRIORITY=high");
  be_env.push_back("ORION_PRIORITY=best-effort");
  constexpr double kTrainSeconds = 5.0;
  const double started = NowS();
  const pid_t service = StartProcess({ORION_SAMPLE_INFER, "--rate", "200", "--requests", "1000",
                                      "--kernels", "2", "--kernel-us", "300"},
                                     hp_env, dir_ + "/service.log");
  const pid_t trainer = StartProcess({ORION_SAMPLE_TRAIN, "--seconds", "5", "--kernels", "8",
                                      "--kernel-us", "1000"},
                                     be_env, dir_ + "/trainer.log");
  pids_.push_back(service);
  pids_.push_back(trainer);

  // The tenant's view: the board file, mapped read-write as the interposer maps it.
  const int fd = open((dir_ + "/board").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const off_t size = lseek(fd, 0, SEEK_END);
  void* mem = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(mem, MAP_FAILED);
  auto* board = static_cast<c::Board*>(mem);
  auto* bytes = static_cast<unsigned char*>(mem);
  for (int i = 0;
       i < 100 && (FindSlot(*board, service) == nullptr || FindSlot(*board, trainer) == nullptr);
       ++i) {
    usleep(50'000);
  }
  ASSERT_NE(FindSlot(*board, service), nullptr) << ReadFile(dir_ + "/service.log");
  ASSERT_NE(FindSlot(*board, trainer), nullptr) << ReadFile(dir_ + "/trainer.log");
  usleep(300'000);

  std::mt19937_64 rng(42);
  uint64_t writes = 0;
  const double attack_start = NowS();
  while (NowS() - attack_start < 2.5) {
    // Random bytes at a random place past the first 4 KiB.
    const size_t at = 4096 + rng() % (static_cast<size_t>(size) - 8192);
    for (size_t i = 0; i < 4096; i += 8) {
      const uint64_t r = rng();
      std::memcpy(bytes + at + i, &r, 8);
    }
    // And on purpose, what would hurt the others most.
    for (c::ClientSlot& s : board->slots) {
      s.priority.store(static_cast<uint32_t>(c::Priority::kHigh));
      s.paused.store(1);
    }
    for (c::GpuState& g : board->gpus) {
      g.hp_slot_mask[0].store(~0ull);
      g.spin_ns.store(0xFFFFFFFFu);
      g.be_budget_ns.store(0);
      g.hp_stale_ns.store(~0ull);
    }
    board->header.magic = 0;
    ++writes;
    usleep(500);
  }
  const double attack_end = NowS();

  // One policy tick (100 ms) later, the server's fields are its own again.
  usleep(300'000);
  const c::ClientSlot* hp = FindSlot(*board, service);
  const c::ClientSlot* be = FindSlot(*board, trainer);
  ASSERT_NE(hp, nullptr);
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(hp->priority.load(), static_cast<uint32_t>(c::Priority::kHigh));
  EXPECT_EQ(be->priority.load(), static_cast<uint32_t>(c::Priority::kBestEffort));
  EXPECT_EQ(hp->paused.load(), 0u);
  EXPECT_EQ(be->paused.load(), 0u);
  EXPECT_EQ(board->header.magic, c::kBoardMagic);
  EXPECT_EQ(board->gpus[be->gpu.load()].spin_ns.load(), c::kDefaultSpinNs);
  const uint64_t launches_after_attack = be->launches.load();
  usleep(500'000);
  EXPECT_GT(be->launches.load(), launches_after_attack) << "the trainer is still held";

  // Nobody is held forever: the trainer ends within 3 s of its planned end, the service finishes.
  const double planned_end = started + kTrainSeconds;
  const int trainer_rc = WaitExit(trainer, planned_end + 3.0 - NowS() + 1.0);
  const double trainer_done = NowS();
  EXPECT_EQ(trainer_rc, 0) << ReadFile(dir_ + "/trainer.log");
  const int service_rc = WaitExit(service, 15.0);
  EXPECT_EQ(service_rc, 0) << ReadFile(dir_ + "/service.log");
  pids_ = {server};
  EXPECT_EQ(kill(server, 0), 0) << "the server died\n" << ReadFile(dir_ + "/server.log");
  const std::string log = ReadFile(dir_ + "/server.log");
  EXPECT_NE(log.find("server-owned board fields had been overwritten"), std::string::npos) << log;
  munmap(mem, static_cast<size_t>(size));
  printf("{\"attack_s\":%.2f,\"attack_writes\":%llu,\"trainer_late_s\":%.2f,"
         "\"trainer_rc\":%d,\"service_rc\":%d}\n",
         attack_end - attack_start, static_cast<unsigned long long>(writes),
         trainer_done - planned_end, trainer_rc, service_rc);
}

}  // namespace
