// Hostile tenants against the drain loop: rings flooded with ever-new kernel names that almost
// match the classifier's patterns, and rings whose indices are rewound and written over. The
// node's protection must hold: the board heartbeat stays fresh, a registration and an admin call
// answer quickly, each pass reads at most a ring's worth a client, and a ring written over
// repeatedly is quarantined (counted in /metrics and shown in the admin API).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "orion/v1/admin.grpc.pb.h"
#include "tests/http_get.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Event;
using contract::EventKind;
using contract::Priority;

// A kernel name no earlier event carried, close to the classifier's patterns so each scan runs
// long ("gemm" -> "gemx", "conv" -> "conx", ...).
void NearMissName(uint64_t n, char* out) {
  std::snprintf(out, contract::kKernelNameBytes,
                "gemxconxxmmxcutlasxmatmuxwgraxdgraxfproxflasxattentioxsm90xwinograx%011llu",
                static_cast<unsigned long long>(n));
}

// Publishes a ring's worth of name events at positions [0, capacity) without moving head, so
// rewinding tail and head replays them (what a tenant that writes its ring's indices can do).
void PrimeReplayableRing(contract::EventRing& ring, uint64_t* counter) {
  for (uint64_t pos = 0; pos < contract::kRingCapacity; ++pos) {
    Event e{};
    e.kind = EventKind::kKernelName;
    e.func = 0x1000 + (pos & 63);
    NearMissName((*counter)++, e.name);
    uint64_t raw[contract::kEventWords - 1] = {};
    std::memcpy(raw, &e, sizeof(Event));
    auto& entry = ring.entries[pos];
    for (size_t i = 0; i + 1 < contract::kEventWords; ++i) entry.words[i + 1].store(raw[i]);
    entry.words[0].store(pos + 1);
  }
}

TEST(DrainBoundsTest, RewoundRingIsReadAtMostOnceAPassThenQuarantined) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity peer = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  auto a = state.Register(peer, testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kBestEffort));
  ASSERT_EQ(a.status, contract::RegisterStatus::kOk);
  auto& ring = state.board().area(a.slot)->ring;
  uint64_t counter = 0;
  PrimeReplayableRing(ring, &counter);
  ring.head.store(contract::kRingCapacity);
  // The first pass reads the ring's worth once, not one entry per re-read of a rewound tail.
  EXPECT_EQ(state.DrainOnce(MonotonicNs()), contract::kRingCapacity);
  // Each later pass finds tail rewound (the server puts it back) and reads nothing again.
  for (uint32_t i = 0; i < NodeState::kRingStrikesToQuarantine; ++i) {
    ring.tail.store(0);
    EXPECT_EQ(state.DrainOnce(MonotonicNs()), 0u) << "pass " << i;
    EXPECT_EQ(ring.tail.load(), contract::kRingCapacity);
  }
  absl::StatusOr<ClientView> view = state.GetClient(a.client_id);
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view->quarantined);
  // Quarantined: what it writes from now on is dropped unread, and counted.
  Event e{};
  e.kind = EventKind::kLaunch;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(ring.TryPush(e));
  EXPECT_EQ(state.DrainOnce(MonotonicNs()), 0u);
  const MetricsSnapshot snap = state.Snapshot();
  EXPECT_EQ(snap.events_quarantined, 10u);
  EXPECT_EQ(snap.clients_quarantined, 1u);
  EXPECT_EQ(state.GetClient(a.client_id)->events_quarantined, 10u);
}

TEST(DrainBoundsTest, GarbageHeadIsClampedToARingsWorth) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  auto board = NodeBoard::Create();
  ASSERT_TRUE(board.ok());
  NodeState state(cfg, std::move(*board));
  PeerIdentity peer = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  auto a = state.Register(peer, testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kBestEffort));
  ASSERT_EQ(a.status, contract::RegisterStatus::kOk);
  auto& ring = state.board().area(a.slot)->ring;
  ring.head.store(~0ull - 5);
  EXPECT_EQ(state.DrainOnce(MonotonicNs()), 0u);
  EXPECT_EQ(state.Snapshot().events_skipped, contract::kRingCapacity);
  // The server reads on from where head was; honest events behind it arrive.
  Event e{};
  e.kind = EventKind::kLaunch;
  ASSERT_TRUE(ring.TryPush(e));
  EXPECT_EQ(state.DrainOnce(MonotonicNs()), 1u);
  EXPECT_FALSE(state.GetClient(a.client_id)->quarantined);  // one strike is not enough
}

TEST(DrainBoundsTest, KernelNamesAreClassifiedOnce) {
  KernelProfileBook book;
  for (int i = 0; i < 1000; ++i) {
    book.OnName(1 + (i % 7), (i % 2) ? "gemxconx_near_miss_a" : "gemxconx_near_miss_b");
  }
  EXPECT_EQ(book.classifications(), 2u);
  // Ever-new names cost one classification each, and the cache stays bounded.
  for (size_t i = 0; i < 2 * KernelProfileBook::kMaxClassifiedNames; ++i) {
    book.OnName(1, "near_miss_" + std::to_string(i));
  }
  EXPECT_EQ(book.classifications(), 2u + 2 * KernelProfileBook::kMaxClassifiedNames);
}

