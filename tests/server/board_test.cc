// The board across processes: a forked child maps the board file and writes events and counters
// through the contract's atomics; the server side reads them back in order. Also the ring's
// behaviour when full, and a producer killed between claim and publish.
#include "server/board.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

#include "server/node_state.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Event;
using contract::EventKind;

TEST(BoardTest, HeaderAndLayoutAreValidForClients) {
  const std::string dir = testing::MakeTempDir();
  auto board = BoardFile::Create(dir + "/board");
  ASSERT_TRUE(board.ok()) << board.status();
  contract::Board* mapped = testing::MapBoard(dir + "/board");
  ASSERT_NE(mapped, nullptr);
  EXPECT_TRUE(contract::BoardLooksValid(*mapped, sizeof(contract::Board)));
  EXPECT_FALSE(contract::BoardLooksValid(*mapped, sizeof(contract::Board) - 1));
  EXPECT_EQ((*board)->FindOrAddGpu("GPU-a"), 0);
  EXPECT_EQ((*board)->FindOrAddGpu("GPU-b"), 1);
  EXPECT_EQ((*board)->FindOrAddGpu("GPU-a"), 0);
  EXPECT_EQ(mapped->header.num_gpus, 2u);
  EXPECT_STREQ(mapped->gpus[1].uuid, "GPU-b");
}

// A tenant with the board mapped writes over the server's fields (its own priority, another
// client's pause, the knobs, the mask, the header): Reassert puts every one back from the server's
// record and says how many; untouched, it changes nothing. Client-written fields stay as written.
TEST(BoardTest, ReassertPutsBackWhatATenantOverwrote) {
  const std::string dir = testing::MakeTempDir();
  auto board = BoardFile::Create(dir + "/board");
  ASSERT_TRUE(board.ok()) << board.status();
  BoardFile& b = **board;
  contract::Board* mapped = testing::MapBoard(dir + "/board");
  ASSERT_NE(mapped, nullptr);
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
  mapped->header.magic = 0;
  mapped->slots[*be].launches.store(12345);  // the client's own counter: left alone
  EXPECT_EQ(b.Reassert(), 9u);
  EXPECT_EQ(mapped->slots[*be].priority.load(), static_cast<uint32_t>(contract::Priority::kBestEffort));
  EXPECT_EQ(mapped->slots[*hp].paused.load(), 0u);
  EXPECT_EQ(mapped->slots[*be].memory_limit_bytes.load(), 1u << 20);
  EXPECT_EQ(mapped->slots[*be].gpu.load(), 0u);
  EXPECT_EQ(gpu.hp_slot_mask[0].load(), 1ull << *hp);
  EXPECT_EQ(gpu.spin_ns.load(), contract::kDefaultSpinNs);
  EXPECT_EQ(gpu.mode.load(), static_cast<uint32_t>(contract::kDefaultGateMode));
  EXPECT_EQ(std::memcmp(&mapped->header, header_before, sizeof(header_before)), 0);
  EXPECT_EQ(mapped->slots[*be].launches.load(), 12345u);
  EXPECT_EQ(b.Reassert(), 0u);

  // A freed slot forged back to active is put back too.
  b.FreeSlot(*be);
  mapped->slots[*be].state.store(static_cast<uint32_t>(contract::SlotState::kActive));
  EXPECT_EQ(b.Reassert(), 1u);
  EXPECT_EQ(mapped->slots[*be].state.load(), static_cast<uint32_t>(contract::SlotState::kFree));
}

TEST(BoardTest, PriorityMaskAndBestEffortCountComeFromTheServersRecord) {
  const std::string dir = testing::MakeTempDir();
  auto board = BoardFile::Create(dir + "/board");
  ASSERT_TRUE(board.ok()) << board.status();
  BoardFile& b = **board;
  contract::Board* mapped = testing::MapBoard(dir + "/board");
  ASSERT_NE(mapped, nullptr);
  ASSERT_EQ(b.FindOrAddGpu("GPU-a"), 0);
  const auto hp = b.AssignSlot(1, 100, 0, contract::Priority::kHigh, 0);
  const auto be = b.AssignSlot(2, 200, 0, contract::Priority::kBestEffort, 0);
  ASSERT_TRUE(hp && be);
  const contract::GpuState& gpu = mapped->gpus[0];
  EXPECT_EQ(gpu.hp_slot_mask[0].load(), 1ull << *hp);
  EXPECT_EQ(gpu.be_clients.load(), 1u);
  // A best-effort tenant writes high priority into its slot and moves the HP client to another
  // GPU on the board; the next recomputation (a third client arrives) must not believe either.
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
  const std::string dir = testing::MakeTempDir();
  auto board = BoardFile::Create(dir + "/board");
  ASSERT_TRUE(board.ok());
  (*board)->FindOrAddGpu("GPU-a");
  auto slot = (*board)->AssignSlot(7, 1, 0, contract::Priority::kHigh, 1 << 20);
  ASSERT_TRUE(slot.has_value());
  constexpr int kEvents = 20000;  // ~10 ring laps: the child waits when the ring is full
  const pid_t child = fork();
  if (child == 0) {
    contract::Board* b = testing::MapBoard(dir + "/board");
    if (!b) _exit(3);
    contract::ClientSlot& s = b->slots[*slot];
    if (s.client_id.load() != 7 || s.memory_limit_bytes.load() != (1u << 20)) _exit(4);
    for (int i = 0; i < kEvents; ++i) {
      Event e{};
      e.kind = EventKind::kLaunch;
      e.func = static_cast<uint64_t>(i);
      e.grid[0] = 3;
      while (!s.ring.TryPush(e)) usleep(50);
    }
    s.memory_used_bytes.store(4096);
    s.launches.store(kEvents);
    _exit(0);
  }
  auto& ring = (*board)->board().slots[*slot].ring;
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
  EXPECT_EQ((*board)->board().slots[*slot].memory_used_bytes.load(), 4096u);
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
  auto board = BoardFile::Create(cfg.board_path);
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity peer = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  auto req = testing::MakeRequest(cfg.gpus[0].c_str(), contract::Priority::kBestEffort);
  auto a = state.Register(peer, req);
  ASSERT_EQ(a.status, contract::RegisterStatus::kOk);
  auto& ring = state.board().board().slots[a.slot].ring;
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
  auto board = BoardFile::Create(cfg.board_path);
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity peer = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  auto a = state.Register(peer, testing::MakeRequest(cfg.gpus[0].c_str(),
                                                     contract::Priority::kHigh));
  auto& ring = state.board().board().slots[a.slot].ring;
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
  EXPECT_EQ(snap.clients[0].busy_count, 1u);
  EXPECT_DOUBLE_EQ(snap.clients[0].busy_sum_s, 0.002);
}

}  // namespace
}  // namespace orion::server
