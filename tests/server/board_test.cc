// The board and its areas across processes: a forked child maps what a client is handed and
// writes events and counters through the contract's atomics; the server side reads them back in
// order. What a client cannot do with the board it is handed (make it writable by any means), the
// server's checks of the shared gate areas, the ring's behaviour when full, and a producer killed
// between claim and publish.
#include "server/board.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "server/node_state.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Event;
using contract::EventKind;

using orion::testing::MapAs;

TEST(BoardTest, HeaderAndLayoutAreValidForClients) {
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok()) << board.status();
  const auto* mapped = MapAs<const contract::Board>((*board)->board_fd(), PROT_READ);
  ASSERT_NE(mapped, nullptr);
  EXPECT_TRUE(contract::BoardLooksValid(*mapped, sizeof(contract::Board)));
  EXPECT_FALSE(contract::BoardLooksValid(*mapped, sizeof(contract::Board) - 1));
  EXPECT_EQ((*board)->FindOrAddGpu("GPU-a"), 0);
  EXPECT_EQ((*board)->FindOrAddGpu("GPU-b"), 1);
  EXPECT_EQ((*board)->FindOrAddGpu("GPU-a"), 0);
  EXPECT_EQ(mapped->header.num_gpus, 2u);
  EXPECT_STREQ(mapped->gpus[1].uuid, "GPU-b");
  // Each GPU has its own gate area; each slot its own client area, made at assignment.
  auto* gate = MapAs<contract::GateArea>((*board)->gate_fd(1), PROT_READ | PROT_WRITE);
  ASSERT_NE(gate, nullptr);
  EXPECT_TRUE(contract::GateLooksValid(*gate, sizeof(contract::GateArea), 1));
  EXPECT_FALSE(contract::GateLooksValid(*gate, sizeof(contract::GateArea), 0));
  EXPECT_NE((*board)->gate_fd(0), (*board)->gate_fd(1));
  EXPECT_EQ((*board)->area_fd(0), -1);
  auto slot = (*board)->AssignSlot(5, 1, 1, contract::Priority::kBestEffort, 0);
  ASSERT_TRUE(slot);
  auto* area = MapAs<contract::ClientArea>((*board)->area_fd(*slot), PROT_READ | PROT_WRITE);
  ASSERT_NE(area, nullptr);
  const uint32_t generation = mapped->slots[*slot].generation.load();
  EXPECT_TRUE(contract::AreaLooksValid(*area, sizeof(contract::ClientArea), *slot, generation));
  EXPECT_FALSE(
      contract::AreaLooksValid(*area, sizeof(contract::ClientArea), *slot, generation + 1));
  (*board)->FreeSlot(*slot);
  EXPECT_EQ((*board)->area_fd(*slot), -1);
  EXPECT_EQ((*board)->area(*slot), nullptr);
}

