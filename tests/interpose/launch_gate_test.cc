// Unit tests of the launch gate's decisions over a board and a gate area in plain memory, and of the kernel
// registry (name-once, sampling, duration estimate).
#include "interpose/launch_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "interpose/gpu_hold.h"
#include "interpose/kernel_registry.h"

namespace orion::interpose {
namespace {

using contract::Board;
using contract::GateMode;
using contract::KernelClass;
using contract::KernelClassToBoard;

BestEffortLaunch Be(uint64_t blocks, uint64_t estimate_ns, KernelClass c = KernelClass::kUnknown) {
  return BestEffortLaunch{blocks, estimate_ns, KernelClassToBoard(c)};
}

class LaunchGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    board_.reset(new Board());
    memset(static_cast<void*>(board_.get()), 0, sizeof(Board));
    gate_.reset(new contract::GateArea());
    memset(static_cast<void*>(gate_.get()), 0, sizeof(contract::GateArea));
    now_ = MonotonicNs();
    board_->header.server_heartbeat_ns.store(now_);
    gpu().mode.store(static_cast<uint32_t>(GateMode::kPriority));
    gpu().be_budget_ns.store(100'000);
    gpu().sm_threshold.store(64);
    gpu().hp_stale_ns.store(50'000'000);
  }
  contract::GpuState& gpu() { return board_->gpus[0]; }
  void MarkHighPriority(uint32_t slot, uint32_t inflight, uint64_t progress_ns) {
    gpu().hp_slot_mask[slot / 64].fetch_or(1ull << (slot % 64));
    gate_->slots[slot].inflight.store(inflight);
    gate_->slots[slot].last_progress_ns.store(progress_ns);
  }

  std::unique_ptr<Board> board_;
  std::unique_ptr<contract::GateArea> gate_;
  uint64_t now_ = 0;
};

TEST_F(LaunchGateTest, GoesUnchargedWithoutHighPriorityClients) {
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 10'000)), GateDecision::kGoIdle);
  EXPECT_EQ(gate_->words.be_outstanding_ns.load(), 0u);
}

TEST_F(LaunchGateTest, IdleHighPriorityClientBoundsQueuedBestEffortWork) {
  // The same in both modes: what a request arriving now would find queued (time-slicing) or
  // sharing the SMs with it (MPS) stays within the 100 us budget.
  for (GateMode mode : {GateMode::kPriority, GateMode::kMps}) {
    SCOPED_TRACE(static_cast<int>(mode));
    gpu().mode.store(static_cast<uint32_t>(mode));
    gate_->words.be_outstanding_ns.store(0);
    MarkHighPriority(130, 0, now_ - 10'000'000);  // HP client present, long idle
    // A kernel longer than the budget still goes when nothing is queued...
    EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 300'000)),
              GateDecision::kGoBudget);
    EXPECT_EQ(gate_->words.be_outstanding_ns.load(), 300'000u);
    // ...but nothing more queues behind it until it completes.
    EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 10'000)), GateDecision::kWait);
    ReleaseBudget(*gate_, 300'000);
    EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 40'000)),
              GateDecision::kGoBudget);
    EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 60'000)),
              GateDecision::kGoBudget);
    EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 1'000)), GateDecision::kWait);
  }
}

