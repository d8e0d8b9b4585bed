// End-to-end test of liborion_interpose.so: a driver-API probe runs under LD_PRELOAD on the CUDA
// driver test double, while this test process plays orion-server's part with a test registrar
// (a board file plus the Unix-socket registration protocol of contract/orion_contract.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "contract/orion_contract.h"

namespace {

namespace c = orion::contract;

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + ts.tv_nsec;
}

// Stands in for orion-server: creates the board, answers registrations, keeps a heartbeat, and
// frees a slot when its connection closes.
class TestRegistrar {
 public:
  TestRegistrar(const std::string& dir, uint64_t memory_limit, bool honour_priority)
      : dir_(dir), memory_limit_(memory_limit), honour_priority_(honour_priority) {
    board_path_ = dir_ + "/board";
    socket_path_ = dir_ + "/orion.sock";
    const int fd = open(board_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, c::kBoardBytes), 0);
    void* addr = mmap(nullptr, c::kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(addr, MAP_FAILED);
    board_ = static_cast<c::Board*>(addr);
    c::BoardHeader& h = board_->header;
    h.version = c::kBoardVersion;
    h.header_bytes = sizeof(c::BoardHeader);
    h.gpu_state_bytes = sizeof(c::GpuState);
    h.slot_bytes = sizeof(c::ClientSlot);
    h.num_gpus = 1;
    h.max_slots = c::kMaxSlots;
    h.ring_capacity = c::kRingCapacity;
    h.server_epoch.store(77);
    h.server_heartbeat_ns.store(NowNs());
    board_->gpus[0].present.store(1);
    board_->gpus[0].mode.store(static_cast<uint32_t>(c::GateMode::kPassThrough));
    reinterpret_cast<std::atomic<uint32_t>*>(&h.magic)->store(c::kBoardMagic);

    listen_fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr_un{};
    addr_un.sun_family = AF_UNIX;
    snprintf(addr_un.sun_path, sizeof(addr_un.sun_path), "%s", socket_path_.c_str());
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr_un), sizeof(addr_un)), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    heartbeat_thread_ = std::thread([this] {
      while (!stop_) {
        board_->header.server_heartbeat_ns.store(NowNs());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }

  ~TestRegistrar() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    accept_thread_.join();
    heartbeat_thread_.join();
    for (auto& t : connection_threads_) t.join();
    munmap(board_, c::kBoardBytes);
  }

  const std::string& socket_path() const { return socket_path_; }
  c::Board& board() { return *board_; }
  std::vector<c::RegisterRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int closed_connections() const { return closed_.load(); }

  // Drains every published event of a slot.
  std::vector<c::Event> Drain(uint32_t slot) {
    std::vector<c::Event> events;
    c::Event e;
    while (board_->slots[slot].ring.TryPop(&e)) events.push_back(e);
    return events;
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      connection_threads_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  void Serve(int fd) {
    c::RegisterRequest request{};
    if (recv(fd, &request, sizeof(request), MSG_WAITALL) != sizeof(request)) {
      close(fd);
      return;
    }
    uint32_t slot_index;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(request);
      slot_index = next_slot_++;
    }
    c::ClientSlot& slot = board_->slots[slot_index];
    slot.ring.Reset();
    slot.gpu.store(0);
    slot.client_id.store(100 + slot_index);
    const uint32_t priority =
        honour_priority_ && request.requested_priority != c::kNoValue32
            ? request.requested_priority
            : static_cast<uint32_t>(c::Priority::kBestEffort);
    slot.priority.store(priority);
    slot.memory_limit_bytes.store(memory_limit_);
    slot.generation.fetch_add(1);
    slot.state.store(static_cast<uint32_t>(c::SlotState::kActive));
    if (priority == static_cast<uint32_t>(c::Priority::kHigh)) {
      board_->gpus[0].hp_slot_mask[slot_index / 64].fetch_or(1ull << (slot_index % 64));
    }

    c::RegisterReply reply{};
    reply.header = c::MakeHeader(c::MessageType::kRegisterReply, sizeof(reply));
    reply.status = static_cast<uint32_t>(c::RegisterStatus::kOk);
    reply.client_id = 100 + slot_index;
    reply.slot = slot_index;
    reply.generation = slot.generation.load();
    reply.gpu = 0;
    reply.priority = priority;
    reply.memory_limit_bytes = memory_limit_;
    reply.server_epoch = 77;
    snprintf(reply.board_path, sizeof(reply.board_path), "%s", board_path_.c_str());
    send(fd, &reply, sizeof(reply), MSG_NOSIGNAL);
    // Hold the registration until the client goes away.
    char byte;
    while (recv(fd, &byte, 1, 0) > 0) {
    }
    close(fd);
    closed_.fetch_add(1);
  }

  std::string dir_, board_path_, socket_path_;
  uint64_t memory_limit_;
  bool honour_priority_;
  c::Board* board_ = nullptr;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_{0};
  std::thread accept_thread_, heartbeat_thread_;
  std::vector<std::thread> connection_threads_;
  std::mutex mu_;
  std::vector<c::RegisterRequest> requests_;
  uint32_t next_slot_ = 0;
};

