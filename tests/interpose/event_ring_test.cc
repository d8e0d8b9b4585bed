// The client event ring (contract/orion_contract.h) under concurrency: several interposer threads
// push while the server's drain pops, as in a real process. Every event arrives exactly once and
// in each producer's order, or is counted as dropped; nothing else. Also run under
// ThreadSanitizer (tools/sanitize.sh thread).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "contract/orion_contract.h"

namespace orion::contract {
namespace {

TEST(EventRingTest, ProducersAndDrainLoseNothingUncounted) {
  auto ring = std::make_unique<EventRing>();
  ring->Reset();
  constexpr int kProducers = 4;
  constexpr uint32_t kPerProducer = 50'000;
  std::atomic<bool> done{false};
  std::vector<uint32_t> next_expected(kProducers, 0);
  uint64_t popped = 0, out_of_order = 0;
  std::thread drain([&] {
    Event e{};
    for (;;) {
      const bool finished = done.load(std::memory_order_acquire);
      bool any = false;
      while (ring->TryPop(&e)) {
        any = true;
        ++popped;
        const uint32_t producer = e.aux;
        const uint32_t seq = static_cast<uint32_t>(e.duration_ns);
        // Drops leave gaps, but a producer's events never arrive out of order or twice.
        if (producer >= kProducers || seq < next_expected[producer]) {
          ++out_of_order;
        } else {
          next_expected[producer] = seq + 1;
        }
      }
      if (finished && !any) break;
      if (!any) std::this_thread::yield();
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      Event e{};
      e.kind = EventKind::kLaunch;
      e.aux = static_cast<uint32_t>(p);
      // Half the producers push launches' way: the words before the name only.
      const size_t bytes = p % 2 == 0 ? sizeof(Event) : kEventHeadBytes;
      for (uint32_t i = 0; i < kPerProducer; ++i) {
        e.duration_ns = i;
        ring->TryPush(e, bytes);
      }
    });
  }
  for (auto& t : producers) t.join();
  done.store(true, std::memory_order_release);
  drain.join();
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_EQ(popped + ring->dropped.load(), uint64_t{kProducers} * kPerProducer);
  EXPECT_EQ(ring->head.load(), popped);  // a drop claims no position
  EXPECT_EQ(ring->tail.load(), popped);
  EXPECT_FALSE(ring->HasPendingHole());
}

// The producers' cached tail: a full ring refuses, a drained one takes a whole ring again, and
// a tail_seen a tenant scribbled ahead of the real tail costs only its own events.
TEST(EventRingTest, CachedTailFollowsTheDrain) {
  auto ring = std::make_unique<EventRing>();
  ring->Reset();
  Event e{};
  e.kind = EventKind::kLaunch;
  for (int round = 0; round < 3; ++round) {
    for (uint32_t i = 0; i < kRingCapacity; ++i) {
      e.duration_ns = i;
      ASSERT_TRUE(ring->TryPush(e, kEventHeadBytes)) << "round " << round << " event " << i;
    }
    EXPECT_FALSE(ring->TryPush(e, kEventHeadBytes));
    Event out{};
    for (uint32_t i = 0; i < kRingCapacity; ++i) {
      ASSERT_TRUE(ring->TryPop(&out));
      EXPECT_EQ(out.duration_ns, i);
    }
    EXPECT_FALSE(ring->TryPop(&out));
  }
  EXPECT_EQ(ring->dropped.load(), 3u);
  ring->tail_seen.store(ring->head.load() + 5);  // ahead of the real tail: refreshed on need
  ASSERT_TRUE(ring->TryPush(e));
  Event out{};
  EXPECT_TRUE(ring->TryPop(&out));
}

// A push of the head only carries every field before the name; a named event still carries its
// name whole.
TEST(EventRingTest, HeadOnlyPushCarriesEveryFieldButTheName) {
  auto ring = std::make_unique<EventRing>();
  ring->Reset();
  Event named{};
  named.kind = EventKind::kKernelName;
  named.func = 7;
  std::snprintf(named.name, sizeof(named.name), "%s", "volta_sgemm_128x64_nn");
  ASSERT_TRUE(ring->TryPush(named));
  Event launch;
  std::memset(&launch, 0xAB, sizeof(launch));  // the name's bytes are not the producer's care
  launch.kind = EventKind::kLaunch;
  launch.aux = 3;
  launch.cpu_ns = 11;
  launch.func = 12;
  launch.stream = 13;
  launch.bytes = 0;
  launch.duration_ns = 0;
  launch.grid[0] = 1, launch.grid[1] = 2, launch.grid[2] = 3;
  launch.block[0] = 4, launch.block[1] = 5, launch.block[2] = 6;
  launch.shared_mem = 99;
  launch.flags = kTimedLaunch;
  ASSERT_TRUE(ring->TryPush(launch, kEventHeadBytes));
  Event out{};
  ASSERT_TRUE(ring->TryPop(&out));
  EXPECT_STREQ(out.name, "volta_sgemm_128x64_nn");
  ASSERT_TRUE(ring->TryPop(&out));
  EXPECT_EQ(std::memcmp(&out, &launch, kEventHeadBytes), 0);
}

// NextEntry, which the interposer prefetches for writing after each push, is the entry the next
// push writes, around the ring's end too; the prefetch changes nothing a consumer reads.
TEST(EventRingTest, NextEntryIsWhereTheNextPushWrites) {
  auto ring = std::make_unique<EventRing>();
  ring->Reset();
  const bool prefetch = EventRing::CanPrefetchNextEntry();
  Event e{};
  e.kind = EventKind::kLaunch;
  Event out{};
  for (uint32_t i = 0; i < kRingCapacity + 3; ++i) {
    const EventRing::Entry* next = &ring->NextEntry();
    EXPECT_EQ(next, &ring->entries[i % kRingCapacity]) << "push " << i;
    e.duration_ns = i;
    ASSERT_TRUE(ring->TryPush(e, kEventHeadBytes));
    if (prefetch) ring->PrefetchNextEntry();
    EXPECT_EQ(next->words[0].load(), i + 1u) << "push " << i << " published elsewhere";
    ASSERT_TRUE(ring->TryPop(&out));
    EXPECT_EQ(out.duration_ns, i);
  }
}

// A client's held time while a wait is in progress (PublishWaitStart, EndWait, HeldNs): the
// published wait counts from its start, moves into the finished waits when it ends and is never
// counted twice; an unpublished wait counts when it ends.
TEST(HeldTimeTest, AWaitInProgressShowsAndMovesIntoTheFinishedWaits) {
  ClientArea::Counters c{};
  EXPECT_EQ(HeldNs(c, 1'000), 0u);
  ASSERT_TRUE(PublishWaitStart(c, 100));
  EXPECT_FALSE(PublishWaitStart(c, 120));  // one published wait at a time
  EXPECT_EQ(HeldNs(c, 150), 50u);
  EXPECT_EQ(HeldNs(c, 90), 0u);  // a start after now: nothing in progress yet
  EndWait(c, 30, /*published=*/false);  // another thread's unpublished wait
  EXPECT_EQ(HeldNs(c, 150), 80u);
  EndWait(c, 60, /*published=*/true);  // the published wait, ended at 160
  EXPECT_EQ(c.waiting_since_ns.load(), 0u);
  EXPECT_EQ(HeldNs(c, 10'000), 90u);
  EXPECT_TRUE(PublishWaitStart(c, 200));  // free again
  // A wait being moved (or a tenant's mark): nothing in progress, the finished waits only.
  c.waiting_since_ns.store(kWaitEnding);
  EXPECT_EQ(HeldNs(c, 10'000), 90u);
  EXPECT_FALSE(PublishWaitStart(c, 300));
  ClientArea::Counters fresh{};
  EXPECT_FALSE(PublishWaitStart(fresh, 0));            // 0 is "none": never published
  EXPECT_FALSE(PublishWaitStart(fresh, kWaitEnding));  // nor the mark
}

TEST(HeldTimeTest, AReaderNeverCountsAWaitTwiceWhileWaitsEnd) {
  // One thread publishes wait after wait: wait i starts at i + 1 and lasts 1 ns. Another adds
  // unpublished waits of 0 ns all along (its adds continue the first one's release sequence).
  // Read at a far `now`, a published wait in progress shows finished (i) + now - (i + 1) =
  // now - 1, or less where the reader's finished waits lag the start it reads; with none in
  // progress, at most the number of waits. Counted twice (its start still seen after its add),
  // a wait would read now or more.
  ClientArea::Counters c{};
  constexpr uint64_t kNow = uint64_t{1} << 40;
  constexpr uint64_t kWaits = 2'000'000;
  std::atomic<bool> done{false};
  std::thread publisher([&] {
    for (uint64_t i = 0; i < kWaits; ++i) {
      const bool published = PublishWaitStart(c, i + 1);
      EndWait(c, 1, published);
    }
    done.store(true);
  });
  std::thread other([&] {
    while (!done.load()) EndWait(c, 0, /*published=*/false);
  });
  uint64_t reads = 0, bad = 0;
  while (!done.load()) {
    const uint64_t v = HeldNs(c, kNow);
    ++reads;
    if (v >= kNow) ++bad;
  }
  publisher.join();
  other.join();
  EXPECT_EQ(bad, 0u) << "of " << reads << " reads";
  EXPECT_EQ(HeldNs(c, kNow), kWaits);
}

}  // namespace
}  // namespace orion::contract