// With HP idle, best-effort work goes while its charges fit the budget, and is otherwise held
// until a completion gives charges back (no wake-up time: only a completion changes the answer);
// a high-priority launch counts the charges in flight as queued ahead of it, and is followed
// when that makes it outlast half the grace.
TEST_F(LaunchGateTest, HeldBestEffortWaitsForCompletionsAndQueuesAheadOfHighPriority) {
  MarkHighPriority(130, 0, now_ - 10'000'000);  // HP client present, long idle
  uint64_t wake_by = 1;
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 60'000)), GateDecision::kGoBudget);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 60'000), &wake_by),
            GateDecision::kWait);
  EXPECT_EQ(wake_by, 0u);
  ReleaseBudget(*gate_, 60'000);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 60'000)), GateDecision::kGoBudget);
  ReleaseBudget(*gate_, 60'000);

  gpu().be_clients.store(1);
  gpu().hp_grace_ns.store(500'000);
  gate_->words.be_outstanding_ns.store(400'000);
  std::atomic<uint64_t> hp_queue_end{0};
  EXPECT_TRUE(FollowHighPriorityLaunch(gpu(), *gate_, hp_queue_end, now_, 10'000, false));
  EXPECT_EQ(hp_queue_end.load(), now_ + 410'000);
  gate_->words.be_outstanding_ns.store(0);
  hp_queue_end.store(0);
  EXPECT_FALSE(FollowHighPriorityLaunch(gpu(), *gate_, hp_queue_end, now_, 10'000, false));
}

TEST_F(LaunchGateTest, BusyHighPriorityAdmitsOnlyWorkWithinTheBudget) {
  MarkHighPriority(130, 2, now_);
  // Time-sliced GPU: size in blocks does not matter, queued duration does.
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 60'000)), GateDecision::kGoBudget);
  EXPECT_EQ(gate_->words.be_outstanding_ns.load(), 60'000u);
  // The next one would exceed the 100 us budget; a kernel longer than the budget never runs
  // beside busy HP work, even alone.
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(64, 60'000)), GateDecision::kWait);
  ReleaseBudget(*gate_, 60'000);
  EXPECT_EQ(gate_->words.be_outstanding_ns.load(), 0u);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1, 300'000)), GateDecision::kWait);
  ReleaseBudget(*gate_, 5);  // never below zero
  EXPECT_EQ(gate_->words.be_outstanding_ns.load(), 0u);
}

// Beside busy high-priority clients that all launch CUDA graphs (a request queued whole), the
// gate on the CPU admits nothing while a graph is in flight; between graphs (grace only) the
// queued budget applies as when idle. An eager client busy beside them brings the per-period
// budget back. MPS mode is not concerned (it co-runs, by class).
TEST_F(LaunchGateTest, BusyGraphServiceAdmitsNothingMidRequest) {
  gpu().hp_grace_ns.store(500'000);
  MarkHighPriority(130, 1, now_);
  gate_->slots[130].launches_graphs.store(1);
  uint64_t wake_by = 1;
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(64, 10'000), &wake_by),
            GateDecision::kWait);
  EXPECT_EQ(wake_by, 0u);  // only its completion changes the answer
  MarkHighPriority(130, 0, now_ - 100'000);  // graph done 100 us ago: in grace
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(64, 60'000)), GateDecision::kGoBudget);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(64, 60'000)), GateDecision::kWait);
  ReleaseBudget(*gate_, 60'000);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(64, 300'000)),
            GateDecision::kGoBudget);  // nothing queued: one longer kernel alone, as when idle
  ReleaseBudget(*gate_, 300'000);
  MarkHighPriority(131, 1, now_);  // an eager client, busy too
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(64, 10'000)), GateDecision::kGoBudget);
  ReleaseBudget(*gate_, 10'000);
  gate_->slots[131].launches_graphs.store(1);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(64, 10'000)), GateDecision::kWait);
  gpu().mode.store(static_cast<uint32_t>(GateMode::kMps));
  gate_->slots[130].hp_kernel_class.store(KernelClassToBoard(KernelClass::kCompute));
  gate_->slots[131].hp_kernel_class.store(KernelClassToBoard(KernelClass::kCompute));
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(32, 10'000, KernelClass::kMemory)),
            GateDecision::kGoBudget);
}

TEST_F(LaunchGateTest, IgnoresStaleHighPriorityOwnSlotPassThroughAndDeadServer) {
  MarkHighPriority(3, 1, now_);  // our own slot never blocks us
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 1)), GateDecision::kGoIdle);
  MarkHighPriority(7, 1, now_ - 60'000'000);  // no progress for 60 ms > 50 ms: counts as idle
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 1)), GateDecision::kGoBudget);
  ReleaseBudget(*gate_, 1);
  MarkHighPriority(9, 1, now_);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 300'000)), GateDecision::kWait);
  gpu().mode.store(static_cast<uint32_t>(GateMode::kPassThrough));
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 1)), GateDecision::kGoIdle);
  gpu().mode.store(static_cast<uint32_t>(GateMode::kPriority));
  board_->header.server_heartbeat_ns.store(now_ - 3'000'000'000ull);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 1)), GateDecision::kGoIdle);
}

// A timed launch is contended where the other side's work is in flight on a time-sliced GPU:
// admitted best-effort work for a high-priority launch, busy high-priority work (ourselves
// excluded) for a best-effort one; never in MPS mode, where co-running slows a kernel for real.
TEST_F(LaunchGateTest, TimedLaunchesSeeTheOtherSidesWorkInFlight) {
  EXPECT_FALSE(OtherWorkInFlight(*gate_, gpu(), 130, /*high=*/true, now_));
  EXPECT_FALSE(OtherWorkInFlight(*gate_, gpu(), 3, /*high=*/false, now_));
  gate_->words.be_outstanding_ns.store(40'000);
  EXPECT_TRUE(OtherWorkInFlight(*gate_, gpu(), 130, true, now_));
  MarkHighPriority(130, 1, now_);
  EXPECT_TRUE(OtherWorkInFlight(*gate_, gpu(), 3, false, now_));
  EXPECT_FALSE(OtherWorkInFlight(*gate_, gpu(), 130, false, now_));  // only itself busy
  gpu().mode.store(static_cast<uint32_t>(GateMode::kMps));
  EXPECT_FALSE(OtherWorkInFlight(*gate_, gpu(), 130, true, now_));
  EXPECT_FALSE(OtherWorkInFlight(*gate_, gpu(), 3, false, now_));
}

// An eager service's short kernels, launched 20 us apart from a CPU-bound thread, are covered by
// the grace after their launch and not followed; a GPU-bound burst, a graph, a kernel never
// measured, or (time-sliced) best-effort work queued ahead is followed; nothing is followed
// without a best-effort client or in pass-through mode.
TEST_F(LaunchGateTest, HighPriorityLaunchesAreFollowedOnlyWhereTheyMayOutlastTheGrace) {
  gpu().hp_grace_ns.store(500'000);
  gpu().mode.store(static_cast<uint32_t>(GateMode::kMps));
  std::atomic<uint64_t> queue_end{0};
  auto follow = [&](uint64_t t, uint64_t estimate, bool graph = false) {
    return FollowHighPriorityLaunch(gpu(), *gate_, queue_end, t, estimate, graph);
  };
  EXPECT_FALSE(follow(now_, 0));  // no best-effort client: nobody reads a completion
  gpu().be_clients.store(1);
  uint64_t t = now_;
  int followed = 0;
  for (int i = 0; i < 200; ++i, t += 20'000) followed += follow(t, 8'000);
  EXPECT_EQ(followed, 0) << "an eager service's kernels need no event";
  EXPECT_TRUE(follow(t, 0)) << "a kernel never measured may be long";
  queue_end.store(0);
  EXPECT_TRUE(follow(t += 20'000, 10'000, /*graph=*/true));
  EXPECT_TRUE(follow(t, 300'000)) << "a kernel of more than half a grace";
  // Launched back to back faster than the GPU runs them: the modeled queue grows past half a
  // grace and the later launches are followed.
  queue_end.store(0);
  t += 10'000'000;
  followed = 0;
  for (int i = 0; i < 40; ++i, t += 2'000) followed += follow(t, 20'000);
  EXPECT_GT(followed, 20);
  EXPECT_TRUE(follow(t, 20'000));  // the queue is still there
  // Time-sliced: a short kernel behind best-effort work in flight may wait past the grace.
  queue_end.store(0);
  t += 10'000'000;
  gpu().mode.store(static_cast<uint32_t>(GateMode::kPriority));
  EXPECT_FALSE(follow(t, 8'000));
  gate_->words.be_outstanding_ns.store(400'000);
  EXPECT_TRUE(follow(t += 20'000, 8'000));
  gpu().mode.store(static_cast<uint32_t>(GateMode::kPassThrough));
  EXPECT_FALSE(follow(t += 10'000'000, 0, true));
}

TEST_F(LaunchGateTest, WaitAtGateBlocksUntilHighPriorityCompletes) {
  MarkHighPriority(9, 1, now_);
  board_->slots[3].gpu.store(0);
  board_->slots[3].priority.store(static_cast<uint32_t>(contract::Priority::kBestEffort));
  gpu().spin_ns.store(10'000);
  std::thread completer([&] {
    // 20 ms from when the launch is held (counted as a waiter after its wait started), however
    // late this thread or the waiter gets a CPU on a loaded machine.
    while (gate_->words.gate_waiters.load() == 0) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate_->slots[9].inflight.store(0);
    OpenGate(*gate_);
  });
  const GateTicket ticket = WaitAtGate(*board_, *gate_, 3, Be(1000, 300'000));
  completer.join();
  EXPECT_GE(ticket.waited_ns, 20'000'000u);
  EXPECT_LT(ticket.waited_ns, 1'000'000'000u);
  EXPECT_EQ(ticket.budget_ns, 300'000u);  // HP still present: the launch is charged
  EXPECT_EQ(gate_->words.gate_waiters.load(), 0u);
}

TEST_F(LaunchGateTest, HighPriorityPassesUnlessPaused) {
  MarkHighPriority(9, 1, now_);
  board_->slots[3].priority.store(static_cast<uint32_t>(contract::Priority::kHigh));
  EXPECT_EQ(WaitAtGate(*board_, *gate_, 3, Be(1000, 10'000)).waited_ns, 0u);
  board_->slots[3].paused.store(1);
  std::atomic<bool> entering{false};
  std::thread resumer([&] {
    while (!entering.load()) std::this_thread::yield();  // 10 ms from the call, not the spawn
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    board_->slots[3].paused.store(0);
    board_->slots[3].wake_seq.fetch_add(1);
  });
  entering.store(true);
  const GateTicket ticket = WaitAtGate(*board_, *gate_, 3, Be(1000, 10'000));
  resumer.join();
  EXPECT_GE(ticket.waited_ns, 5'000'000u);
}

TEST_F(LaunchGateTest, GracePeriodKeepsIdleHighPriorityBusyBetweenKernels) {
  gpu().hp_grace_ns.store(500'000);
  MarkHighPriority(130, 0, now_ - 100'000);  // completed its last kernel 100 us ago
  uint64_t wake_by = 0;
  // Inside the grace period a kernel longer than the budget waits, and the waiter learns when
  // to look again.
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 300'000), &wake_by),
            GateDecision::kWait);
  EXPECT_EQ(wake_by, now_ + 400'000);
  // A kernel within the budget may still go, as beside in-flight work.
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(64, 10'000)), GateDecision::kGoBudget);
  ReleaseBudget(*gate_, 10'000);
  // Once the grace has run out the client is idle: the budget rule for idle HP applies.
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_ + 400'001, Be(1000, 300'000), &wake_by),
            GateDecision::kGoBudget);
  ReleaseBudget(*gate_, 300'000);
  // With work in flight a waiter has no deadline: only a completion changes the answer.
  MarkHighPriority(131, 1, now_);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 300'000), &wake_by),
            GateDecision::kWait);
  EXPECT_EQ(wake_by, 0u);
}

// A launch stamped with a clock read before the poller stamped a completion (the launch path
// reads the clock once): the busy period goes on and progress does not move back. A stamp far
// ahead (a scribbled gate area) does not hold the period open.
TEST_F(LaunchGateTest, HighPriorityLaunchBehindACompletionStampContinuesTheBusyPeriod) {
  gpu().hp_grace_ns.store(500'000);
  contract::SlotGate& hp = gate_->slots[9];
  BusyPeriod ended;
  EXPECT_FALSE(NoteHighPriorityLaunch(hp, gpu(), now_, &ended, /*followed=*/true));
  const uint32_t periods = hp.busy_seq.load();
  EXPECT_TRUE(NoteHighPriorityCompletion(hp, now_ + 3'000));
  EXPECT_FALSE(NoteHighPriorityLaunch(hp, gpu(), now_ + 1'000, &ended, /*followed=*/false));
  EXPECT_EQ(hp.busy_seq.load(), periods);  // the same busy period
  EXPECT_EQ(hp.busy_start_ns.load(), now_);
  EXPECT_EQ(hp.last_progress_ns.load(), now_ + 3'000);  // not moved back to now_ + 1000
  hp.last_progress_ns.store(now_ + 10'000'000'000ull);  // 10 s ahead
  EXPECT_TRUE(NoteHighPriorityLaunch(hp, gpu(), now_ + 2'000, &ended, /*followed=*/false));
  EXPECT_EQ(hp.busy_seq.load(), periods + 1);
  EXPECT_EQ(hp.busy_start_ns.load(), now_ + 2'000);
  EXPECT_EQ(hp.last_progress_ns.load(), now_ + 2'000);
}

// The gate hands the launch the clock reading it decided on, so the launch path reads no other.
TEST_F(LaunchGateTest, TicketCarriesTheClockTheGateDecidedOn) {
  board_->slots[3].gpu.store(0);
  board_->slots[3].priority.store(static_cast<uint32_t>(contract::Priority::kBestEffort));
  const uint64_t before = MonotonicNs();
  const GateTicket idle = WaitAtGate(*board_, *gate_, 3, Be(1000, 10'000));
  EXPECT_GE(idle.go_ns, before);
  EXPECT_LE(idle.go_ns, MonotonicNs());
  EXPECT_EQ(idle.budget_ns, 0u);
  MarkHighPriority(9, 0, 0);  // present, idle: the launch goes charged
  board_->header.server_heartbeat_ns.store(MonotonicNs());
  const GateTicket charged = WaitAtGate(*board_, *gate_, 3, Be(1000, 10'000));
  EXPECT_GE(charged.go_ns, idle.go_ns);
  EXPECT_EQ(charged.budget_ns, 10'000u);
}

TEST_F(LaunchGateTest, MpsModeCoRunsComplementaryKernelsBesideBusyHighPriority) {
  gpu().mode.store(static_cast<uint32_t>(GateMode::kMps));
  MarkHighPriority(130, 1, now_);
  gate_->slots[130].hp_kernel_class.store(KernelClassToBoard(KernelClass::kCompute));
  // Busy with a compute-bound kernel: another compute-bound one waits, a memory-bound one that
  // fits the SM threshold and the budget co-runs, a large one waits.
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(32, 10'000, KernelClass::kCompute)),
            GateDecision::kWait);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(32, 10'000, KernelClass::kMemory)),
            GateDecision::kGoBudget);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 10'000, KernelClass::kMemory)),
            GateDecision::kWait);
  // Unknown class on either side is not held back for its class.
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(32, 10'000)), GateDecision::kGoBudget);
  EXPECT_EQ(gate_->words.be_outstanding_ns.load(), 20'000u);
  // sm_threshold 0: no block limit (MPS caps the best-effort SMs); class and budget still count.
  gpu().sm_threshold.store(0);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(100000, 10'000, KernelClass::kMemory)),
            GateDecision::kGoBudget);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(100000, 10'000, KernelClass::kCompute)),
            GateDecision::kWait);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(100000, 90'000, KernelClass::kMemory)),
            GateDecision::kWait);  // 30 us in flight + 90 us > the 100 us budget
  // A high-priority CUDA graph in flight: nothing co-runs, whatever its class; idle again: goes
  // within the budget.
  gate_->words.be_outstanding_ns.store(0);
  gate_->slots[130].hp_kernel_class.store(KernelClassToBoard(KernelClass::kMixed));
  for (KernelClass c : {KernelClass::kUnknown, KernelClass::kMemory, KernelClass::kCompute}) {
    EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(8, 1'000, c)), GateDecision::kWait);
  }
  MarkHighPriority(130, 0, now_ - 10'000'000);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(8, 1'000, KernelClass::kCompute)),
            GateDecision::kGoBudget);
}

TEST_F(LaunchGateTest, MpsModeSeesAGraphBehindALaterKernelAndClassesOfSeveralClients) {
  gpu().mode.store(static_cast<uint32_t>(GateMode::kMps));
  gpu().sm_threshold.store(0);
  const uint32_t mixed = KernelClassToBoard(KernelClass::kMixed);
  const uint32_t memory = KernelClassToBoard(KernelClass::kMemory);
  const uint32_t compute = KernelClassToBoard(KernelClass::kCompute);
  // A graph in flight, then a memory-bound kernel behind it: the slot still shows the graph.
  contract::SlotGate& hp = gate_->slots[130];
  NoteHighPriorityClass(hp, mixed);
  MarkHighPriority(130, 1, now_);
  NoteHighPriorityClass(hp, memory);
  EXPECT_EQ(hp.hp_kernel_class.load(), mixed);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(8, 1'000, KernelClass::kCompute)),
            GateDecision::kWait);
  // Drained: the next launch's class shows again.
  hp.inflight.store(0);
  NoteHighPriorityClass(hp, memory);
  EXPECT_EQ(hp.hp_kernel_class.load(), memory);
  MarkHighPriority(130, 1, now_);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(8, 1'000, KernelClass::kCompute)),
            GateDecision::kGoBudget);
  // A second HP client running a compute-bound kernel: no class complements both.
  gate_->slots[131].hp_kernel_class.store(compute);
  MarkHighPriority(131, 1, now_);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(8, 1'000, KernelClass::kCompute)),
            GateDecision::kWait);
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(8, 1'000, KernelClass::kMemory)),
            GateDecision::kWait);
}

TEST_F(LaunchGateTest, WaiterWakesWhenGracePeriodEndsWithoutACompletion) {
  gpu().hp_grace_ns.store(30'000'000);
  gpu().spin_ns.store(10'000);
  MarkHighPriority(9, 0, MonotonicNs());
  board_->slots[3].gpu.store(0);
  board_->slots[3].priority.store(static_cast<uint32_t>(contract::Priority::kBestEffort));
  const GateTicket ticket = WaitAtGate(*board_, *gate_, 3, Be(1000, 300'000));
  EXPECT_GE(ticket.waited_ns, 25'000'000u);
  EXPECT_LT(ticket.waited_ns, 1'000'000'000u);
  EXPECT_EQ(gate_->words.gate_waiters.load(), 0u);
}

// NCCL's collectives under their names across versions (mangled or not); nothing else.
// gpu_hold: each high-priority graph launch takes the hold with a new epoch (never 0), a keeper
// opens only the epoch it saw, and the hold may open exactly when the gate would let best-effort
// work go uncharged by high-priority activity: idle, knob off, server gone, no other HP client.
TEST_F(LaunchGateTest, GpuHoldTakesANewEpochAndOpensOnlyTheEpochSeen) {
  auto& word = gate_->words.gpu_hold;
  EXPECT_TRUE(HoldGpu(*gate_));
  const uint32_t zeroth = word.load();
  EXPECT_NE(zeroth, 0u);
  // Held already (the keeper has not opened it yet): a new epoch, and no wake. A keeper that
  // looked at the notes before this launch and decided to open the old epoch fails to.
  EXPECT_FALSE(HoldGpu(*gate_));
  const uint32_t first = word.load();
  EXPECT_NE(first, 0u);
  EXPECT_NE(first, zeroth);
  EXPECT_FALSE(OpenGpuHold(*gate_, zeroth));
  EXPECT_EQ(word.load(), first);
  EXPECT_TRUE(OpenGpuHold(*gate_, first));
  EXPECT_EQ(word.load(), 0u);
  // Held again between a keeper's look and its open: the new hold stays.
  EXPECT_TRUE(HoldGpu(*gate_));
  const uint32_t second = word.load();
  EXPECT_NE(second, first);
  EXPECT_FALSE(OpenGpuHold(*gate_, first));
  EXPECT_EQ(word.load(), second);
  // The epoch counter wraps past 0 without producing an open-looking hold.
  EXPECT_TRUE(OpenGpuHold(*gate_, second));
  gate_->words.hold_epoch.store(0xFFFFFFFFu);
  EXPECT_TRUE(HoldGpu(*gate_));
  EXPECT_EQ(word.load(), 1u);
}

// A hold takes both words at one epoch: gpu_hold for launches held on the GPU alone, and
// gpu_hold_admitted for launches a gate on the CPU admitted (a process that cuts GEMMs), which
// its keeper opens between graphs while gpu_hold stays held. Each opens only its own epoch; a
// hold that finds gpu_hold open wakes the keepers asleep on it.
TEST_F(LaunchGateTest, GpuHoldTakesBothWordsAndEachOpensOnItsOwn) {
  auto& held = gate_->words.gpu_hold;
  auto& admitted = gate_->words.gpu_hold_admitted;
  EXPECT_TRUE(HoldGpu(*gate_));
  const uint32_t epoch = held.load();
  EXPECT_NE(epoch, 0u);
  EXPECT_EQ(admitted.load(), epoch);
  EXPECT_EQ(&HoldWordOf(*gate_, HoldWord::kAdmitted), &admitted);
  EXPECT_TRUE(OpenGpuHold(*gate_, epoch, HoldWord::kAdmitted));  // between graphs
  EXPECT_EQ(admitted.load(), 0u);
  EXPECT_EQ(held.load(), epoch) << "the other trainers' word stays held through the grace";
  // The next graph: gpu_hold was still held, the admitted word open: a new epoch on both (the
  // keeper that opened the admitted word is awake, following gpu_hold: no wake).
  EXPECT_FALSE(HoldGpu(*gate_));
  const uint32_t next = held.load();
  EXPECT_NE(next, epoch);
  EXPECT_EQ(admitted.load(), next);
  EXPECT_FALSE(OpenGpuHold(*gate_, epoch, HoldWord::kAdmitted)) << "a stale epoch";
  EXPECT_FALSE(OpenGpuHold(*gate_, epoch));
  EXPECT_FALSE(HoldGpu(*gate_)) << "both held: no wake";
  EXPECT_EQ(admitted.load(), held.load());
  const uint32_t last = held.load();
  EXPECT_TRUE(OpenGpuHold(*gate_, last));
  EXPECT_EQ(admitted.load(), last) << "opening gpu_hold leaves the admitted word to its keeper";
  EXPECT_TRUE(OpenGpuHold(*gate_, last, HoldWord::kAdmitted));
}

TEST_F(LaunchGateTest, GpuHoldOpensWhenNothingIsLeftToProtect) {
  gpu().gpu_hold.store(1);
  gpu().hp_grace_ns.store(500'000);
  EXPECT_TRUE(GpuHoldOn(gpu()));
  uint64_t wake_by = 1;
  auto allows = [&](uint32_t slot, uint64_t at) {
    return HoldAllowsNow(*board_, gpu(), *gate_, slot, at, &wake_by);
  };
  // No other high-priority client: open.
  EXPECT_EQ(allows(3, now_), HoldAllows::kOpen);
  EXPECT_EQ(wake_by, 0u);
  // One with work in flight: held, and only a completion changes that.
  MarkHighPriority(130, 1, now_);
  EXPECT_EQ(allows(3, now_), HoldAllows::kHeld);
  EXPECT_EQ(wake_by, 0u);
  // The client itself is never held by its own slot.
  EXPECT_EQ(allows(130, now_), HoldAllows::kOpen);
  // Done 100 us ago: held until its grace ends, and the keeper learns when.
  MarkHighPriority(130, 0, now_ - 100'000);
  EXPECT_EQ(allows(3, now_), HoldAllows::kHeld);
  EXPECT_EQ(wake_by, now_ + 400'000);
  EXPECT_EQ(allows(3, now_ + 400'001), HoldAllows::kOpen);
  // Busy again; the knob off, another mode or a silent server all open it.
  MarkHighPriority(130, 1, now_);
  gpu().gpu_hold.store(0);
  EXPECT_FALSE(GpuHoldOn(gpu()));
  EXPECT_EQ(allows(3, now_), HoldAllows::kOpen);
  gpu().gpu_hold.store(1);
  gpu().mode.store(static_cast<uint32_t>(GateMode::kMps));
  EXPECT_EQ(allows(3, now_), HoldAllows::kOpen);
  gpu().mode.store(static_cast<uint32_t>(GateMode::kPriority));
  EXPECT_EQ(allows(3, now_), HoldAllows::kHeld);
  const uint64_t later = now_ + kServerHeartbeatTimeoutNs + 1;
  MarkHighPriority(130, 1, later);  // still progressing: only the server's silence opens it
  gpu().hp_stale_ns.store(later);
  EXPECT_EQ(allows(3, later), HoldAllows::kOpen);
}

// Between the graphs of graph services (none in flight, only their grace left) a keeper in a
// process that cuts GEMMs may open, as its gate on the CPU admits there: never while a graph is
// in flight, nor in the grace of an eager service.
TEST_F(LaunchGateTest, GpuHoldOfAProcessThatCutsGemmsOpensBetweenGraphs) {
  gpu().gpu_hold.store(1);
  gpu().hp_grace_ns.store(500'000);
  uint64_t wake_by = 1;
  auto allows = [&] { return HoldAllowsNow(*board_, gpu(), *gate_, 3, now_, &wake_by); };
  MarkHighPriority(130, 1, now_);  // a graph in flight
  NoteHighPriorityGraph(gate_->slots[130], true);
  EXPECT_EQ(allows(), HoldAllows::kHeld);
  EXPECT_EQ(wake_by, 0u);
  MarkHighPriority(130, 0, now_ - 100'000);  // done 100 us ago: in its grace
  EXPECT_EQ(allows(), HoldAllows::kBetweenGraphs);
  EXPECT_EQ(wake_by, now_ + 400'000);
  // The gate on the CPU admits there as well.
  EXPECT_EQ(DecideBestEffort(*board_, gpu(), *gate_, 3, now_, Be(1000, 10'000)),
            GateDecision::kGoBudget);
  // An eager service in its grace (its CPU gaps): held.
  NoteHighPriorityGraph(gate_->slots[130], false);
  EXPECT_EQ(allows(), HoldAllows::kHeld);
  EXPECT_EQ(wake_by, now_ + 400'000);
  // Beside a graph service and an eager one in their grace: held.
  NoteHighPriorityGraph(gate_->slots[130], true);
  MarkHighPriority(131, 0, now_ - 100'000);
  EXPECT_EQ(allows(), HoldAllows::kHeld);
  NoteHighPriorityGraph(gate_->slots[131], true);
  EXPECT_EQ(allows(), HoldAllows::kBetweenGraphs);
}

// The keeper's rule: both words once the high-priority clients are idle; between graphs only
// the admitted word, and only in a process that cuts GEMMs, plus gpu_hold while the waits that
// process queued on it before its first cut may be pending (draining); nothing while a graph is
// in flight, nor in an eager service's grace.
TEST_F(LaunchGateTest, KeeperOpensTheAdmittedWordBetweenGraphsAndGpuHoldAfterTheGrace) {
  gpu().gpu_hold.store(1);
  gpu().hp_grace_ns.store(500'000);
  uint64_t wake_by = 1;
  auto open = [&](bool cuts, bool draining, uint64_t at) {
    const HoldOpening o =
        KeeperMayOpen(*board_, gpu(), *gate_, 3, at, &wake_by, cuts, draining);
    return std::pair<bool, bool>(o.held, o.admitted);
  };
  using Both = std::pair<bool, bool>;
  MarkHighPriority(130, 1, now_);  // a graph in flight
  NoteHighPriorityGraph(gate_->slots[130], true);
  EXPECT_EQ(open(true, true, now_), Both(false, false));
  EXPECT_EQ(open(false, false, now_), Both(false, false));
  MarkHighPriority(130, 0, now_ - 100'000);  // between graphs: in its grace
  EXPECT_EQ(open(false, false, now_), Both(false, false)) << "a trainer held on the GPU alone";
  EXPECT_EQ(wake_by, now_ + 400'000);
  EXPECT_EQ(open(true, false, now_), Both(false, true)) << "gpu_hold stays held for others";
  EXPECT_EQ(wake_by, now_ + 400'000) << "and the keeper looks again at the grace's end";
  EXPECT_EQ(open(true, true, now_), Both(true, true)) << "its own older waits drain";
  // After the grace: both, whoever asks.
  EXPECT_EQ(open(false, false, now_ + 400'001), Both(true, true));
  EXPECT_EQ(open(true, false, now_ + 400'001), Both(true, true));
  // An eager service in its grace: nothing between its kernels.
  NoteHighPriorityGraph(gate_->slots[130], false);
  EXPECT_EQ(open(true, true, now_), Both(false, false));
  // Nobody to protect (the knob off): both.
  gpu().gpu_hold.store(0);
  EXPECT_EQ(open(false, false, now_), Both(true, true));
}

// A release past the bound lasts at least what the board says (policy.gpu_hold_release_ms): 0
// (a server that predates it) is until idle, and a value past the contract's range, which no
// server publishes, is read as 600 s.
TEST_F(LaunchGateTest, HoldReleaseTimeIsTheBoardsWithinItsRange) {
  EXPECT_EQ(HoldReleaseNs(gpu()), 0u);
  gpu().gpu_hold_release_ns.store(contract::kDefaultGpuHoldReleaseNs);
  EXPECT_EQ(HoldReleaseNs(gpu()), 30'000'000'000u);
  gpu().gpu_hold_release_ns.store(UINT64_MAX);
  EXPECT_EQ(HoldReleaseNs(gpu()), contract::kMaxGpuHoldReleaseNs);
}

// A hold lasts at most its bound (the GPU's gpu_hold_max_ns): once the busy high-priority
// clients' earliest busy period is older than it, kTooLong, and the keeper opens both words and
// releases the process's launches to the gate on the CPU (`released`), whoever asks; before it,
// the keeper is told to look again at the bound's end where nothing sooner wakes it. A busy
// period without a start, one that starts after now (a tenant's lie), or no bound (0) leave the
// hold as it was.
TEST_F(LaunchGateTest, GpuHoldLastsAtMostItsBound) {
  gpu().gpu_hold.store(1);
  gpu().hp_grace_ns.store(500'000);
  gpu().hp_stale_ns.store(10'000'000'000);
  constexpr uint64_t kBound = 100'000'000;
  gpu().gpu_hold_max_ns.store(kBound);
  uint64_t wake_by = 1;
  auto allows = [&](uint64_t at) { return HoldAllowsNow(*board_, gpu(), *gate_, 3, at, &wake_by); };
  MarkHighPriority(130, 1, now_);  // a graph in flight, its busy period begun now
  NoteHighPriorityGraph(gate_->slots[130], true);
  gate_->slots[130].busy_start_ns.store(now_);
  EXPECT_EQ(allows(now_ + 50'000'000), HoldAllows::kHeld);
  EXPECT_EQ(wake_by, now_ + kBound) << "nothing else wakes a keeper while a graph is in flight";
  EXPECT_EQ(allows(now_ + kBound), HoldAllows::kTooLong);
  gpu().gpu_hold_max_ns.store(0);
  EXPECT_EQ(allows(now_ + kBound), HoldAllows::kHeld) << "no bound";
  gpu().gpu_hold_max_ns.store(UINT64_MAX);
  EXPECT_EQ(allows(now_ + kBound), HoldAllows::kHeld) << "past the knob's range: 60 s";
  EXPECT_EQ(wake_by, now_ + contract::kMaxGpuHoldMaxNs);
  gpu().gpu_hold_max_ns.store(kBound);
  // Between graphs, in the grace: the grace's end is sooner than the bound's.
  MarkHighPriority(130, 0, now_ + 50'000'000);
  EXPECT_EQ(allows(now_ + 50'100'000), HoldAllows::kBetweenGraphs);
  EXPECT_EQ(wake_by, now_ + 50'500'000);
  MarkHighPriority(130, 0, now_ + kBound + 1'000'000);
  EXPECT_EQ(allows(now_ + kBound + 1'100'000), HoldAllows::kTooLong);
  // Idle: open, whatever the old period says.
  EXPECT_EQ(allows(now_ + kBound + 2'000'000), HoldAllows::kOpen);
  // Two busy clients: the earlier period counts; one begun after now is not believed.
  MarkHighPriority(130, 1, now_ + kBound);
  MarkHighPriority(131, 1, now_ + kBound);
  NoteHighPriorityGraph(gate_->slots[131], true);
  gate_->slots[131].busy_start_ns.store(now_ + 90'000'000);
  EXPECT_EQ(allows(now_ + kBound), HoldAllows::kTooLong);
  gate_->slots[130].busy_start_ns.store(now_ + 10 * kBound);
  EXPECT_EQ(allows(now_ + kBound), HoldAllows::kHeld);
  EXPECT_EQ(wake_by, now_ + 90'000'000 + kBound);
  gate_->slots[131].busy_start_ns.store(0);
  EXPECT_EQ(allows(now_ + kBound), HoldAllows::kHeld);
  EXPECT_EQ(wake_by, 0u) << "no period known: only a completion";
  // The keeper: both words and the release past the bound, for any process.
  gate_->slots[130].busy_start_ns.store(now_);
  for (const bool cuts : {false, true}) {
    const HoldOpening o =
        KeeperMayOpen(*board_, gpu(), *gate_, 3, now_ + kBound, &wake_by, cuts, false);
    EXPECT_TRUE(o.held && o.admitted && o.released) << cuts;
  }
  const HoldOpening before =
      KeeperMayOpen(*board_, gpu(), *gate_, 3, now_ + 1'000, &wake_by, false, false);
  EXPECT_FALSE(before.held || before.admitted || before.released);
  MarkHighPriority(130, 0, now_);
  MarkHighPriority(131, 0, now_);
  const HoldOpening idle =
      KeeperMayOpen(*board_, gpu(), *gate_, 3, now_ + kBound, &wake_by, false, false);
  EXPECT_TRUE(idle.held && idle.admitted);
  EXPECT_FALSE(idle.released) << "idle ends a release";
}

// The hold applies on the GPU only for high-priority clients that launch graphs (not for an
// eager service, nor for a client's own slot), as each client's last launch says.
TEST_F(LaunchGateTest, GpuHoldOnlyForHighPriorityClientsLaunchingGraphs) {
  EXPECT_FALSE(HoldsOnGpuFor(*gate_, gpu(), 3));
  MarkHighPriority(130, 1, now_);
  NoteHighPriorityGraph(gate_->slots[130], false);
  EXPECT_FALSE(HoldsOnGpuFor(*gate_, gpu(), 3));
  NoteHighPriorityGraph(gate_->slots[130], true);
  EXPECT_TRUE(HoldsOnGpuFor(*gate_, gpu(), 3));
  EXPECT_FALSE(HoldsOnGpuFor(*gate_, gpu(), 130));
  NoteHighPriorityGraph(gate_->slots[130], false);  // an eager launch after the graph
  EXPECT_FALSE(HoldsOnGpuFor(*gate_, gpu(), 3));
  gate_->slots[131].launches_graphs.store(1);  // not marked high priority: never read
  EXPECT_FALSE(HoldsOnGpuFor(*gate_, gpu(), 3));
}

TEST(KernelClassTest, NamesCollectivesThatTheGateNeverHolds) {
  using contract::IsCommunicationKernelName;
  EXPECT_TRUE(IsCommunicationKernelName("ncclKernel_AllReduce_RING_LL_Sum_float"));
  EXPECT_TRUE(IsCommunicationKernelName("ncclDevKernel_Generic"));
  EXPECT_TRUE(IsCommunicationKernelName("_Z28ncclDevKernel_SendRecv_orion_spin24ncclDevKernelArgsStorage"));
  EXPECT_FALSE(IsCommunicationKernelName("volta_sgemm_128x64_nn"));
  EXPECT_FALSE(IsCommunicationKernelName("orion_spin"));
  EXPECT_FALSE(IsCommunicationKernelName(nullptr));
}

TEST(KernelClassTest, ClassifiesByNameWithoutAllocating) {
  using contract::ClassifyKernelName;
  EXPECT_EQ(ClassifyKernelName("volta_sgemm_128x64_nn"), KernelClass::kCompute);
  EXPECT_EQ(ClassifyKernelName("sm90_xmma_fprop_implicit_gemm"), KernelClass::kCompute);
  EXPECT_EQ(ClassifyKernelName("_ZN2at6native29vectorized_elementwise_kernel"), KernelClass::kMemory);
  EXPECT_EQ(ClassifyKernelName("cudnn::bn_fw_tr_1C11_kernel_NCHW_Norm"), KernelClass::kMemory);
  EXPECT_EQ(ClassifyKernelName("orion_spin"), KernelClass::kUnknown);
  EXPECT_EQ(ClassifyKernelName(""), KernelClass::kUnknown);
  EXPECT_EQ(ClassifyKernelName(nullptr), KernelClass::kUnknown);
  EXPECT_TRUE(contract::Complementary(KernelClass::kCompute, KernelClass::kMemory));
  EXPECT_FALSE(contract::Complementary(KernelClass::kCompute, KernelClass::kCompute));
  EXPECT_FALSE(contract::Complementary(KernelClass::kUnknown, KernelClass::kMemory));
  EXPECT_FALSE(contract::Complementary(KernelClass::kMixed, KernelClass::kMemory));
  EXPECT_FALSE(contract::Complementary(KernelClass::kCompute, KernelClass::kMixed));
  EXPECT_EQ(contract::KernelClassFromBoard(KernelClassToBoard(KernelClass::kMixed)),
            KernelClass::kMixed);
  EXPECT_EQ(contract::KernelClassFromBoard(0), KernelClass::kUnknown);
  EXPECT_EQ(contract::KernelClassFromBoard(KernelClassToBoard(KernelClass::kMemory)),
            KernelClass::kMemory);
}

TEST(KernelRegistryTest, NameOnceSamplingAndEstimate) {
  auto registry = std::make_unique<KernelRegistry<64>>();
  KernelRecord* a = registry->FindOrInsert(0x1000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(registry->FindOrInsert(0x1000), a);
  EXPECT_EQ(registry->Find(0x2000), nullptr);
  EXPECT_EQ(registry->FindOrInsert(0), nullptr);
  EXPECT_TRUE(a->ClaimNameReport());
  EXPECT_FALSE(a->ClaimNameReport());
  EXPECT_EQ(a->EstimateNs(), kDefaultKernelEstimateNs);
  a->AddSample(200'000);
  EXPECT_EQ(a->EstimateNs(), 200'000u);
  a->AddSample(100'000);
  EXPECT_EQ(a->EstimateNs(), 175'000u);

  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(ShouldSample(i));
  // Learning: at a rate sparser than 1 in 64, about 1 in 8 of the next launches up to the
  // 256th, each layer of a kernel launched 4 times a step among them; 1 in 64 and denser rates
  // stay as they are.
  for (uint64_t every : {128u, 256u, 4096u}) {
    int learnt = 0;
    int learnt_by_layer[4] = {};
    for (uint64_t i = 3; i < kLearningLaunches; ++i) {
      if (!ShouldSample(i, every)) continue;
      ++learnt;
      ++learnt_by_layer[i % 4];
    }
    EXPECT_GT(learnt, 18) << every;
    EXPECT_LT(learnt, 48) << every;
    for (int layer : learnt_by_layer) EXPECT_GT(layer, 1) << every;
  }
  int dense = 0;
  int at_64 = 0;
  for (uint64_t i = 3; i < kLearningLaunches; ++i) {
    dense += ShouldSample(i, 2);
    at_64 += ShouldSample(i, 64);
  }
  EXPECT_GT(dense, 90);
  EXPECT_LT(at_64, 14);
  // About 1 in 64 afterwards, spread over every phase of a cycle: a kernel that a model launches
  // 4 times per step (4 layers) gets samples of each layer, not always of the same one.
  int sampled = 0;
  int by_layer[4] = {};
  for (uint64_t i = kLearningLaunches; i < 64'256; ++i) {
    if (!ShouldSample(i)) continue;
    ++sampled;
    ++by_layer[i % 4];
  }
  EXPECT_GT(sampled, 800);
  EXPECT_LT(sampled, 1200);
  for (int layer : by_layer) EXPECT_GT(layer, 150);
  // 1 in 256 (ORION_SAMPLE_EVERY_HIGH=256): a quarter of those, the warm-up launches still all.
  int fewer = 0;
  for (uint64_t i = kLearningLaunches; i < 64'256; ++i) fewer += ShouldSample(i, 256);
  EXPECT_GT(fewer, 180);
  EXPECT_LT(fewer, 320);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(ShouldSample(i, 256));
}

// Which GPUs a kernel was launched on (a first launch on a GPU is never held for timing), and a
// graph's queued mean apart from its estimate; Clear forgets both.
TEST(KernelRegistryTest, DevicesLaunchedOnAndQueuedMean) {
  auto registry = std::make_unique<KernelRegistry<64>>();
  KernelRecord* k = registry->FindOrInsert(0x2000);
  ASSERT_NE(k, nullptr);
  EXPECT_FALSE(k->LaunchedOn(0));
  k->NoteLaunchedOn(0);
  k->NoteLaunchedOn(63);
  k->NoteLaunchedOn(64);  // out of range: ignored
  k->NoteLaunchedOn(-1);
  EXPECT_TRUE(k->LaunchedOn(0));
  EXPECT_FALSE(k->LaunchedOn(1));
  EXPECT_TRUE(k->LaunchedOn(63));
  EXPECT_FALSE(k->LaunchedOn(64));
  k->AddQueuedSample(1'000'000);
  k->AddQueuedSample(1'400'000);
  EXPECT_EQ(k->queued_ns.load(), 1'100'000u);  // the first, then a quarter of the next
  EXPECT_EQ(k->estimate_ns.load(), 0u);         // the gate's estimate is apart
  registry->Clear();
  k = registry->FindOrInsert(0x2000);
  EXPECT_FALSE(k->LaunchedOn(0));
  EXPECT_EQ(k->queued_ns.load(), 0u);
}

TEST(KernelRegistryTest, ConcurrentInsertsAgreeAndFullTableDegrades) {
  auto registry = std::make_unique<KernelRegistry<64>>();
  std::vector<std::thread> threads;
  std::atomic<int> names{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (uint64_t k = 1; k <= 32; ++k) {
        KernelRecord* r = registry->FindOrInsert(k << 8);
        if (r != nullptr && r->ClaimNameReport()) names.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(names.load(), 32);
  int stored = 0;
  for (uint64_t k = 1; k <= 1000; ++k) stored += registry->FindOrInsert(k << 20) != nullptr;
  EXPECT_LE(stored, 64 - 32);
}

}  // namespace
}  // namespace orion::interpose