struct ProbeRun {
  int exit_code = -1;
  std::map<std::string, std::string> values;  // key=value lines of stdout
  std::string err;
};

class InterposeIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef ORION_PROBE
    GTEST_SKIP() << "the CUDA driver test double (tests/cuda_double) is not part of this build";
#else
    char tmpl[] = "/tmp/orion-interpose-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
#endif
  }
  void TearDown() override {
    if (!dir_.empty()) {
      const std::string cmd = "rm -rf " + dir_;
      ASSERT_EQ(system(cmd.c_str()), 0);
    }
  }

  ProbeRun RunProbe(const std::string& env, const std::string& args = "") {
    ProbeRun run;
#ifdef ORION_PROBE
    const std::string err_path = dir_ + "/stderr.txt";
    const std::string cmd = "env ORION_SIM_DIR=" + dir_ + "/sim LD_LIBRARY_PATH=" +
                            ORION_CUDA_DOUBLE_LIB_DIR + " LD_PRELOAD=" + ORION_INTERPOSE_LIB +
                            " " + env + " " + ORION_PROBE + " " + args + " 2>" + err_path;
    FILE* pipe = popen(cmd.c_str(), "r");
    if (pipe == nullptr) return run;
    char line[512];
    while (fgets(line, sizeof(line), pipe) != nullptr) {
      std::string s(line);
      if (!s.empty() && s.back() == '\n') s.pop_back();
      const size_t eq = s.find('=');
      if (eq != std::string::npos) run.values[s.substr(0, eq)] = s.substr(eq + 1);
    }
    const int status = pclose(pipe);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(err_path);
    std::stringstream ss;
    ss << in.rdbuf();
    run.err = ss.str();
#endif
    return run;
  }

  std::string dir_;
};

int CountKind(const std::vector<c::Event>& events, c::EventKind kind) {
  int n = 0;
  for (const auto& e : events) n += e.kind == kind;
  return n;
}

TEST_F(InterposeIntegrationTest, RegistersReportsLaunchesAndEnforcesQuota) {
  TestRegistrar registrar(dir_, 64ull << 20, /*honour_priority=*/false);
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "5");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err.find("orion:"), std::string::npos) << run.err;

  const auto requests = registrar.requests();
  ASSERT_EQ(requests.size(), 1u);
  const c::RegisterRequest& request = requests[0];
  EXPECT_EQ(request.header.magic, c::kWireMagic);
  EXPECT_EQ(request.header.bytes, sizeof(c::RegisterRequest));
  EXPECT_EQ(request.device_ordinal, 0u);
  EXPECT_EQ(std::string(request.gpu_uuid).rfind("GPU-", 0), 0u) << request.gpu_uuid;
  EXPECT_EQ(strlen(request.gpu_uuid), 40u);
  EXPECT_STREQ(request.process_name, "orion_interpose_probe");
  EXPECT_EQ(request.requested_priority, c::kNoValue32);

  // Every lookup path ends in the interposer.
  EXPECT_EQ(run.values.at("proc_hook"), "1");
  EXPECT_EQ(run.values.at("dlsym_hook"), "1");
  EXPECT_EQ(run.values.at("dlsym_other_real"), "1");

  // Quota: 32 MiB fits, 48 MiB more would cross 64 MiB and never reaches the driver.
  EXPECT_EQ(run.values.at("alloc32"), "0");
  EXPECT_EQ(run.values.at("alloc48"), "2");
  EXPECT_EQ(run.values.at("meminfo_total"), std::to_string(64ull << 20));
  EXPECT_EQ(run.values.at("meminfo_free"), std::to_string(32ull << 20));

  c::ClientSlot& slot = registrar.board().slots[0];
  EXPECT_EQ(slot.memory_used_bytes.load(), 0u);
  EXPECT_EQ(slot.memory_peak_bytes.load(), 32ull << 20);
  // 5 direct + Ex + cuGetProcAddress + dlsym launches and the 3 kernel nodes of the graph
  // replay; the 3 launches during stream capture ran nothing and are not counted.
  EXPECT_EQ(slot.launches.load(), 8u + 3u);

  const auto events = registrar.Drain(0);
  EXPECT_EQ(CountKind(events, c::EventKind::kLaunch), 8);
  EXPECT_EQ(CountKind(events, c::EventKind::kKernelName), 1);
  EXPECT_EQ(CountKind(events, c::EventKind::kAllocDenied), 1);
  bool saw_graph = false, saw_name = false, saw_big_launch = false, saw_alloc = false;
  for (const auto& e : events) {
    if (e.kind == c::EventKind::kGraphLaunch) {
      saw_graph = true;
      EXPECT_EQ(e.aux, 3u);
    }
    if (e.kind == c::EventKind::kKernelName) saw_name = std::string(e.name) == "orion_spin";
    if (e.kind == c::EventKind::kLaunch && e.grid[0] == 1000 && e.block[0] == 128) {
      saw_big_launch = true;
      EXPECT_NE(e.cpu_ns, 0u);
      EXPECT_NE(e.stream, 0u);
    }
    if (e.kind == c::EventKind::kMemAlloc) {
      saw_alloc = e.bytes == (32ull << 20);
      EXPECT_EQ(e.aux, static_cast<uint32_t>(c::MemoryKind::kDevice));
    }
    if (e.kind == c::EventKind::kAllocDenied) EXPECT_EQ(e.bytes, 48ull << 20);
  }
  EXPECT_TRUE(saw_graph);
  EXPECT_TRUE(saw_name);
  EXPECT_TRUE(saw_big_launch);
  EXPECT_TRUE(saw_alloc);
  EXPECT_EQ(CountKind(events, c::EventKind::kMemFree), 1);

  // The connection (and with it the slot) goes away with the process.
  for (int i = 0; i < 100 && registrar.closed_connections() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(registrar.closed_connections(), 1);
}

