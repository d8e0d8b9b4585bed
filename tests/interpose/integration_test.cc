// End-to-end test of liborion_interpose.so: a driver-API probe runs under LD_PRELOAD on the CUDA
// driver test double, while this test process plays orion-server's part with a test registrar
// (a board file plus the Unix-socket registration protocol of contract/orion_contract.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "contract/kernel_class.h"
#include "contract/orion_contract.h"
#include "interpose/futex.h"
#include "tests/interpose/test_registrar.h"

namespace {

namespace c = orion::contract;
using orion::interpose::testing::NowNs;
using orion::interpose::testing::TestRegistrar;

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
    const std::string cmd = "env ORION_SIM_DIR=" + dir_ +
                            "/sim LD_LIBRARY_PATH=" + ORION_CUDA_DOUBLE_LIB_DIR +
                            " LD_PRELOAD=" + ORION_INTERPOSE_LIB + " " + env + " " + ORION_PROBE +
                            " " + args + " 2>" + err_path;
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

  // The probe (2 launches) beside a pretend high-priority client busy for 300 ms
  // (PretendBusyHighPriority); *elapsed receives the probe's run time.
  ProbeRun RunBesideBusyHighPriority(TestRegistrar& registrar, bool graphs,
                                     std::chrono::steady_clock::duration* elapsed);

  std::string dir_;
};

// A pretend high-priority client in slot 200 of the registrar's GPU, busy with work in flight for
// `busy` (launching graphs or not; its busy period published as begun now where `period`); the
// returned thread ends it and wakes the gate's waiters.
std::thread PretendBusyHighPriority(TestRegistrar& registrar, bool graphs,
                                    std::chrono::milliseconds busy = std::chrono::milliseconds(300),
                                    bool period = false) {
  c::SlotGate& hp = registrar.gate().slots[200];
  registrar.board().gpus[0].hp_slot_mask[200 / 64].fetch_or(1ull << (200 % 64));
  hp.inflight.store(1);
  hp.last_progress_ns.store(NowNs());
  hp.launches_graphs.store(graphs ? 1 : 0);
  if (period) hp.busy_start_ns.store(NowNs());
  return std::thread([&registrar, &hp, busy] {
    std::this_thread::sleep_for(busy);
    hp.inflight.store(0);
    auto& words = registrar.gate().words;
    words.gate_seq.fetch_add(1);
    orion::interpose::FutexWakeAll(&words.gate_seq);
  });
}

// GPU 0 of the registrar's board in priority mode with gpu_hold on (high-priority notes stale
// after 1 s).
void HoldOnTheGpu(TestRegistrar& registrar) {
  c::GpuState& gpu = registrar.board().gpus[0];
  gpu.mode.store(static_cast<uint32_t>(c::GateMode::kPriority));
  gpu.gpu_hold.store(1);
  gpu.hp_stale_ns.store(1'000'000'000);
}

// The GPU hold with a bound of 100 ms and a release of at least `release_ms`, its word held
// (epoch 7), beside a pretend graph service busy for 800 ms from now (PretendBusyHighPriority's
// busy period): join the thread returned.
std::thread BusyGraphServiceWithABound(TestRegistrar& registrar, uint64_t release_ms) {
  HoldOnTheGpu(registrar);
  registrar.board().gpus[0].gpu_hold_max_ns.store(100'000'000);
  registrar.board().gpus[0].gpu_hold_release_ns.store(release_ms * 1'000'000);
  registrar.gate().words.gpu_hold.store(7);
  return PretendBusyHighPriority(registrar, /*graphs=*/true, std::chrono::milliseconds(800),
                                 /*period=*/true);
}

ProbeRun InterposeIntegrationTest::RunBesideBusyHighPriority(
    TestRegistrar& registrar, bool graphs, std::chrono::steady_clock::duration* elapsed) {
  std::thread hp_done = PretendBusyHighPriority(registrar, graphs);
  const auto start = std::chrono::steady_clock::now();
  ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "2");
  *elapsed = std::chrono::steady_clock::now() - start;
  hp_done.join();
  return run;
}

// The admin API's resume, as the server does it: the slot unpaused and its sleepers woken.
void Resume(c::ClientSlot& slot) {
  slot.paused.store(0);
  slot.wake_seq.fetch_add(1);
  orion::interpose::FutexWakeAll(&slot.wake_seq);
}

int CountKind(const std::vector<c::Event>& events, c::EventKind kind) {
  int n = 0;
  for (const auto& e : events) n += e.kind == kind;
  return n;
}

TEST_F(InterposeIntegrationTest, RegistersReportsLaunchesAndEnforcesQuota) {
  TestRegistrar registrar(dir_, 64ull << 20, /*honour_priority=*/false);
  ASSERT_TRUE(registrar.ok());
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

  ASSERT_NE(registrar.area(0), nullptr);
  const c::ClientArea::Counters& slot = registrar.area(0)->counters;
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
  // A best-effort client shares the GPU and the gate is on: high-priority launches are followed
  // to completion (counted in inflight until the poller sees them done).
  registrar.board().gpus[0].mode.store(static_cast<uint32_t>(c::GateMode::kPriority));
  registrar.board().gpus[0].be_clients.store(1);
  const ProbeRun run =
      RunProbe("ORION_PRIORITY=high ORION_PROFILE=1 ORION_SOCKET=" + registrar.socket_path(), "4");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(registrar.requests().size(), 1u);
  EXPECT_EQ(registrar.requests()[0].requested_priority, static_cast<uint32_t>(c::Priority::kHigh));
  const c::SlotGate& slot = registrar.gate().slots[0];
  EXPECT_EQ(slot.inflight.load(), 0u);
  EXPECT_NE(slot.last_progress_ns.load(), 0u);
  EXPECT_EQ(run.values.at("alloc48"), "0");  // no limit
  // The probe's last launch is a graph replay: MPS mode holds best-effort kernels beside it.
  EXPECT_EQ(slot.hp_kernel_class.load(), c::KernelClassToBoard(c::KernelClass::kMixed));
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
  gpu.spin_ns.store(50'000);
  gpu.hp_stale_ns.store(1'000'000'000);
  auto& words = registrar.gate().words;
  std::chrono::steady_clock::duration elapsed;
  const ProbeRun run = RunBesideBusyHighPriority(registrar, /*graphs=*/false, &elapsed);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_GE(registrar.area(0)->counters.throttled_ns.load(), 100'000'000u);
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));
  const auto events = registrar.Drain(0);
  EXPECT_GE(CountKind(events, c::EventKind::kThrottled), 1);
  EXPECT_EQ(words.gate_waiters.load(), 0u);
  // Every admitted launch was charged and every charge came back at completion.
  EXPECT_EQ(words.be_outstanding_ns.load(), 0u);
}

