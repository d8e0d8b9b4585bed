// The completion records' pool: kPoolSize records in static storage and two lock-free queues of
// their indices, the free records and the records submitted to the poller. Launch threads take a
// free record and submit it (completion_tracker.cc); the poller pops the submitted ones
// (completion_poller.cc) and gives each back free once it is finished (completion_pipeline.cc).
// The pool and the queues are defined in completion_tracker.cc.
#pragma once

#include <stdint.h>

#include <atomic>

#include "interpose/completion_tracker.h"

namespace orion::interpose {

inline constexpr uint32_t kPoolSize = 1024;  // power of two; also the queues' capacity

// Bounded MPMC queue of record indices (sequence-numbered cells): push and pop are a CAS each,
// never a lock. Capacity equals the pool size, so a push of a pool index cannot fail.
class IndexQueue {
 public:
  void Reset(bool full) {
    for (uint32_t i = 0; i < kPoolSize; ++i) {
      cells_[i].seq.store(full ? i + 1 : i, std::memory_order_relaxed);
      cells_[i].value = i;
    }
    head_.store(0, std::memory_order_relaxed);
    tail_.store(full ? kPoolSize : 0, std::memory_order_relaxed);
  }
  bool Push(uint32_t value) {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[pos & (kPoolSize - 1)];
      const uint64_t seq = cell.seq.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq) - static_cast<int64_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          cell.value = value;
          cell.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }
  // How many it holds, give or take the pushes and pops under way.
  uint64_t SizeApprox() const {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    return tail > head ? tail - head : 0;
  }
  bool Pop(uint32_t* value) {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[pos & (kPoolSize - 1)];
      const uint64_t seq = cell.seq.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq) - static_cast<int64_t>(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          *value = cell.value;
          cell.seq.store(pos + kPoolSize, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

 private:
  struct Cell {
    std::atomic<uint64_t> seq;
    uint32_t value;
  };
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  Cell cells_[kPoolSize] = {};
};

// Hidden, like everything in the library, and declared so: the launch path addresses them
// directly (PC-relative), not through the GOT.
__attribute__((visibility("hidden"))) extern PendingLaunch g_pool[kPoolSize];
__attribute__((visibility("hidden"))) extern IndexQueue g_free;       // records nobody uses
__attribute__((visibility("hidden"))) extern IndexQueue g_submitted;  // records for the poller

inline uint32_t IndexOf(const PendingLaunch* p) { return static_cast<uint32_t>(p - g_pool); }

// Fewer than a quarter of the records are free: a process that times launches faster than the
// poller looks (profiling) would run out and time nothing more until the next look.
inline bool RecordsRunningShort() { return g_free.SizeApprox() < kPoolSize / 4; }

}  // namespace orion::interpose