TEST_F(InterposeIntegrationTest, HighPriorityInflightDrainsAndProfileTimesKernels) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/true);
  const ProbeRun run = RunProbe(
      "ORION_PRIORITY=high ORION_PROFILE=1 ORION_SOCKET=" + registrar.socket_path(), "4");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(registrar.requests().size(), 1u);
  EXPECT_EQ(registrar.requests()[0].requested_priority,
            static_cast<uint32_t>(c::Priority::kHigh));
  c::ClientSlot& slot = registrar.board().slots[0];
  EXPECT_EQ(slot.inflight.load(), 0u);
  EXPECT_NE(slot.last_progress_ns.load(), 0u);
  EXPECT_EQ(run.values.at("alloc48"), "0");  // no limit
  const auto events = registrar.Drain(0);
  int timed = 0;
  for (const auto& e : events) {
    if (e.kind == c::EventKind::kKernelTime) {
      ++timed;
      EXPECT_GT(e.duration_ns, 0u);
    }
  }
  EXPECT_GE(timed, 3);  // the first three launches of orion_spin are always timed
}

TEST_F(InterposeIntegrationTest, BestEffortWaitsWhileHighPriorityWorkRuns) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  c::GpuState& gpu = registrar.board().gpus[0];
  gpu.mode.store(static_cast<uint32_t>(c::GateMode::kPriority));
  gpu.sm_threshold.store(0);  // nothing fits beside HP work
  gpu.spin_ns.store(50'000);
  gpu.hp_stale_ns.store(1'000'000'000);
  // A pretend high-priority client in slot 200, busy for 300 ms.
  c::ClientSlot& hp = registrar.board().slots[200];
  gpu.hp_slot_mask[200 / 64].fetch_or(1ull << (200 % 64));
  hp.inflight.store(1);
  hp.last_progress_ns.store(NowNs());
  std::thread hp_done([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    hp.inflight.store(0);
    gpu.gate_seq.fetch_add(1);
    syscall(SYS_futex, &gpu.gate_seq, 1 /*FUTEX_WAKE*/, 0x7fffffff, nullptr, nullptr, 0);
  });
  const auto start = std::chrono::steady_clock::now();
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "2");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  hp_done.join();
  ASSERT_EQ(run.exit_code, 0) << run.err;
  c::ClientSlot& slot = registrar.board().slots[0];
  EXPECT_GE(slot.throttled_ns.load(), 100'000'000u);
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));
  const auto events = registrar.Drain(0);
  EXPECT_GE(CountKind(events, c::EventKind::kThrottled), 1);
  EXPECT_EQ(gpu.gate_waiters.load(), 0u);
}

TEST_F(InterposeIntegrationTest, NoServerPassesThroughWithOneStderrLine) {
  const ProbeRun run = RunProbe("ORION_SOCKET=" + dir_ + "/nobody-listens.sock");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.values.at("done"), "1");
  EXPECT_EQ(run.values.at("alloc48"), "0");  // no quota without a server
  size_t lines = 0, pos = 0;
  while ((pos = run.err.find("orion:", pos)) != std::string::npos) {
    ++lines;
    ++pos;
  }
  EXPECT_EQ(lines, 1u) << run.err;
  EXPECT_NE(run.err.find("passing CUDA calls through unchanged"), std::string::npos) << run.err;
}

TEST_F(InterposeIntegrationTest, QuietAndDisabled) {
  const ProbeRun quiet =
      RunProbe("ORION_QUIET=1 ORION_SOCKET=" + dir_ + "/nobody-listens.sock");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("orion:"), std::string::npos) << quiet.err;

  TestRegistrar registrar(dir_, 1 << 20, false);
  const ProbeRun disabled = RunProbe("ORION_DISABLE=1 ORION_SOCKET=" + registrar.socket_path());
  ASSERT_EQ(disabled.exit_code, 0) << disabled.err;
  EXPECT_TRUE(registrar.requests().empty());
  EXPECT_EQ(disabled.values.at("alloc32"), "0");  // the 1 MiB quota is not applied
}

}  // namespace