// gpu_hold: a best-effort client's launches go at once, each behind a stream wait on the gate's
// word, which a pretend high-priority client holds for 300 ms; the probe's stream synchronize
// returns only once the process's hold keeper has opened the word (the high-priority client
// idle), and nothing was held on the CPU. The time held on the GPU is the client's held time
// all the same: its throttled time and one held span, from its first held launch to the open.
TEST_F(InterposeIntegrationTest, GpuHoldQueuesBestEffortWorkBehindTheWordAndItsKeeperOpensIt) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  HoldOnTheGpu(registrar);
  auto& words = registrar.gate().words;
  words.gpu_hold.store(7);  // held by the high-priority client, a graph service
  std::chrono::steady_clock::duration elapsed;
  const ProbeRun run = RunBesideBusyHighPriority(registrar, /*graphs=*/true, &elapsed);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));  // its stream waited for the word
  const auto& counters = registrar.area(0)->counters;
  const uint64_t held_ns = counters.throttled_ns.load();
  EXPECT_GE(held_ns, 200'000'000u) << "the time held on the GPU is not counted";
  EXPECT_LE(held_ns, static_cast<uint64_t>(
                         std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()));
  EXPECT_EQ(counters.waiting_since_ns.load(), 0u);  // the wait ended with the hold
  uint64_t span_ns = 0;
  int spans = 0;
  for (const c::Event& e : registrar.Drain(0)) {
    if (e.kind != c::EventKind::kThrottled) continue;
    ++spans;
    span_ns += e.duration_ns;
  }
  EXPECT_EQ(spans, 1);  // one hold, however many launches waited in it
  EXPECT_EQ(span_ns, held_ns);
  // Two launches, cuLaunchKernelEx, cuGetProcAddress's and dlsym's, and the graph replay (its
  // capture queues none).
  ASSERT_TRUE(run.values.count("stream_waits")) << run.err;
  EXPECT_GE(std::stoull(run.values.at("stream_waits")), 6u);
  EXPECT_EQ(words.gpu_hold.load(), 0u);  // the keeper opened it
  EXPECT_EQ(words.gate_waiters.load(), 0u);
  EXPECT_EQ(words.be_outstanding_ns.load(), 0u);  // nothing charged to the CPU gate's budget
}

// gpu_hold: launches 10 ms apart behind the word a pretend graph service holds for 300 ms, the
// client paused from 50 ms to 250 ms in: the launches of the pause wait at the gate on the CPU,
// and the time held on the GPU stops while they do. No moment is counted twice: the held and
// paused spans never overlap, and together they are the throttled time.
TEST_F(InterposeIntegrationTest, TimeHeldOnTheGpuAndPausedIsCountedOnce) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  HoldOnTheGpu(registrar);
  registrar.gate().words.gpu_hold.store(7);
  c::ClientSlot& slot = registrar.board().slots[0];  // the probe registers into slot 0
  std::thread hp_done = PretendBusyHighPriority(registrar, /*graphs=*/true);
  std::thread pause([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    slot.paused.store(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Resume(slot);
  });
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "30 paced");
  pause.join();
  hp_done.join();
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_NE(registrar.area(0), nullptr);
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [start, end)
  uint64_t paused_ns = 0, held_ns = 0;
  for (const c::Event& e : registrar.Drain(0)) {
    if (e.kind != c::EventKind::kThrottled) continue;
    ((e.flags & c::kPausedWait) ? paused_ns : held_ns) += e.duration_ns;
    spans.emplace_back(e.cpu_ns - e.duration_ns, e.cpu_ns);
  }
  EXPECT_GE(paused_ns, 100'000'000u) << "the pause was not met";
  EXPECT_GT(held_ns, 0u) << "nothing held on the GPU";
  EXPECT_EQ(registrar.area(0)->counters.throttled_ns.load(), paused_ns + held_ns);
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    EXPECT_LE(spans[i].first, spans[i].second);
    EXPECT_GE(spans[i].first + 1'000'000, spans[i - 1].second)
        << "span " << i << " begins " << (spans[i - 1].second - spans[i].first) / 1000
        << " us before the one before it ends";
  }
}

