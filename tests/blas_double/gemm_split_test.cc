// The interposer's GEMM split end to end on test doubles: orion_gemm_split_probe calls each
// hooked cuBLAS and cuBLASLt entry point (cublasGemmEx, cublasGemmStridedBatchedEx with a batch
// of 3, cublasSgemm_v2 transposed and cut by rows, cublasSgemmStridedBatched, cublasLtMatmul
// with GELU over a bias, and in place) 8 times on liborion_blas_double.so and the CUDA driver
// test double, with no orion-server (ORION_SOCKET names nothing), three ways:
//  - under the interposer with a forced bound (ORION_GEMM_SPLIT_NS=20000): the first three calls
//    go whole (until three were timed), the last reaches the double as pieces that cover it,
//    its output is bitwise the first's, and the exit report counts the splits;
//  - under the interposer, the split on or off, with no forced bound and no server (nothing to
//    protect): every call goes whole;
//  - without the interposer: every call goes whole, and its outputs are the split run's;
// and once registered with a test registrar (standing in for orion-server) beside a pretend graph
// service that holds every call's first kernel at the gate: the wait is not GEMM time.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "interpose/gpu_hold.h"
#include "tests/blas_double/probe_run.h"
#include "tests/interpose/test_registrar.h"

namespace {

using orion::testing::Int;
using orion::testing::ProbeRun;
using orion::testing::Report;

const char* const kCases[] = {"cublasGemmEx",          "cublasGemmStridedBatchedEx",
                              "cublasSgemm_v2",        "cublasSgemmStridedBatched",
                              "cublasSgemm_v2_rows",   "cublasLtMatmul",
                              "cublasLtMatmul_in_place"};
constexpr int kLookedAtCases = 7;  // kCases (the atomic-sync case is never looked at)

// The probe, 8 calls a case, with `env` added.
ProbeRun RunProbe(std::vector<std::string> env) {
  return orion::testing::RunProbe({ORION_GEMM_SPLIT_PROBE, "8"}, std::move(env),
                                  "orion-gemm-split");
}

// Every case ran each call whole, pieces and padding in order.
void ExpectAllWhole(const ProbeRun& run) {
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    ASSERT_EQ(run.cases.count(name), 1u) << run.output;
    const auto& c = run.cases.at(name);
    EXPECT_EQ(Int(c, "first_calls"), 1);
    EXPECT_EQ(Int(c, "last_calls"), 1);
    EXPECT_EQ(c.at("axis"), "whole");
    EXPECT_EQ(Int(c, "cover"), 1);
    EXPECT_EQ(Int(c, "equal"), 1);
    EXPECT_EQ(Int(c, "padding"), 1);
  }
}

class GemmSplitOnDoubleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    split_ = new ProbeRun(RunProbe({std::string("LD_PRELOAD=") + ORION_INTERPOSE_LIB,
                                    "ORION_GEMM_SPLIT_NS=20000"}));
    bare_ = new ProbeRun(RunProbe({}));
  }
  static void TearDownTestSuite() {
    delete split_;
    delete bare_;
  }
  static ProbeRun* split_;
  static ProbeRun* bare_;
};
ProbeRun* GemmSplitOnDoubleTest::split_ = nullptr;
ProbeRun* GemmSplitOnDoubleTest::bare_ = nullptr;

TEST_F(GemmSplitOnDoubleTest, ForcedBoundCutsEveryApisLongCallIntoExactPieces) {
  const ProbeRun& run = *split_;
  ASSERT_EQ(run.status, 0) << run.output;
  long long pieces = 0;
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    ASSERT_EQ(run.cases.count(name), 1u) << run.output;
    const auto& c = run.cases.at(name);
    // The first call has no learned duration: whole. The last one ran in pieces.
    EXPECT_EQ(Int(c, "first_calls"), 1);
    EXPECT_GT(Int(c, "last_calls"), 1);
    EXPECT_LE(Int(c, "last_calls"), 16);
    EXPECT_EQ(c.at("axis"), std::string(name) == "cublasSgemm_v2_rows" ? "rows" : "columns");
    EXPECT_EQ(Int(c, "cover"), 1);
    EXPECT_EQ(Int(c, "equal"), 1);
    EXPECT_EQ(Int(c, "all_equal"), 1);
    EXPECT_EQ(Int(c, "padding"), 1);
    // The pieces wrote what the whole call writes without the interposer.
    if (bare_->cases.count(name) == 1) {
      EXPECT_EQ(c.at("hash"), bare_->cases.at(name).at("hash"));
    }
    pieces += Int(c, "last_calls");
  }
  // D synchronized in chunks with another kernel: never cut (a piece would take its slice for the
  // whole D and signal the other kernel's counters of the wrong chunks).
  ASSERT_EQ(run.cases.count("cublasLtMatmul_atomic_sync"), 1u) << run.output;
  const auto& sync = run.cases.at("cublasLtMatmul_atomic_sync");
  EXPECT_EQ(Int(sync, "last_calls"), 1);
  EXPECT_EQ(sync.at("axis"), "whole");
  // 8 calls of each case looked at; all but the first three of each split (until three calls
  // were timed, kGemmWarmupCalls: 5 x 7), in at least the last calls' pieces each.
  const std::vector<long long> report = Report(run.output);
  EXPECT_EQ(report[0], 8 * kLookedAtCases) << run.output;
  EXPECT_EQ(report[1], 5 * kLookedAtCases) << run.output;
  EXPECT_GE(report[2], pieces) << run.output;
}

