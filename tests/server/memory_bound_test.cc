// The server's memory under hostile tenants: every client slot of the node taken, each client
// flooding its ring with ever-new kernels (long names, full p99 windows), graphs, streams and
// busy periods. Per-client state must grow with use only and stop at its tables' bounds, so the
// whole node stays well under the chart's 512 Mi limit. Prints the measured figures.
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "server/node_state.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Event;
using contract::EventKind;
using contract::Priority;

// This process's resident set (VmRSS), bytes.
uint64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Bytes the heap has handed out and not taken back.
uint64_t HeapBytes() { return mallinfo2().uordblks; }

constexpr double kMiB = 1024.0 * 1024.0;

// Pushes e into the client's ring, draining the node whenever the ring is full.
void Push(NodeState& state, contract::EventRing& ring, const Event& e) {
  while (!ring.TryPush(e)) state.DrainOnce(MonotonicNs());
}

// Everything a client can make the server keep, past each of the server's tables' bounds.
void Flood(NodeState& state, contract::EventRing& ring, uint32_t client) {
  const uint64_t base = static_cast<uint64_t>(client) << 32;
  const size_t kernels = KernelProfileBook::kMaxKernels + 256;
  for (uint64_t k = 0; k < kernels; ++k) {
    Event e{};
    e.func = base + 0x1000 + k;
    e.stream = base + k;  // ever-new streams too
    e.kind = EventKind::kKernelName;
    std::snprintf(e.name, sizeof(e.name),
                  "void at::native::elementwise_kernel_with_a_long_name_%u_%llu_xxxxxxxxxxxxxxxxx",
                  client, static_cast<unsigned long long>(k));
    Push(state, ring, e);
    e.kind = EventKind::kLaunch;
    e.grid[0] = e.grid[1] = e.grid[2] = 1;
    e.block[0] = e.block[1] = e.block[2] = 1;
    Push(state, ring, e);
    e.kind = EventKind::kKernelTime;
    e.duration_ns = 5000;
    for (size_t s = 0; s < KernelProfileBook::kRecent; ++s) Push(state, ring, e);  // full window
  }
  for (uint64_t g = 0; g < ClientIngest::kMaxGraphs + 256; ++g) {
    Event e{};
    e.kind = EventKind::kGraphLaunch;
    e.func = base + 0x100000000000ull + g;
    e.aux = 8;
    Push(state, ring, e);
  }
  for (uint32_t b = 0; b < 2 * 2000; ++b) {  // twice the busy-period window
    Event e{};
    e.kind = EventKind::kBusyPeriod;
    e.duration_ns = 1000 + b;
    Push(state, ring, e);
  }
  for (uint32_t r = 0; r < 64; ++r) {
    Event e{};
    e.kind = EventKind::kRange;
    e.duration_ns = 1000;
    std::snprintf(e.name, sizeof(e.name), "step_%u_%u", client, r);
    Push(state, ring, e);
  }
  while (ring.tail.load() != ring.head.load()) state.DrainOnce(MonotonicNs());
}

TEST(MemoryBoundTest, EveryClientSlotFloodingStaysUnderTheChartLimit) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.max_clients_per_pod = contract::kMaxSlots;
  cfg.max_clients_per_uid = contract::kMaxSlots;
  const uint64_t rss_start = RssBytes();
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity peer = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  std::vector<NodeState::Admission> clients;
  const uint64_t heap_before = HeapBytes();
  for (uint32_t i = 0; i < contract::kMaxSlots; ++i) {
    auto r = state.Register(peer, testing::MakeRequest(cfg.gpus[i % 2].c_str(),
                                                       i % 4 == 0 ? Priority::kHigh
                                                                  : Priority::kBestEffort));
    ASSERT_EQ(r.status, contract::RegisterStatus::kOk) << "client " << i;
    clients.push_back(r);
  }
  state.DrainOnce(MonotonicNs());
  const uint64_t heap_idle = HeapBytes();
  const uint64_t rss_idle = RssBytes();
  const double idle_heap_per_client =
      static_cast<double>(heap_idle - heap_before) / contract::kMaxSlots;

  for (uint32_t i = 0; i < clients.size(); ++i) {
    Flood(state, state.board().area(clients[i].slot)->ring, i);
  }
  const uint64_t heap_flooded = HeapBytes();
  const uint64_t rss_flooded = RssBytes();
  const double flooded_heap_per_client =
      static_cast<double>(heap_flooded - heap_idle) / contract::kMaxSlots;
  const MetricsSnapshot snap = state.Snapshot();

  std::printf("memory bound: RSS at start %.1f MiB; 256 idle clients %.1f MiB (heap %.1f KiB a "
              "client); 256 flooding clients %.1f MiB (heap %.2f MiB a client, %.1f MiB "
              "heap in all); events untabled %llu\n",
              rss_start / kMiB, rss_idle / kMiB, idle_heap_per_client / 1024.0,
              rss_flooded / kMiB, flooded_heap_per_client / kMiB,
              (heap_flooded - heap_before) / kMiB,
              static_cast<unsigned long long>(snap.events_untabled));

  // An idle client costs little: its ring (shared memory) and a few KiB of heap.
  EXPECT_LT(idle_heap_per_client, 64.0 * 1024);
  // A flooding client's heap stops at its tables' bounds (docs/security.md: 0.75 MiB).
  EXPECT_LT(flooded_heap_per_client, 0.75 * kMiB);
  // The whole process (test harness, 256 rings in shared memory, every client's state) stays
  // well under the chart's 512 Mi.
  EXPECT_LT(rss_flooded, static_cast<uint64_t>(320 * kMiB));
  // What went beyond the tables is counted: 256 kernels' worth of events and 256 graphs a client.
  const uint64_t per_client = 256 * (2 + KernelProfileBook::kRecent) + 256;
  EXPECT_EQ(snap.events_untabled, per_client * contract::kMaxSlots);
  for (const auto& c : clients) state.Unregister(c.client_id);
  EXPECT_EQ(state.Snapshot().events_untabled, per_client * contract::kMaxSlots);
}

}  // namespace
}  // namespace orion::server