// 64 tenants attack at once while the test watches the heartbeat and times a registration and
// an admin call: half flood their rings with ever-new near-miss kernel names through the
// protocol, half rewind their ring's indices over a ring's worth of published names.
TEST(DrainBoundsTest, SixtyFourHostileTenantsCannotStallTheNode) {
  constexpr int kTenants = 64;
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  cfg.max_clients_per_uid = 0;  // every tenant here is this process's uid
  auto server = testing::StartServer(cfg);
  ASSERT_NE(server, nullptr);
  std::vector<testing::ClientMaps> maps(kTenants);
  std::vector<int> socks;
  for (int i = 0; i < kTenants; ++i) {
    contract::RegisterReply reply{};
    const int fd = testing::RegisterClient(
        cfg.socket_path, testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kBestEffort),
        &reply, &maps[i]);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(reply.status, 0u) << reply.message;
    ASSERT_NE(maps[i].area, nullptr);
    socks.push_back(fd);
  }
  const contract::Board* board = maps[0].board;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> attacks{0};
  std::thread attacker([&] {
    uint64_t counter = 0;
    for (int i = 1; i < kTenants; i += 2) PrimeReplayableRing(maps[i].area->ring, &counter);
    while (!stop.load()) {
      for (int i = 0; i < kTenants; ++i) {
        auto& ring = maps[i].area->ring;
        if (i % 2 == 0) {
          Event e{};
          e.kind = EventKind::kKernelName;
          for (int k = 0; k < 256; ++k) {
            e.func = 0x2000 + (counter & 1023);
            NearMissName(counter++, e.name);
            if (!ring.TryPush(e)) break;
          }
        } else {
          ring.tail.store(0);
          ring.head.store(contract::kRingCapacity);
        }
      }
      attacks.fetch_add(1);
      sched_yield();
    }
  });

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->admin_port()),
                                     grpc::InsecureChannelCredentials());
  auto admin = orion::v1::Admin::NewStub(channel);
  {  // the channel connected before the attack is timed
    grpc::ClientContext ctx;
    orion::v1::ListClientsResponse resp;
    ASSERT_TRUE(admin->ListClients(&ctx, {}, &resp).ok());
  }
  const uint64_t start = MonotonicNs();
  int64_t max_stale_ns = 0;
  uint64_t max_register_ns = 0, max_admin_ns = 0;
  int probes = 0;
  while (MonotonicNs() - start < 2'000'000'000ull) {
    const int64_t stale = static_cast<int64_t>(MonotonicNs()) -
                          static_cast<int64_t>(board->header.server_heartbeat_ns.load());
    max_stale_ns = std::max(max_stale_ns, stale);
    if (probes < 10 && MonotonicNs() - start > (probes + 1) * 150'000'000ull) {
      ++probes;
      uint64_t t0 = MonotonicNs();
      contract::RegisterReply reply{};
      const int fd = testing::RegisterClient(
          cfg.socket_path, testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kHigh), &reply);
      max_register_ns = std::max(max_register_ns, MonotonicNs() - t0);
      ASSERT_GE(fd, 0);
      EXPECT_EQ(reply.status, 0u) << reply.message;
      close(fd);
      t0 = MonotonicNs();
      grpc::ClientContext ctx;
      orion::v1::ListClientsResponse resp;
      ASSERT_TRUE(admin->ListClients(&ctx, {}, &resp).ok());
      max_admin_ns = std::max(max_admin_ns, MonotonicNs() - t0);
    }
    usleep(1000);  // a sample a millisecond
  }
  stop = true;
  attacker.join();
  const MetricsSnapshot snap = server->state().Snapshot();
  std::printf("64 hostile tenants, 2 s: heartbeat max staleness %.1f ms, registration max %.1f "
              "ms, ListClients max %.1f ms (%d probes); %llu attack rounds, %llu events "
              "ingested, %llu quarantined, %llu clients quarantined\n",
              max_stale_ns / 1e6, max_register_ns / 1e6, max_admin_ns / 1e6, probes,
              static_cast<unsigned long long>(attacks.load()),
              static_cast<unsigned long long>(snap.events_ingested),
              static_cast<unsigned long long>(snap.events_quarantined),
              static_cast<unsigned long long>(snap.clients_quarantined));
  EXPECT_EQ(probes, 10);
  // The goal is 100 ms (15 to 50 ms measured on an idle 2-core machine); the assertion leaves
  // room for a CI machine running other suites beside this one (113 ms seen with two compilers
  // on its 2 cores). A drain that holds the heartbeat back made it 1.3 to 4.5 s stale.
  EXPECT_LT(max_stale_ns, 250'000'000);
  EXPECT_LT(max_register_ns, 50'000'000u);
  EXPECT_LT(max_admin_ns, 50'000'000u);
  EXPECT_GT(snap.events_ingested, 0u);
  // Every rewinding tenant is quarantined (after 4 passes each); the flooders (honest protocol)
  // are not.
  ASSERT_TRUE(testing::WaitFor([&] {
    for (int i = 1; i < kTenants; i += 2) maps[i].area->ring.tail.store(0);
    return server->state().Snapshot().clients_quarantined >= kTenants / 2;
  }, 20000));
  EXPECT_EQ(server->state().Snapshot().clients_quarantined, static_cast<uint64_t>(kTenants / 2));
  grpc::ClientContext ctx;
  orion::v1::ListClientsResponse resp;
  ASSERT_TRUE(admin->ListClients(&ctx, {}, &resp).ok());
  int shown = 0;
  for (const auto& c : resp.clients()) shown += c.quarantined() ? 1 : 0;
  EXPECT_EQ(shown, kTenants / 2);
  const std::string metrics =
      orion::testing::HttpGet(server->metrics_port(), "/metrics");
  EXPECT_NE(metrics.find("orion_clients_quarantined_total{node=\"test-node\"} 32"),
            std::string::npos);
  EXPECT_NE(metrics.find("orion_events_quarantined_total"), std::string::npos);
  for (int fd : socks) close(fd);
}

}  // namespace
}  // namespace orion::server