// gpu_hold past its bound (the board's gpu_hold_max_ns, 100 ms): a pretend graph service busy
// for 800 ms from the start of its busy period, taking the hold anew every 20 ms as its graph
// launches do; a best-effort client launching every 10 ms. Its first launches go behind the
// word; at the bound its keeper opens the hold, counts the release and says it once, and opens
// every hold taken after it; the launches wait at the gate on the CPU until the service is idle,
// and behind the word again from then on (a release with no least time: the board's
// gpu_hold_release_ns 0, as a server that predates it leaves it; one with a least time below).
TEST_F(InterposeIntegrationTest, GpuHoldPastItsBoundOpensAndTheLaunchesWaitOnTheCpu) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  auto& words = registrar.gate().words;
  const uint64_t t0 = NowNs();
  std::thread hp_done = BusyGraphServiceWithABound(registrar, /*release_ms=*/0);
  // The service's holds: a new epoch every 20 ms while it is busy; how soon each was open again.
  std::atomic<uint64_t> first_open_ns{0};
  std::atomic<int> late_holds{0}, late_reopened{0};
  std::thread service([&] {
    for (uint32_t epoch = 8; NowNs() - t0 < 760'000'000; ++epoch) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const bool late = NowNs() - t0 > 200'000'000;  // well past the bound
      if (words.gpu_hold.load() == 0 && first_open_ns.load() == 0) first_open_ns = NowNs() - t0;
      words.gpu_hold.store(epoch);
      orion::interpose::FutexWakeAll(&words.gpu_hold);
      if (!late) continue;
      ++late_holds;
      std::this_thread::sleep_for(std::chrono::milliseconds(15));
      late_reopened += words.gpu_hold.load() == 0;
    }
  });
  const auto start = std::chrono::steady_clock::now();
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "40 paced");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  service.join();
  hp_done.join();
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_GE(first_open_ns.load(), 100'000'000u) << "opened before the bound";
  EXPECT_LE(first_open_ns.load(), 600'000'000u) << "not opened at the bound";
  EXPECT_GE(late_holds.load(), 10);
  EXPECT_GE(late_reopened.load() * 10, late_holds.load() * 7)
      << late_reopened.load() << " of " << late_holds.load() << " holds opened again";
  EXPECT_EQ(registrar.area(0)->counters.hold_releases.load(), 1u);
  EXPECT_NE(run.err.find("stayed busy for over 100 ms"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("on the CPU until they are idle"), std::string::npos) << run.err;
  // Held at the gate on the CPU from the release to the service's end, then behind the word
  // again: about 10 launches before the release and the 30 after the service, one wait each.
  EXPECT_GE(elapsed, std::chrono::milliseconds(750));
  EXPECT_GE(registrar.area(0)->counters.throttled_ns.load(), 400'000'000u);
  ASSERT_TRUE(run.values.count("stream_waits")) << run.err;
  EXPECT_GE(std::stoull(run.values.at("stream_waits")), 30u) << "not held on the GPU again";
  EXPECT_EQ(words.gate_waiters.load(), 0u);
  EXPECT_EQ(words.be_outstanding_ns.load(), 0u);
}

// The same with a release that lasts at least `release_ms` (the board's gpu_hold_release_ns,
// policy.gpu_hold_release_ms: 30 s by default): the pretend service busy for 800 ms, holding
// anew every 20 ms, the bound 100 ms, a client launching 40 times 10 ms apart. RunReleased
// returns the client's run and checks what holds either way: one release, counted, and nothing
// left waiting or charged.
class GpuHoldReleaseTest : public InterposeIntegrationTest {
 protected:
  ProbeRun RunReleased(TestRegistrar& registrar, uint64_t release_ms) {
    auto& words = registrar.gate().words;
    const uint64_t t0 = NowNs();
    std::thread hp_done = BusyGraphServiceWithABound(registrar, release_ms);
    std::thread service([&] {
      for (uint32_t epoch = 8; NowNs() - t0 < 760'000'000; ++epoch) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        words.gpu_hold.store(epoch);
        orion::interpose::FutexWakeAll(&words.gpu_hold);
      }
    });
    const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "40 paced");
    service.join();
    hp_done.join();
    EXPECT_EQ(run.exit_code, 0) << run.err;
    EXPECT_NE(registrar.area(0), nullptr);
    if (registrar.area(0) != nullptr) {
      EXPECT_EQ(registrar.area(0)->counters.hold_releases.load(), 1u);
    }
    EXPECT_EQ(words.gate_waiters.load(), 0u);
    EXPECT_EQ(words.be_outstanding_ns.load(), 0u);
    return run;
  }
};

// A release of 3 s: the launches after the service went idle still wait at the gate on the CPU
// (admitted at once, the service idle), none behind the word: only those before the release
// were held on the GPU.
TEST_F(GpuHoldReleaseTest, StaysOnTheCpuForItsLeastTime) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  const ProbeRun run = RunReleased(registrar, 3000);
  ASSERT_TRUE(run.values.count("stream_waits")) << run.err;
  EXPECT_NE(run.err.find("for 3000 ms at least"), std::string::npos) << run.err;
  // About 10 launches before the release at 100 ms; the 30 after the service (800 ms) would go
  // behind the word again without the least time (the test above).
  EXPECT_LE(std::stoull(run.values.at("stream_waits")), 20u) << "held on the GPU again";
  EXPECT_GE(std::stoull(run.values.at("stream_waits")), 1u) << "never held on the GPU";
}

// A release of 300 ms ends: over by the time the service is idle (800 ms), the launches after
// it go behind the word again, as with none.
TEST_F(GpuHoldReleaseTest, EndsAfterItsLeastTime) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  const ProbeRun run = RunReleased(registrar, 300);
  ASSERT_TRUE(run.values.count("stream_waits")) << run.err;
  EXPECT_GE(std::stoull(run.values.at("stream_waits")), 30u) << "not held on the GPU again";
}