// A piece that fails (cuBLASLt: the tail, 5 columns wide, which the double refuses though the
// algorithm check passed it), C apart from D and in place (C is D, beta 0.25): the narrower tail
// runs first, so it fails before anything of D is written and the call goes whole, the caller
// gets the whole call's output (before, in place, the error with D part written), and the shape
// is not cut again.
TEST(GemmSplitLaterPieceFailsTest, TheCallGoesWholeAgainAndItsShapeIsNotCutAgain) {
  const ProbeRun run =
      RunProbe({std::string("LD_PRELOAD=") + ORION_INTERPOSE_LIB, "ORION_GEMM_SPLIT_NS=20000",
                "ORION_BLAS_DOUBLE_LT_FAIL_BELOW_N=64"});
  ASSERT_EQ(run.status, 0) << run.output;
  const ProbeRun bare = RunProbe({});
  for (const char* name : {"cublasLtMatmul", "cublasLtMatmul_in_place"}) {
    SCOPED_TRACE(name);
    ASSERT_EQ(run.cases.count(name), 1u) << run.output;
    const auto& lt = run.cases.at(name);
    EXPECT_EQ(Int(lt, "last_calls"), 1);
    EXPECT_EQ(Int(lt, "equal"), 1);
    // Every call's output, the one whose piece failed too, is the whole call's.
    EXPECT_EQ(Int(lt, "all_equal"), 1);
    EXPECT_EQ(Int(lt, "padding"), 1);
    ASSERT_EQ(bare.cases.count(name), 1u) << bare.output;
    EXPECT_EQ(lt.at("hash"), bare.cases.at(name).at("hash"));
  }
  // The other cases are cut as ever; the failed calls are not counted as split.
  EXPECT_EQ(Report(run.output)[1], 5 * 5) << run.output;
}

TEST_F(GemmSplitOnDoubleTest, WithoutTheInterposerEveryCallGoesWhole) {
  ExpectAllWhole(*bare_);
  EXPECT_EQ(Report(bare_->output)[0], -1) << "no interposer, no report";
}

// On (the default, or ORION_GEMM_SPLIT=1) or off (ORION_GEMM_SPLIT=0), with no server there is no
// high-priority client to protect: the bound is 0 and no call is even looked at.
TEST(GemmSplitOffOnDoubleTest, NothingToProtectEveryCallGoesWhole) {
  for (const char* asked : {"ORION_GEMM_SPLIT=1", "ORION_GEMM_SPLIT=0"}) {
    const ProbeRun run = RunProbe({std::string("LD_PRELOAD=") + ORION_INTERPOSE_LIB, asked});
    SCOPED_TRACE(asked);
    ExpectAllWhole(run);
    const std::vector<long long> report = Report(run.output);
    EXPECT_EQ(report[0], 0) << run.output;
    EXPECT_EQ(report[1], 0) << run.output;
  }
}

// Stands in for a high-priority graph service on GPU 0 of `registrar`'s board: it keeps a graph
// in flight until a best-effort process waits at the gate (on the CPU, or its hold keeper), and
// 2 ms later completes it; once nothing waits any more (or the hold's word for admitted launches
// was opened), it launches the next. With `take_hold` (gpu_hold on) each launch also takes the
// GPU hold's words (HoldGpu), and the service counts the graphs after which each word was opened
// inside its grace (between graphs).
class PretendGraphService {
 public:
  static constexpr int kSlot = 200;