// What a tenant holds of the board is a descriptor of a sealed memfd: no writable mapping, no
// write(2), no resize, not even through a fresh open of /proc/self/fd/N or mprotect; the gate and
// client areas cannot be resized (the server reads them) nor sealed by a client.
TEST(BoardTest, AClientCannotMakeTheBoardWritable) {
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok()) << board.status();
  if (!(*board)->sealed()) GTEST_SKIP() << "this kernel cannot seal (F_SEAL_FUTURE_WRITE)";
  ASSERT_EQ((*board)->FindOrAddGpu("GPU-a"), 0);
  auto slot = (*board)->AssignSlot(5, 1, 0, contract::Priority::kBestEffort, 0);
  ASSERT_TRUE(slot);
  const int fd = (*board)->board_fd();
  EXPECT_EQ(mmap(nullptr, sizeof(contract::Board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
            MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  const char byte = 1;
  EXPECT_EQ(pwrite(fd, &byte, 1, 0), -1);
  EXPECT_NE(ftruncate(fd, 0), 0);
  EXPECT_NE(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
  const std::string again = "/proc/self/fd/" + std::to_string(fd);
  const int reopened = open(again.c_str(), O_RDWR | O_CLOEXEC);
  if (reopened >= 0) {  // a fresh file description of the same memfd: still sealed
    EXPECT_EQ(mmap(nullptr, sizeof(contract::Board), PROT_READ | PROT_WRITE, MAP_SHARED,
                   reopened, 0),
              MAP_FAILED);
    EXPECT_EQ(pwrite(reopened, &byte, 1, 0), -1);
    close(reopened);
  }
  void* ro = mmap(nullptr, sizeof(contract::Board), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_NE(mprotect(ro, 4096, PROT_READ | PROT_WRITE), 0);
  munmap(ro, sizeof(contract::Board));
  // The server's own mapping stays writable.
  (*board)->SetPaused(*slot, true);
  EXPECT_EQ((*board)->board().slots[*slot].paused.load(), 1u);
  for (const int area_fd : {(*board)->gate_fd(0), (*board)->area_fd(*slot)}) {
    EXPECT_NE(ftruncate(area_fd, 0), 0);
    EXPECT_NE(fcntl(area_fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
  }
}

// A paused client sleeps in FUTEX_WAIT on its slot's wake_seq, in the board it maps read-only:
// the wait must sleep there (not fail at once and spin) and wake when the server resumes it.
TEST(BoardTest, PausedClientsSleepOnTheReadOnlyBoardAndWakeOnResume) {
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok()) << board.status();
  ASSERT_EQ((*board)->FindOrAddGpu("GPU-a"), 0);
  auto slot = (*board)->AssignSlot(5, 1, 0, contract::Priority::kBestEffort, 0);
  ASSERT_TRUE(slot);
  const auto* mapped = MapAs<const contract::Board>((*board)->board_fd(), PROT_READ);
  ASSERT_NE(mapped, nullptr);
  (*board)->SetPaused(*slot, true);
  const std::atomic<uint32_t>& word = mapped->slots[*slot].wake_seq;
  const uint32_t seen = word.load();
  long rc = 0;
  int err = 0;
  const uint64_t t0 = MonotonicNs();
  std::atomic<long> tid{0};
  std::thread waiter([&] {
    tid.store(syscall(SYS_gettid));
    timespec timeout{5, 0};
    rc = syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT, seen,
                 &timeout, nullptr, 0);
    err = errno;
  });
  // Resumed only once the waiter sleeps in the kernel (a loaded machine may start the thread
  // late; resumed before its FUTEX_WAIT, the wait would find wake_seq changed and not sleep).
  for (int i = 0; i < 500; ++i) {
    const long t = tid.load();
    std::ifstream stat("/proc/self/task/" + std::to_string(t) + "/stat");
    std::string line;
    if (t != 0 && std::getline(stat, line) && line.find(") S ") != std::string::npos) break;
    usleep(10'000);
  }
  usleep(100'000);
  (*board)->SetPaused(*slot, false);  // bumps wake_seq and wakes
  waiter.join();
  const uint64_t waited = MonotonicNs() - t0;
  EXPECT_EQ(rc, 0) << "FUTEX_WAIT on the read-only board failed: " << std::strerror(err);
  EXPECT_GE(waited, 90'000'000u);     // it slept until the resume...
  EXPECT_LT(waited, 2'000'000'000u);  // ...and woke on it, not at the timeout
}

// The gate area is shared by the clients of a GPU: what no honest client writes there is cleared
// at each check, and a best-effort slot's claim of high-priority work is reported by slot.
TEST(BoardTest, CheckGatesClearsBestEffortClaimsAndImpossibleValues) {
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok()) << board.status();
  NodeBoard& b = **board;
  ASSERT_EQ(b.FindOrAddGpu("GPU-a"), 0);
  const auto hp = b.AssignSlot(1, 100, 0, contract::Priority::kHigh, 0);
  const auto be = b.AssignSlot(2, 200, 0, contract::Priority::kBestEffort, 0);
  ASSERT_TRUE(hp && be);
  auto* gate = MapAs<contract::GateArea>(b.gate_fd(0), PROT_READ | PROT_WRITE);
  ASSERT_NE(gate, nullptr);
  const uint64_t now = MonotonicNs();
  // Honest state: an HP client with work in flight, best-effort time within 64 budgets.
  gate->slots[*hp].inflight.store(3);
  gate->slots[*hp].last_progress_ns.store(now);
  gate->words.be_outstanding_ns.store(b.ReadKnobs(0).be_budget_ns * 2);
  GateRepairs r = b.CheckGates(now);
  EXPECT_TRUE(r.claimed_by.empty());
  EXPECT_EQ(r.values_reset, 0u);
  EXPECT_EQ(gate->slots[*hp].inflight.load(), 3u);
  // A best-effort client claims HP work; the HP entry gets a progress stamp an hour ahead and a
  // count no ring could hold; the best-effort time in flight is absurd.
  const uint32_t seq_before = gate->words.gate_seq.load();
  gate->slots[*be].inflight.store(5);
  gate->slots[*hp].last_progress_ns.store(now + 3600ull * 1000000000ull);
  gate->slots[*hp].inflight.store(0x7fffffff);
  gate->words.be_outstanding_ns.store(~0ull / 2);
  r = b.CheckGates(now);
  ASSERT_EQ(r.claimed_by.size(), 1u);
  EXPECT_EQ(r.claimed_by[0], *be);
  EXPECT_EQ(r.values_reset, 2u);
  EXPECT_EQ(gate->slots[*be].inflight.load(), 0u);
  EXPECT_EQ(gate->slots[*hp].inflight.load(), 0u);
  EXPECT_LE(gate->slots[*hp].last_progress_ns.load(), now);
  EXPECT_EQ(gate->words.be_outstanding_ns.load(), 0u);
  EXPECT_NE(gate->words.gate_seq.load(), seq_before);  // waiters re-decide
  r = b.CheckGates(now);
  EXPECT_TRUE(r.claimed_by.empty());
  EXPECT_EQ(r.values_reset, 0u);
}

// Where the kernel cannot seal the board, a tenant could write over the server's fields (its own
// priority, another client's pause, the knobs, the mask, the header); written here through the
// server's own mapping: Reassert puts every one back from the server's record and says how
// many; untouched, it changes nothing.
TEST(BoardTest, ReassertPutsBackWhatATenantOverwrote) {
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok()) << board.status();
  NodeBoard& b = **board;
  contract::Board* mapped = &b.board();
  ASSERT_EQ(b.FindOrAddGpu("GPU-a"), 0);
  auto hp = b.AssignSlot(1, 100, 0, contract::Priority::kHigh, 0);
  auto be = b.AssignSlot(2, 200, 0, contract::Priority::kBestEffort, 1 << 20);
  ASSERT_TRUE(hp && be);
  EXPECT_EQ(b.Reassert(), 0u);
  unsigned char header_before[offsetof(contract::BoardHeader, server_heartbeat_ns)];
  std::memcpy(header_before, &mapped->header, sizeof(header_before));

  auto& gpu = mapped->gpus[0];
  mapped->slots[*be].priority.store(static_cast<uint32_t>(contract::Priority::kHigh));
  mapped->slots[*hp].paused.store(1);
  mapped->slots[*be].memory_limit_bytes.store(0);
  mapped->slots[*be].gpu.store(7);
  gpu.hp_slot_mask[0].store(~0ull);
  gpu.spin_ns.store(0xFFFFFFFFu);
  gpu.be_budget_ns.store(0);
  gpu.mode.store(99);
  gpu.gpu_hold_max_ns.store(0);
  gpu.gpu_hold_release_ns.store(0);
  mapped->header.magic = 0;
  EXPECT_EQ(b.Reassert(), 11u);
  EXPECT_EQ(mapped->slots[*be].priority.load(), static_cast<uint32_t>(contract::Priority::kBestEffort));
  EXPECT_EQ(mapped->slots[*hp].paused.load(), 0u);
  EXPECT_EQ(mapped->slots[*be].memory_limit_bytes.load(), 1u << 20);
  EXPECT_EQ(mapped->slots[*be].gpu.load(), 0u);
  EXPECT_EQ(gpu.hp_slot_mask[0].load(), 1ull << *hp);
  EXPECT_EQ(gpu.spin_ns.load(), contract::kDefaultSpinNs);
  EXPECT_EQ(gpu.mode.load(), static_cast<uint32_t>(contract::kDefaultGateMode));
  EXPECT_EQ(gpu.gpu_hold_max_ns.load(), contract::kDefaultGpuHoldMaxNs);
  EXPECT_EQ(gpu.gpu_hold_release_ns.load(), contract::kDefaultGpuHoldReleaseNs);
  EXPECT_EQ(std::memcmp(&mapped->header, header_before, sizeof(header_before)), 0);
  EXPECT_EQ(b.Reassert(), 0u);

  // A freed slot forged back to active is put back too.
  b.FreeSlot(*be);
  mapped->slots[*be].state.store(static_cast<uint32_t>(contract::SlotState::kActive));
  EXPECT_EQ(b.Reassert(), 1u);
  EXPECT_EQ(mapped->slots[*be].state.load(), static_cast<uint32_t>(contract::SlotState::kFree));
}

TEST(BoardTest, PriorityMaskAndBestEffortCountComeFromTheServersRecord) {
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok()) << board.status();
  NodeBoard& b = **board;
  contract::Board* mapped = &b.board();
  ASSERT_EQ(b.FindOrAddGpu("GPU-a"), 0);
  const auto hp = b.AssignSlot(1, 100, 0, contract::Priority::kHigh, 0);
  const auto be = b.AssignSlot(2, 200, 0, contract::Priority::kBestEffort, 0);
  ASSERT_TRUE(hp && be);
  const contract::GpuState& gpu = mapped->gpus[0];
  EXPECT_EQ(gpu.hp_slot_mask[0].load(), 1ull << *hp);
  EXPECT_EQ(gpu.be_clients.load(), 1u);
  // Written over (an unsealed board): the best-effort slot says high priority and the HP client
  // another GPU; the next recomputation (a third client arrives) must not believe either.
  mapped->slots[*be].priority.store(static_cast<uint32_t>(contract::Priority::kHigh));
  mapped->slots[*hp].gpu.store(7);
  const auto third = b.AssignSlot(3, 300, 0, contract::Priority::kBestEffort, 0);
  ASSERT_TRUE(third);
  EXPECT_EQ(gpu.hp_slot_mask[0].load(), 1ull << *hp);
  EXPECT_EQ(gpu.be_clients.load(), 2u);
  // The admin API's change goes through the server's record.
  b.SetPriority(*be, contract::Priority::kHigh);
  EXPECT_EQ(gpu.hp_slot_mask[0].load(), (1ull << *hp) | (1ull << *be));
  EXPECT_EQ(gpu.be_clients.load(), 1u);
  // Freeing uses the recorded GPU too, whatever the slot says.
  b.FreeSlot(*hp);
  EXPECT_EQ(gpu.hp_slot_mask[0].load(), 1ull << *be);
}

TEST(BoardTest, ChildProcessEventsArriveInOrder) {
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  (*board)->FindOrAddGpu("GPU-a");
  auto slot = (*board)->AssignSlot(7, 1, 0, contract::Priority::kHigh, 1 << 20);
  ASSERT_TRUE(slot.has_value());
  constexpr int kEvents = 20000;  // ~10 ring laps: the child waits when the ring is full
  const pid_t child = fork();
  if (child == 0) {
    // The descriptors a client would be handed, inherited across fork.
    const auto* b = MapAs<const contract::Board>((*board)->board_fd(), PROT_READ);
    auto* area = MapAs<contract::ClientArea>((*board)->area_fd(*slot), PROT_READ | PROT_WRITE);
    if (!b || !area) _exit(3);
    const contract::ClientSlot& s = b->slots[*slot];
    if (s.client_id.load() != 7 || s.memory_limit_bytes.load() != (1u << 20)) _exit(4);
    for (int i = 0; i < kEvents; ++i) {
      Event e{};
      e.kind = EventKind::kLaunch;
      e.func = static_cast<uint64_t>(i);
      e.grid[0] = 3;
      while (!area->ring.TryPush(e)) usleep(50);
    }
    area->counters.memory_used_bytes.store(4096);
    area->counters.launches.store(kEvents);
    _exit(0);
  }
  auto& ring = (*board)->area(*slot)->ring;
  int next = 0;
  Event e{};
  while (next < kEvents) {
    if (ring.TryPop(&e)) {
      ASSERT_EQ(e.kind, EventKind::kLaunch);
      ASSERT_EQ(e.func, static_cast<uint64_t>(next));
      ASSERT_EQ(e.grid[0], 3u);
      ++next;
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ((*board)->area(*slot)->counters.memory_used_bytes.load(), 4096u);
  EXPECT_EQ(ring.head.load(), static_cast<uint64_t>(kEvents));  // retried pushes are not events
}

TEST(BoardTest, FullRingDropsInsteadOfBlocking) {
  auto ring = std::make_unique<contract::EventRing>();
  ring->Reset();
  Event e{};
  e.kind = EventKind::kLaunch;
  for (uint32_t i = 0; i < contract::kRingCapacity; ++i) ASSERT_TRUE(ring->TryPush(e));
  EXPECT_FALSE(ring->TryPush(e));
  EXPECT_EQ(ring->dropped.load(), 1u);
}

TEST(BoardTest, KilledProducerHoleIsSkippedAfterTimeout) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity peer = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  auto req = testing::MakeRequest(cfg.gpus[0].c_str(), contract::Priority::kBestEffort);
  auto a = state.Register(peer, req);
  ASSERT_EQ(a.status, contract::RegisterStatus::kOk);
  auto& ring = state.board().area(a.slot)->ring;
  // A producer claimed position 0 and died before publishing; a later event is published.
  ring.head.store(1);
  Event e{};
  e.kind = EventKind::kLaunch;
  ASSERT_TRUE(ring.TryPush(e));
  const uint64_t t0 = MonotonicNs();
  EXPECT_EQ(state.DrainOnce(t0), 0u);                // blocked behind the hole
  EXPECT_EQ(state.DrainOnce(t0 + 50000000), 0u);     // 50 ms: still waiting
  state.DrainOnce(t0 + 300000000);                   // 300 ms: hole skipped
  EXPECT_EQ(state.DrainOnce(t0 + 300000001), 1u);    // the published event arrives
}

TEST(BoardTest, GarbageEventKindsAreCountedNotTrusted) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity peer = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  auto a = state.Register(peer, testing::MakeRequest(cfg.gpus[0].c_str(),
                                                     contract::Priority::kHigh));
  auto& ring = state.board().area(a.slot)->ring;
  Event e{};
  e.kind = static_cast<EventKind>(0xdead);
  ASSERT_TRUE(ring.TryPush(e));
  e.kind = EventKind::kBusyPeriod;
  e.duration_ns = ~0ull;  // absurd duration: ignored
  ASSERT_TRUE(ring.TryPush(e));
  e.duration_ns = 2000000;
  ASSERT_TRUE(ring.TryPush(e));
  EXPECT_EQ(state.DrainOnce(MonotonicNs()), 3u);
  MetricsSnapshot snap = state.Snapshot();
  ASSERT_EQ(snap.clients.size(), 1u);
  EXPECT_EQ(snap.clients[0].busy.count, 1u);
  EXPECT_DOUBLE_EQ(snap.clients[0].busy.sum_s, 0.002);
}

}  // namespace
}  // namespace orion::server