// Without a bound (gpu_hold_max_ns 0, as a server that predates it leaves it), the same client
// stays behind the word while the service is busy: every launch queued there, nothing released,
// and its synchronize returns only once the service is idle.
TEST_F(InterposeIntegrationTest, GpuHoldWithoutABoundStaysShutWhileTheServiceIsBusy) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  HoldOnTheGpu(registrar);
  registrar.gate().words.gpu_hold.store(7);
  std::thread hp_done = PretendBusyHighPriority(registrar, /*graphs=*/true,
                                                std::chrono::milliseconds(800), /*period=*/true);
  const auto start = std::chrono::steady_clock::now();
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "20 paced");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  hp_done.join();
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_EQ(registrar.area(0)->counters.hold_releases.load(), 0u);
  EXPECT_EQ(run.err.find("stayed busy"), std::string::npos) << run.err;
  EXPECT_GE(elapsed, std::chrono::milliseconds(700));
  ASSERT_TRUE(run.values.count("stream_waits")) << run.err;
  EXPECT_GE(std::stoull(run.values.at("stream_waits")), 20u);
}

// gpu_hold beside a graph service, while another stream of the process captures a graph in the
// global mode: the hold's page is not registered then (the driver would refuse and invalidate
// the capture, as the driver double does), so the launch waits at the gate on the CPU and the
// capture ends as it began.
TEST_F(InterposeIntegrationTest, GpuHoldNeverRegistersItsWordDuringACapture) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  HoldOnTheGpu(registrar);
  std::thread hp_done = PretendBusyHighPriority(registrar, /*graphs=*/true);
  const ProbeRun run =
      RunProbe("ORION_SOCKET=" + registrar.socket_path(), "1 capture-beside");
  hp_done.join();
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.values.at("launch"), "0");
  EXPECT_EQ(run.values.at("capture_end"), "0") << "the capture was invalidated";
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_GT(registrar.area(0)->counters.throttled_ns.load(), 0u) << "held on the CPU instead";
}

// A high-priority client's launch takes the hold while a best-effort client shares the GPU, and
// nothing opens it while no best-effort process keeps it; with the knob off it never does.
TEST_F(InterposeIntegrationTest, HighPriorityLaunchesTakeTheGpuHold) {
  for (const uint32_t knob : {0u, 1u}) {
    unlink((dir_ + "/orion.sock").c_str());  // the previous turn's registrar's
    TestRegistrar registrar(dir_, 0, /*honour_priority=*/true);
    c::GpuState& gpu = registrar.board().gpus[0];
    gpu.mode.store(static_cast<uint32_t>(c::GateMode::kPriority));
    gpu.be_clients.store(1);
    gpu.gpu_hold.store(knob);
    // Timed launches' own holds on their stream (interpose/timing_hold.h) off: the waits
    // counted are the gate word's.
    const ProbeRun run = RunProbe(
        "ORION_TIMING_HOLD=0 ORION_PRIORITY=high ORION_SOCKET=" + registrar.socket_path(), "2");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    // The probe's last launch is a graph replay: it takes the hold, and says it launches graphs.
    EXPECT_EQ(registrar.gate().words.gpu_hold.load() != 0, knob == 1) << "knob " << knob;
    EXPECT_EQ(registrar.gate().slots[0].launches_graphs.load(), 1u);
    EXPECT_EQ(run.values.at("stream_waits"), "0");  // high priority never waits on it
  }
}

// A paused client's launches wait until it is resumed, and the wait is reported as paused time
// (kThrottled with kPausedWait), apart from time held at the gate, which a pass-through gate
// never adds.
TEST_F(InterposeIntegrationTest, PausedClientReportsItsWaitAsPausedTime) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  c::ClientSlot& slot = registrar.board().slots[0];  // the probe registers into slot 0
  slot.paused.store(1);
  std::thread resume([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Resume(slot);
  });
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "2");
  resume.join();
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_NE(registrar.area(0), nullptr);
  uint64_t paused_ns = 0, held_ns = 0;
  for (const c::Event& e : registrar.Drain(0)) {
    if (e.kind != c::EventKind::kThrottled) continue;
    ((e.flags & c::kPausedWait) ? paused_ns : held_ns) += e.duration_ns;
  }
  EXPECT_GE(paused_ns, 100'000'000u);  // the 200 ms started before the probe registered
  EXPECT_LT(paused_ns, 2'000'000'000u);
  EXPECT_EQ(held_ns, 0u);  // the gate is in pass-through: nothing else held the launch
  EXPECT_EQ(registrar.area(0)->counters.throttled_ns.load(), paused_ns);
}

// The CPUs a process may use reach the server with its registration: one under `taskset -c 0`,
// whatever the machine has.
TEST_F(InterposeIntegrationTest, RegistrationCarriesTheCpusTheProcessMayUse) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path() + " taskset -c 0", "1");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<c::RegisterRequest> requests = registrar.requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().usable_millicpus, 1000u);
}

TEST_F(InterposeIntegrationTest, ForkedChildLeavesTheParentsRegistrationAlone) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  ASSERT_TRUE(registrar.ok());
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "5 fork");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.values.at("fork_child"), "0");
  ASSERT_GE(registrar.requests().size(), 1u);
  // The parent's slot holds the parent's launches only (8 + 3 graph nodes + 1 after the fork).
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_EQ(registrar.area(0)->counters.launches.load(), 12u);
  // The parent kept its registration through the child's exit: it closed exactly once, and the
  // child (which may register on its own) did not close the parent's connection early.
  for (int i = 0;
       i < 100 && registrar.closed_connections() < static_cast<int>(registrar.requests().size());
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(registrar.closed_connections(), static_cast<int>(registrar.requests().size()));
  EXPECT_EQ(CountKind(registrar.Drain(0), c::EventKind::kLaunch), 9);
}

