// Unit tests of the memory quota arithmetic, cuMemGetInfo virtualisation and allocation table.
#include "interpose/memory_quota.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

namespace orion::interpose {
namespace {

using contract::MemoryKind;

TEST(TryReserveTest, RespectsLimitAndTracksPeak) {
  std::atomic<uint64_t> used{0}, peak{0};
  EXPECT_TRUE(TryReserve(used, peak, 100, 60));
  EXPECT_FALSE(TryReserve(used, peak, 100, 41));  // would cross the limit
  EXPECT_EQ(used.load(), 60u);                    // rolled back exactly
  EXPECT_TRUE(TryReserve(used, peak, 100, 40));   // exactly at the limit is allowed
  EXPECT_EQ(peak.load(), 100u);
  Unreserve(used, 70);
  EXPECT_EQ(used.load(), 30u);
  EXPECT_EQ(peak.load(), 100u);
  Unreserve(used, 1000);  // never below zero
  EXPECT_EQ(used.load(), 0u);
}

TEST(TryReserveTest, ZeroLimitIsUnlimitedButOverflowRefused) {
  std::atomic<uint64_t> used{0}, peak{0};
  EXPECT_TRUE(TryReserve(used, peak, 0, 1ull << 50));
  EXPECT_FALSE(TryReserve(used, peak, 0, UINT64_MAX));
  EXPECT_EQ(used.load(), 1ull << 50);
}

// The pod's counter lives in shared memory that every process of the pod can write: whatever it
// holds, a reservation is decided by the limit, never wraps, and never loops for ever.
TEST(TryReserveTest, AWrittenOverCounterRefusesOrAdmitsByTheLimitAndNeverWraps) {
  std::atomic<uint64_t> used{UINT64_MAX - 5}, peak{0};
  EXPECT_FALSE(TryReserve(used, peak, 64, 16));  // huge: refused
  EXPECT_FALSE(TryReserve(used, peak, 0, 16));   // would wrap: refused even without a limit
  EXPECT_EQ(used.load(), UINT64_MAX - 5);        // untouched
  Unreserve(used, 16);                           // a free still gives back
  EXPECT_EQ(used.load(), UINT64_MAX - 21);
  used.store(1ull << 63);                        // "negative" if it were signed
  EXPECT_FALSE(TryReserve(used, peak, 1ull << 40, 1));
  used.store(0);                                 // written down: the pod's own gain, bounded
  EXPECT_TRUE(TryReserve(used, peak, 64, 64));   // by the limit still
  EXPECT_FALSE(TryReserve(used, peak, 64, 1));
}

TEST(TryReserveTest, ConcurrentReservationsNeverOvershoot) {
  std::atomic<uint64_t> used{0}, peak{0};
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        if (TryReserve(used, peak, 1000, 7)) granted.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(granted.load(), 1000 / 7);
  EXPECT_EQ(used.load(), static_cast<uint64_t>(granted.load()) * 7);
  EXPECT_LE(peak.load(), 1000u);
}

TEST(VirtualizeMemInfoTest, LimitIsTotalAndHeadroomCapsFree) {
  size_t free_bytes = 80ull << 30, total = 80ull << 30;
  VirtualizeMemInfo(4ull << 30, 1ull << 30, &free_bytes, &total);
  EXPECT_EQ(total, 4ull << 30);
  EXPECT_EQ(free_bytes, 3ull << 30);

  free_bytes = 1ull << 30;  // the real GPU is fuller than the quota's headroom
  total = 80ull << 30;
  VirtualizeMemInfo(4ull << 30, 1ull << 30, &free_bytes, &total);
  EXPECT_EQ(free_bytes, 1ull << 30);

  free_bytes = 5;
  VirtualizeMemInfo(10, 50, &free_bytes, &total);  // over the limit (limit lowered at run time)
  EXPECT_EQ(free_bytes, 0u);

  free_bytes = 123;
  total = 456;
  VirtualizeMemInfo(0, 50, &free_bytes, &total);  // unlimited: untouched
  EXPECT_EQ(free_bytes, 123u);
  EXPECT_EQ(total, 456u);
}

TEST(AllocationTableTest, InsertFindRemove) {
  auto table = std::make_unique<AllocationTable<64>>();
  EXPECT_TRUE(table->Insert(0x7f0000001000, 4096, MemoryKind::kDevice));
  EXPECT_TRUE(table->Insert(0x7f0000002000, 8192, MemoryKind::kManaged));
  EXPECT_FALSE(table->Insert(0, 1, MemoryKind::kDevice));
  AllocationTable<64>::Entry e{};
  ASSERT_TRUE(table->Find(0x7f0000002000, &e));
  EXPECT_EQ(e.bytes, 8192u);
  EXPECT_EQ(e.kind, MemoryKind::kManaged);
  ASSERT_TRUE(table->Remove(0x7f0000001000, &e));
  EXPECT_EQ(e.bytes, 4096u);
  EXPECT_FALSE(table->Remove(0x7f0000001000, &e));  // unknown frees pass through
  EXPECT_EQ(table->size(), 1u);
}

TEST(AllocationTableTest, FullTableRefusesAndRandomChurnMatchesReference) {
  auto table = std::make_unique<AllocationTable<256>>();
  std::unordered_map<uint64_t, uint64_t> reference;
  std::mt19937_64 rng(42);
  for (int step = 0; step < 200000; ++step) {
    const uint64_t key = ((rng() % 400) + 1) << 12;  // aligned like device pointers
    if (rng() % 2 == 0) {
      const uint64_t bytes = rng() % 100000;
      if (table->Insert(key, bytes, MemoryKind::kDevice)) {
        reference[key] = bytes;
      } else {
        ASSERT_EQ(reference.size(), AllocationTable<256>::kMaxLive);
        ASSERT_EQ(reference.count(key), 0u);
      }
    } else {
      AllocationTable<256>::Entry e{};
      const bool removed = table->Remove(key, &e);
      auto it = reference.find(key);
      ASSERT_EQ(removed, it != reference.end());
      if (removed) {
        ASSERT_EQ(e.bytes, it->second);
        reference.erase(it);
      }
    }
    ASSERT_EQ(table->size(), reference.size());
  }
  for (const auto& [key, bytes] : reference) {
    AllocationTable<256>::Entry e{};
    ASSERT_TRUE(table->Find(key, &e));
    EXPECT_EQ(e.bytes, bytes);
  }
}

TEST(AllocationTableTest, FullIsSeenBeforeAnInsertWouldFail) {
  AllocationTable<8> table;  // 7 live entries at most (7/8 of its slots)
  for (uint64_t k = 1; k <= 7; ++k) {
    EXPECT_FALSE(table.full());
    ASSERT_TRUE(table.Insert(k * 4096, k, MemoryKind::kDevice));
  }
  EXPECT_TRUE(table.full());
  EXPECT_FALSE(table.Insert(8 * 4096, 8, MemoryKind::kDevice));
  EXPECT_TRUE(table.Insert(7 * 4096, 70, MemoryKind::kDevice));  // an update still fits
  ASSERT_TRUE(table.Remove(4096, nullptr));
  EXPECT_FALSE(table.full());
}

TEST(ArrayBytesTest, CountsEveryTexelOfEveryLevel) {
  EXPECT_EQ(ArrayBytes(4, 4, 1024, 1024, 0, 1), 16ull << 20);  // 2D, depth 0 = 1
  EXPECT_EQ(ArrayBytes(1, 1, 100, 0, 0, 1), 100u);              // 1D
  EXPECT_EQ(ArrayBytes(2, 2, 8, 8, 6, 1), 2u * 2 * 8 * 8 * 6);   // layered or cubemap
  // Mip levels halve each dimension down to 1: 4x4 + 2x2 + 1x1, and no level past 1x1 counts.
  EXPECT_EQ(ArrayBytes(1, 1, 4, 4, 0, 3), 16u + 4 + 1);
  EXPECT_EQ(ArrayBytes(1, 1, 4, 4, 0, 30), 16u + 4 + 1);
  // Sizes a tenant makes up saturate instead of wrapping to a small count.
  EXPECT_EQ(ArrayBytes(4, 4, 1ull << 40, 1ull << 40, 1ull << 40, 1), 1ull << 62);
  EXPECT_EQ(ArrayBytes(4, 4, 1ull << 40, 1ull << 40, 1ull << 40, 40), 1ull << 62);
}

}  // namespace
}  // namespace orion::interpose
