// The client event ring (contract/orion_contract.h) under concurrency: several interposer threads
// push while the server's drain pops, as in a real process. Every event arrives exactly once and
// in each producer's order, or is counted as dropped; nothing else. Also run under
// ThreadSanitizer (tools/sanitize.sh thread).
#include <gtest/gtest.h>

#include <atomic>
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
      for (uint32_t i = 0; i < kPerProducer; ++i) {
        e.duration_ns = i;
        ring->TryPush(e);
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

}  // namespace
}  // namespace orion::contract