// The quota's former escapes, each under a 64 MiB limit: past the allocation table's 114,688
// live entries, CUDA arrays of every kind and the device malloc heap are refused or counted.
TEST_F(InterposeIntegrationTest, QuotaHoldsPastTheTableForArraysTheMallocHeapAndGraphs) {
  TestRegistrar registrar(dir_, 64ull << 20, /*honour_priority=*/false);
  ASSERT_TRUE(registrar.ok());
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "0 escapes");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.values.count("done"), 1u) << run.err;
  const std::string oom = "2";  // CUDA_ERROR_OUT_OF_MEMORY
  // 114,688 live allocations (more than the 65,536 the table used to hold) fit the table; the
  // next one is refused, not left uncounted.
  EXPECT_EQ(run.values.at("table_fill"), "114688");
  EXPECT_EQ(run.values.at("table_overflow"), oom);
  EXPECT_EQ(run.values.at("table_used"), std::to_string(114688ull * 256));
  EXPECT_EQ(run.values.at("table_used_after_free"), "0");
  // Arrays: counted at their size; those that would cross the limit never reach the driver.
  EXPECT_EQ(run.values.at("array_big"), oom);
  EXPECT_EQ(run.values.at("array_small"), "0");
  EXPECT_EQ(run.values.at("array_used"), std::to_string(16ull << 20));
  EXPECT_EQ(run.values.at("array3d_big"), oom);
  EXPECT_EQ(run.values.at("array3d_small"), "0");
  EXPECT_EQ(run.values.at("array3d_used"), std::to_string(20ull << 20));
  EXPECT_EQ(run.values.at("mip_big"), oom);
  EXPECT_EQ(run.values.at("mip_small"), "0");
  // 1024x1024 floats and every level down to 1x1: 4 * (4^11 - 1) / 3 bytes.
  const uint64_t mip = 4 * ((1ull << 22) - 1) / 3;
  EXPECT_EQ(run.values.at("mip_used"), std::to_string((20ull << 20) + mip));
  EXPECT_EQ(run.values.at("arrays_used_after_destroy"), "0");
  // The malloc heap counts at the size set, and shrinking it gives the difference back.
  EXPECT_EQ(run.values.at("heap_big"), oom);
  EXPECT_EQ(run.values.at("heap_16"), "0");
  EXPECT_EQ(run.values.at("heap_16_used"), std::to_string(16ull << 20));
  EXPECT_EQ(run.values.at("heap_4"), "0");
  EXPECT_EQ(run.values.at("heap_4_used"), std::to_string(4ull << 20));
  EXPECT_EQ(run.values.at("heap_driver"), std::to_string(4ull << 20));
  // Graph memory-allocation nodes count when added: past the limit refused; freed inside the
  // graph, given back with it; left allocated, given back at cuMemFree.
  EXPECT_EQ(run.values.at("graph_big"), oom);
  EXPECT_EQ(run.values.at("graph_16"), "0");
  EXPECT_EQ(run.values.at("graph_8"), "0");
  EXPECT_EQ(run.values.at("graph_used"), std::to_string((4ull + 16 + 8) << 20));
  // Added through the generic cuGraphAddNode: past the limit refused, else counted; freed by
  // the graph's free node, given back with the graph.
  EXPECT_EQ(run.values.at("graph_generic_big"), oom);
  EXPECT_EQ(run.values.at("graph_generic_2"), "0");
  EXPECT_EQ(run.values.at("graph_used_generic"), std::to_string((4ull + 16 + 8 + 2) << 20));
  EXPECT_EQ(run.values.at("graph_used_after_destroy"), std::to_string((4ull + 16) << 20));
  EXPECT_EQ(run.values.at("graph_used_after_free"), std::to_string(4ull << 20));
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_EQ(registrar.area(0)->counters.memory_used_bytes.load(), 4ull << 20);
}

// A VMM handle's memory is counted until it is released and unmapped, as the driver frees it:
// mapped and released at once (PyTorch's expandable segments), 64 MiB of chunks hold the whole
// quota and a third chunk is refused; before, the quota gave the bytes back at the release and
// 256 MiB were mapped under 64 MiB.
TEST_F(InterposeIntegrationTest, VmmMemoryCountsUntilItsLastMappingGoes) {
  TestRegistrar registrar(dir_, 64ull << 20, /*honour_priority=*/false);
  ASSERT_TRUE(registrar.ok());
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "0 vmm");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.values.count("done"), 1u) << run.err;
  const std::string oom = "2";  // CUDA_ERROR_OUT_OF_MEMORY
  EXPECT_EQ(run.values.at("vmm_create_0"), "0");
  EXPECT_EQ(run.values.at("vmm_create_1"), "0");
  for (int round = 2; round < 8; ++round) {
    EXPECT_EQ(run.values.at("vmm_create_" + std::to_string(round)), oom) << round;
  }
  EXPECT_EQ(run.values.at("vmm_mapped"), "2");
  EXPECT_EQ(run.values.at("vmm_used_mapped"), std::to_string(64ull << 20));
  EXPECT_EQ(run.values.at("vmm_used_one_unmapped"), std::to_string(32ull << 20));
  EXPECT_EQ(run.values.at("vmm_used_retained"), std::to_string(32ull << 20));
  EXPECT_EQ(run.values.at("vmm_used_end"), "0");
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_EQ(registrar.area(0)->counters.memory_used_bytes.load(), 0u);
  EXPECT_EQ(registrar.area(0)->counters.memory_peak_bytes.load(), 64ull << 20);
}