  PretendGraphService(orion::interpose::testing::TestRegistrar& registrar, bool take_hold)
      : gpu_(registrar.board().gpus[0]),
        slot_(registrar.gate().slots[kSlot]),
        gate_(registrar.gate()),
        words_(registrar.gate().words),
        take_hold_(take_hold) {
    namespace c = orion::contract;
    gpu_.mode.store(static_cast<uint32_t>(c::GateMode::kPriority));
    gpu_.hp_stale_ns.store(60'000'000'000ull);
    gpu_.gpu_hold.store(take_hold ? 1 : 0);
    gpu_.hp_slot_mask[kSlot / 64].fetch_or(1ull << (kSlot % 64));
    slot_.launches_graphs.store(1);
    Launch();
    thread_ = std::thread([this] { Serve(); });
  }
  ~PretendGraphService() { Stop(); }

  void Stop() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  int releases() const { return releases_.load(); }
  int opened_between_graphs() const { return opened_between_graphs_.load(); }
  int held_word_opened_between_graphs() const { return held_opened_between_graphs_.load(); }
  // Graphs after which only the admitted word opened, since gpu_hold last opened between graphs.
  int admitted_alone_since_held() const { return admitted_alone_since_held_.load(); }

 private:
  // As a graph launch does: in flight in its notes, then the hold taken (a new epoch).
  void Launch() {
    slot_.last_progress_ns.store(orion::interpose::testing::NowNs());
    slot_.inflight.store(1);
    if (take_hold_ && orion::interpose::HoldGpu(gate_)) {
      Wake(&words_.gpu_hold);  // the keepers asleep on an open word
    }
  }
  static void Wake(std::atomic<uint32_t>* word) {
    syscall(SYS_futex, word, 1 /*FUTEX_WAKE*/, 0x7fffffff, nullptr, nullptr, 0);
  }
  void Serve() {
    using std::chrono::microseconds;
    using orion::interpose::testing::NowNs;
    while (!done_.load()) {
      if (words_.gate_waiters.load() == 0) {
        std::this_thread::sleep_for(microseconds(20));
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const uint64_t completed = NowNs();
      slot_.last_progress_ns.store(completed);
      slot_.inflight.store(0);
      words_.gate_seq.fetch_add(1);
      Wake(&words_.gate_seq);
      releases_.fetch_add(1);
      // A keeper that follows gpu_hold through the grace stays among the waiters.
      while (!done_.load() && words_.gate_waiters.load() != 0 &&
             !(take_hold_ && words_.gpu_hold_admitted.load() == 0)) {
        std::this_thread::sleep_for(microseconds(5));
      }
      if (take_hold_ && NowNs() - completed < gpu_.hp_grace_ns.load()) {
        const bool admitted_open = words_.gpu_hold_admitted.load() == 0;
        if (admitted_open) opened_between_graphs_.fetch_add(1);
        if (words_.gpu_hold.load() == 0) {
          held_opened_between_graphs_.fetch_add(1);
          admitted_alone_since_held_.store(0);
        } else if (admitted_open) {
          admitted_alone_since_held_.fetch_add(1);
        }
      }
      Launch();
    }
  }

  orion::contract::GpuState& gpu_;
  orion::contract::SlotGate& slot_;
  orion::contract::GateArea& gate_;
  decltype(orion::contract::GateArea::words)& words_;
  const bool take_hold_;
  std::atomic<bool> done_{false};
  std::atomic<int> releases_{0};
  std::atomic<int> opened_between_graphs_{0};
  std::atomic<int> held_opened_between_graphs_{0};
  std::atomic<int> admitted_alone_since_held_{0};
  std::thread thread_;
};

// The probe registered with a test registrar (standing in for orion-server) beside a pretend
// graph service, 8 calls a case at a forced 20 us bound, the calls 42 to 54 us on the double
// (ORION_SIM_SCALE).
class GemmSplitRegisteredTest : public ::testing::Test {
 protected:
  void Run(bool take_hold, uint64_t grace_ns, std::vector<std::string> env) {
    const std::string dir = orion::testing::MakeTestDir("orion-gemm-gate");
    ASSERT_FALSE(dir.empty());
    registrar_ = std::make_unique<orion::interpose::testing::TestRegistrar>(
        dir, 0, /*honour_priority=*/false);
    registrar_->board().gpus[0].hp_grace_ns.store(grace_ns);
    PretendGraphService service(*registrar_, take_hold);
    env.insert(env.end(), {std::string("LD_PRELOAD=") + ORION_INTERPOSE_LIB,
                           "ORION_GEMM_SPLIT_NS=20000", "ORION_SIM_SCALE=0.1",
                           "ORION_SOCKET=" + registrar_->socket_path()});
    run_ = RunProbe(std::move(env));
    service.Stop();
    releases_ = service.releases();
    opened_between_graphs_ = service.opened_between_graphs();
    held_word_opened_between_graphs_ = service.held_word_opened_between_graphs();
    admitted_alone_since_held_ = service.admitted_alone_since_held();
    ASSERT_EQ(run_.status, 0) << run_.output;
    ASSERT_NE(registrar_->area(0), nullptr) << "the probe registered";
    for (const char* name : kCases) {
      SCOPED_TRACE(name);
      ASSERT_EQ(run_.cases.count(name), 1u) << run_.output;
      EXPECT_GE(Int(run_.cases.at(name), "last_calls"), 2);
    }
  }
  uint64_t ThrottledNs() const { return registrar_->area(0)->counters.throttled_ns.load(); }

  std::unique_ptr<orion::interpose::testing::TestRegistrar> registrar_;
  ProbeRun run_;
  int releases_ = 0;
  int opened_between_graphs_ = 0;
  int held_word_opened_between_graphs_ = 0;
  int admitted_alone_since_held_ = 0;
};

// Beside a service that holds every call's first kernel at the gate on the CPU (gpu_hold off)
// for 2 ms: every call's first kernel waits 2 ms. Timed from their first kernel, the calls are
// cut into the 3 pieces their kernel asks for; timed from before the gate's wait (2 ms a
// sample), into as many as their output allows (9).
TEST_F(GemmSplitRegisteredTest, TheGatesWaitIsNotGemmTime) {
  ASSERT_NO_FATAL_FAILURE(Run(/*take_hold=*/false, /*grace_ns=*/0, {}));
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const auto& c = run_.cases.at(name);
    EXPECT_LE(Int(c, "last_calls"), 6) << "cut for the gate's wait, not for its kernel";
    EXPECT_EQ(Int(c, "equal"), 1);
  }
  // All but the first three calls of each case cut; the calls did wait: the three timed calls of
  // each case at least (a late release only shortens a wait).
  const std::vector<long long> report = Report(run_.output);
  EXPECT_EQ(report[0], 8 * kLookedAtCases) << run_.output;
  EXPECT_EQ(report[1], 5 * kLookedAtCases) << run_.output;
  EXPECT_GE(releases_, 3 * kLookedAtCases);
  EXPECT_GE(ThrottledNs(), 3ull * kLookedAtCases * 2'000'000);
}

// With gpu_hold on, the service taking the hold's words at each graph, and a grace of 500 ms
// after each: once the process cut a GEMM, its launches wait at the gate on the CPU and then go
// behind the word for admitted launches too (every launch of the run queued a wait), and its
// keeper opens that word between graphs, as its gate admits, not at the end of the grace. The
// word of launches held on the GPU alone (gpu_hold) opens between graphs only while the waits
// the process queued on it before its first cut drain (100 ms here), then stays held through
// the grace: a process that cuts GEMMs lets no other trainer in between graphs. The pieces stay
// exact.
TEST_F(GemmSplitRegisteredTest, PiecesWaitOnTheCpuAndBehindTheHold) {
  // The timing hold's own stream waits off: the waits counted are the gate word's.
  ASSERT_NO_FATAL_FAILURE(Run(/*take_hold=*/true, /*grace_ns=*/500'000'000,
                              {"ORION_TIMING_HOLD=0", "ORION_GPU_HOLD_DRAIN_MS=100"}));
  for (const char* name : kCases) {
    EXPECT_EQ(Int(run_.cases.at(name), "all_equal"), 1) << name;
  }
  EXPECT_GE(Report(run_.output)[1], 5 * kLookedAtCases) << run_.output;
  ASSERT_EQ(run_.device.count("stream_waits"), 1u) << run_.output;
  const long long launches = std::stoll(run_.device.at("kernel_launches"));
  EXPECT_GT(launches, 8 * kLookedAtCases);
  EXPECT_EQ(std::stoll(run_.device.at("stream_waits")), launches)
      << "every launch behind the word";
  EXPECT_GT(ThrottledNs(), 0u) << "held on the CPU";
  EXPECT_GE(opened_between_graphs_, 3 * kLookedAtCases);
  EXPECT_GT(held_word_opened_between_graphs_, 0) << "gpu_hold opened between graphs in the drain";
  EXPECT_GE(admitted_alone_since_held_, 2 * kLookedAtCases)
      << "gpu_hold still opened between graphs after the drain ("
      << held_word_opened_between_graphs_ << " times in all, " << opened_between_graphs_
      << " graphs)";
}

}  // namespace