// Memory another process allocated stays alive while this one holds it, so it counts here too:
// an IPC pointer at its allocation's size until it is closed, a shareable VMM handle at what
// it maps until it is released and unmapped (its creator letting go changes nothing).
TEST_F(InterposeIntegrationTest, ImportedMemoryCountsWhileItIsHeld) {
  TestRegistrar registrar(dir_, 64ull << 20, /*honour_priority=*/false);
  ASSERT_TRUE(registrar.ok());
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "0 imports");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.values.count("done"), 1u) << run.err;
  const std::string oom = "2";  // CUDA_ERROR_OUT_OF_MEMORY
  EXPECT_EQ(run.values.at("ipc_open"), "0");
  EXPECT_EQ(run.values.at("ipc_used"), std::to_string(48ull << 20));
  EXPECT_EQ(run.values.at("ipc_open_again"), oom);  // 72 MiB would pass 64
  EXPECT_EQ(run.values.at("ipc_used_closed"), std::to_string(24ull << 20));
  EXPECT_EQ(run.values.at("shared_used_imported"), std::to_string(32ull << 20));
  EXPECT_EQ(run.values.at("shared_map"), "0");
  EXPECT_EQ(run.values.at("shared_used_mapped"), std::to_string(64ull << 20));
  EXPECT_EQ(run.values.at("shared_map_again"), oom);
  // The creator's handle (never mapped) is gone; the import stays counted while mapped.
  EXPECT_EQ(run.values.at("shared_used_released"), std::to_string(32ull << 20));
  EXPECT_EQ(run.values.at("shared_used_end"), "0");
}

// Every way the probe changes the current context (set, push, pop) sends each launch to its own
// device's registration: 100 rounds of 4 launches on device 0 and 2 on device 1.
TEST_F(InterposeIntegrationTest, LaunchesFollowTheCurrentContextAcrossSetPushAndPop) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  ASSERT_TRUE(registrar.ok());
  const ProbeRun run =
      RunProbe("ORION_SIM_DEVICES=2 ORION_SOCKET=" + registrar.socket_path(), "0 contexts");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.values.count("done"), 1u) << run.err;
  const std::vector<c::RegisterRequest> requests = registrar.requests();
  ASSERT_EQ(requests.size(), 2u);
  ASSERT_NE(registrar.area(0), nullptr);
  ASSERT_NE(registrar.area(1), nullptr);
  // Slots in registration order: device 0 registered at its first launch, device 1 after.
  EXPECT_EQ(registrar.area(0)->counters.launches.load(), 400u);
  EXPECT_EQ(registrar.area(1)->counters.launches.load(), 200u);
}

// The launch counter is added to in per-thread batches: a thread that exits before the process
// and the main thread at the process's exit still leave an exact count (5 + 7 + 3 launches,
// fewer than a batch each).
TEST_F(InterposeIntegrationTest, LaunchCountIsExactAfterThreadsAndTheProcessExit) {
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  ASSERT_TRUE(registrar.ok());
  const ProbeRun run = RunProbe("ORION_SOCKET=" + registrar.socket_path(), "0 threads");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_EQ(run.values.count("done"), 1u) << run.err;
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_EQ(registrar.area(0)->counters.launches.load(), 15u);
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

TEST_F(InterposeIntegrationTest, BoardOfAnotherContractVersionIsRefusedClearly) {
  // A server of another release (an upgrade half done): the client must not write into a board
  // whose layout it does not know; it passes through and says why.
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/true);
  registrar.board().header.version = c::kBoardVersion + 1;
  const ProbeRun run = RunProbe("ORION_PRIORITY=high ORION_SOCKET=" + registrar.socket_path());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.values.at("done"), "1");
  EXPECT_NE(run.err.find("does not match this interposer's layout"), std::string::npos) << run.err;
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_EQ(registrar.area(0)->counters.launches.load(), 0u);  // nothing written
}

// Writes ORION_BENCH_SWITCH's word (contract::BenchSwitch) to the file at `path`.
void WriteSwitchWord(const std::string& path, c::BenchSwitch word) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  const uint32_t value = static_cast<uint32_t>(word);
  ASSERT_EQ(fwrite(&value, sizeof(value), 1, f), 1u);
  fclose(f);
}

// Launch events of a run that were timed on the GPU (kTimedLaunch).
int TimedLaunches(const std::vector<c::Event>& events) {
  int timed = 0;
  for (const c::Event& e : events) {
    timed += e.kind == c::EventKind::kLaunch && (e.flags & c::kTimedLaunch) != 0;
  }
  return timed;
}

TEST_F(InterposeIntegrationTest, BenchSwitchPassesCallsThroughWhileSet) {
  // ORION_BENCH_SWITCH (cpu-tax --in-process): its word set, the process's launches go straight
  // to the driver and nothing registers; cleared, they are interposed as usual.
  const std::string path = dir_ + "/switch";
  TestRegistrar registrar(dir_, 0, /*honour_priority=*/false);
  ASSERT_TRUE(registrar.ok());
  const std::string env = "ORION_BENCH_SWITCH=" + path + " ORION_SOCKET=" + registrar.socket_path();
  WriteSwitchWord(path, c::BenchSwitch::kPassThrough);
  const ProbeRun bypassed = RunProbe(env);
  ASSERT_EQ(bypassed.exit_code, 0) << bypassed.err;
  EXPECT_EQ(bypassed.values.at("done"), "1");
  EXPECT_TRUE(registrar.requests().empty());
  WriteSwitchWord(path, c::BenchSwitch::kInterposed);
  const ProbeRun run = RunProbe(env);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_FALSE(registrar.requests().empty());
  ASSERT_NE(registrar.area(0), nullptr);
  EXPECT_GT(registrar.area(0)->counters.launches.load(), 0u);
}

// What the probe pushed and counted, run with ORION_BENCH_SWITCH's word set to `word` and
// registered with a test registrar of its own.
struct SwitchedRun {
  std::string kernel_launches;  // what the driver double ran
  uint64_t context_queries = 0;  // the process's cuCtxGetCurrent calls, as the double counted
  std::vector<c::Event> events;
  uint64_t launches_counted = 0;
};

TEST_F(InterposeIntegrationTest, BenchSwitchNoTimingNoLaunchRecordsAndCutShort) {
  auto run_under = [&](c::BenchSwitch word) {
    SwitchedRun out;
    const std::string path = dir_ + "/switch";
    WriteSwitchWord(path, word);
    const std::string dir = dir_ + "/word" + std::to_string(static_cast<uint32_t>(word));
    EXPECT_EQ(mkdir(dir.c_str(), 0700), 0);
    TestRegistrar registrar(dir, 0, /*honour_priority=*/false);
    EXPECT_TRUE(registrar.ok());
    const ProbeRun run =
        RunProbe("ORION_BENCH_SWITCH=" + path + " ORION_SOCKET=" + registrar.socket_path());
    EXPECT_EQ(run.exit_code, 0) << run.err;
    if (registrar.area(0) == nullptr) {
      ADD_FAILURE() << "the probe did not register";
      return out;
    }
    out.events = registrar.Drain(0);
    out.kernel_launches = run.values.count("kernel_launches") ? run.values.at("kernel_launches")
                                                              : "none";
    out.launches_counted = registrar.area(0)->counters.launches.load();
    if (run.values.count("context_queries") != 0) {
      out.context_queries = std::stoull(run.values.at("context_queries"));
    }
    return out;
  };
  // Word 0: launches recorded and counted, a kernel's first ones timed.
  const SwitchedRun usual = run_under(c::BenchSwitch::kInterposed);
  EXPECT_GT(CountKind(usual.events, c::EventKind::kLaunch), 0);
  EXPECT_GT(usual.launches_counted, 0u);
  EXPECT_GT(TimedLaunches(usual.events), 0);
  // Word 3 (cpu-tax --in-process-baseline no-timing): launches interposed and recorded, and none
  // is timed, not even a kernel's first ones.
  const SwitchedRun untimed = run_under(c::BenchSwitch::kNoTiming);
  EXPECT_GT(CountKind(untimed.events, c::EventKind::kLaunch), 0);
  EXPECT_EQ(TimedLaunches(untimed.events), 0);
  EXPECT_EQ(CountKind(untimed.events, c::EventKind::kKernelTime), 0);
  // Word 4 (no-launch-records): launches interposed, none counted or pushed to the ring; the
  // process's other events (memory) still are.
  const SwitchedRun unrecorded = run_under(c::BenchSwitch::kNoLaunchRecords);
  EXPECT_EQ(CountKind(unrecorded.events, c::EventKind::kLaunch), 0);
  EXPECT_EQ(unrecorded.launches_counted, 0u);
  EXPECT_GT(CountKind(unrecorded.events, c::EventKind::kMemAlloc), 0);
  // Words 6 and 7 (after-registration, before-clock): the process is registered and every one
  // of its launches reaches the driver (as many kernels run as with word 0), and its path ends
  // before any launch is counted, timed or pushed; word 7 still learns the kernels' names
  // (their record is found).
  const SwitchedRun registered = run_under(c::BenchSwitch::kAfterRegistration);
  EXPECT_EQ(CountKind(registered.events, c::EventKind::kLaunch), 0);
  EXPECT_EQ(CountKind(registered.events, c::EventKind::kKernelName), 0);
  EXPECT_EQ(registered.launches_counted, 0u);
  EXPECT_NE(usual.kernel_launches, "none");
  EXPECT_NE(usual.kernel_launches, "0");
  EXPECT_EQ(registered.kernel_launches, usual.kernel_launches);
  EXPECT_GT(CountKind(registered.events, c::EventKind::kMemAlloc), 0);
  const SwitchedRun before_clock = run_under(c::BenchSwitch::kBeforeClock);
  EXPECT_EQ(CountKind(before_clock.events, c::EventKind::kLaunch), 0);
  EXPECT_EQ(TimedLaunches(before_clock.events), 0);
  EXPECT_EQ(before_clock.launches_counted, 0u);
  EXPECT_EQ(before_clock.kernel_launches, usual.kernel_launches);
  EXPECT_GT(CountKind(before_clock.events, c::EventKind::kKernelName), 0);
  // Word 8 (no-clock): launches recorded, every one of the probe's thread with one time stamp;
  // word 0's are not all one.
  auto launch_stamps = [](const SwitchedRun& run) {
    std::set<uint64_t> stamps;
    for (const c::Event& e : run.events) {
      if (e.kind == c::EventKind::kLaunch) stamps.insert(e.cpu_ns);
    }
    return stamps;
  };
  const SwitchedRun unclocked = run_under(c::BenchSwitch::kNoClock);
  EXPECT_GT(CountKind(unclocked.events, c::EventKind::kLaunch), 1);
  EXPECT_EQ(launch_stamps(unclocked).size(), 1u);
  EXPECT_GT(launch_stamps(usual).size(), 1u);
  // Word 10 (no-context-query): the thread's last context stands in for the driver's answer,
  // so the process asks the driver fewer times (every launch asks under word 0); the launches
  // are registered, recorded and counted as word 0's, and all of them run.
  const SwitchedRun kept_context = run_under(c::BenchSwitch::kNoContextQuery);
  EXPECT_GT(usual.context_queries, usual.launches_counted);
  EXPECT_LT(kept_context.context_queries + usual.launches_counted / 2, usual.context_queries);
  EXPECT_EQ(CountKind(kept_context.events, c::EventKind::kLaunch),
            CountKind(usual.events, c::EventKind::kLaunch));
  EXPECT_EQ(kept_context.launches_counted, usual.launches_counted);
  EXPECT_EQ(kept_context.kernel_launches, usual.kernel_launches);
}

// Word 9 (no-hp-notes) on a high-priority probe: nothing reaches its gate entry, where word 0
// stamps the busy period and the progress of every launch.
TEST_F(InterposeIntegrationTest, BenchSwitchNoHighPriorityNotesLeavesTheGateEntry) {
  for (const c::BenchSwitch word : {c::BenchSwitch::kInterposed,
                                    c::BenchSwitch::kNoHighPriorityNotes}) {
    const std::string dir = dir_ + "/notes" + std::to_string(static_cast<uint32_t>(word));
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    const std::string path = dir + "/switch";
    WriteSwitchWord(path, word);
    TestRegistrar registrar(dir, 0, /*honour_priority=*/true);
    ASSERT_TRUE(registrar.ok());
    const ProbeRun run = RunProbe("ORION_PRIORITY=high ORION_BENCH_SWITCH=" + path +
                                  " ORION_SOCKET=" + registrar.socket_path());
    ASSERT_EQ(run.exit_code, 0) << run.err;
    ASSERT_NE(registrar.area(0), nullptr);
    EXPECT_GT(CountKind(registrar.Drain(0), c::EventKind::kLaunch), 0);
    const c::SlotGate& entry = registrar.gate().slots[0];
    if (word == c::BenchSwitch::kInterposed) {
      EXPECT_NE(entry.last_progress_ns.load(), 0u);
      EXPECT_NE(entry.busy_start_ns.load(), 0u);
    } else {
      EXPECT_EQ(entry.last_progress_ns.load(), 0u);
      EXPECT_EQ(entry.busy_start_ns.load(), 0u);
      EXPECT_EQ(entry.hp_kernel_class.load(), 0u);
    }
  }
}

// Where a launch reads its clock (hooks_launch.cc): a high-priority client that nobody is held
// for (no best-effort client on its GPU, or the gate passing through) stamps an untimed launch
// once the driver returned, and a timed one before the call; beside a best-effort client with
// the gate on (priority mode) it stamps every launch before the call, where its notes tell the
// gate it is busy before its kernel is queued.
TEST_F(InterposeIntegrationTest, LaunchClockReadAfterTheDriverCallOnlyWhereNobodyIsHeld) {
  struct Case {
    c::GateMode mode;
    uint32_t be_clients;
  };
  for (const Case k : {Case{c::GateMode::kPassThrough, 0}, Case{c::GateMode::kPriority, 0},
                       Case{c::GateMode::kPassThrough, 1}, Case{c::GateMode::kPriority, 1}}) {
    const bool shared = k.mode == c::GateMode::kPriority && k.be_clients != 0;
    const std::string dir = dir_ + "/mode" + std::to_string(static_cast<uint32_t>(k.mode)) +
                            "-be" + std::to_string(k.be_clients);
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    TestRegistrar registrar(dir, 0, /*honour_priority=*/true);
    ASSERT_TRUE(registrar.ok());
    registrar.board().gpus[0].mode.store(static_cast<uint32_t>(k.mode));
    registrar.board().gpus[0].be_clients.store(k.be_clients);
    const ProbeRun run = RunProbe("ORION_PRIORITY=high ORION_SOCKET=" + registrar.socket_path());
    ASSERT_EQ(run.exit_code, 0) << run.err;
    ASSERT_NE(registrar.area(0), nullptr);
    int launches = 0, untimed = 0;
    for (const c::Event& e : registrar.Drain(0)) {
      if (e.kind != c::EventKind::kLaunch) continue;
      // The probe's launches and the driver's, one by one in order (captured ones are neither).
      const auto entered = run.values.find("launch_entered_" + std::to_string(launches++));
      ASSERT_NE(entered, run.values.end())
          << "launch " << launches - 1 << " never reached the driver";
      const bool timed = (e.flags & c::kTimedLaunch) != 0;
      untimed += timed ? 0 : 1;
      const bool stamped_before = e.cpu_ns < std::stoull(entered->second);
      EXPECT_EQ(stamped_before, shared || timed)
          << "mode " << static_cast<uint32_t>(k.mode) << ", " << k.be_clients
          << " best-effort clients, launch " << launches - 1
          << (timed ? " (timed)" : " (untimed)") << ": stamped " << e.cpu_ns << ", entered "
          << entered->second;
    }
    EXPECT_GT(launches, 2);
    EXPECT_GT(untimed, 0);
    EXPECT_EQ(run.values.count("launch_entered_" + std::to_string(launches)), 0u)
        << "the driver saw launches that no event tells of";
  }
}

TEST_F(InterposeIntegrationTest, QuietAndDisabled) {
  const ProbeRun quiet = RunProbe("ORION_QUIET=1 ORION_SOCKET=" + dir_ + "/nobody-listens.sock");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("orion:"), std::string::npos) << quiet.err;

  TestRegistrar registrar(dir_, 1 << 20, false);
  const ProbeRun disabled = RunProbe("ORION_DISABLE=1 ORION_SOCKET=" + registrar.socket_path());
  ASSERT_EQ(disabled.exit_code, 0) << disabled.err;
  EXPECT_TRUE(registrar.requests().empty());
  EXPECT_EQ(disabled.values.at("alloc32"), "0");  // the 1 MiB quota is not applied
}

}  // namespace
