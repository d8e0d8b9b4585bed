// Memory quota of one client: reservation arithmetic on the shared counters (its pod's quota area,
// which every process of the pod draws from, and its own area) and the table that remembers what
// each live allocation cost, so frees give back exactly what allocs took.
//
// Pure and allocation-free (fixed-size storage, a spin lock that only alloc/free paths take), so
// it is unit-tested without a GPU and never calls malloc inside the host process's CUDA calls.
//
// Usage:
//   if (!TryReserve(quota.used_bytes, quota.peak_bytes, limit, bytes)) deny();
//   if (real_alloc_failed) Unreserve(quota.used_bytes, bytes);
//   table.Insert(ptr, bytes, MemoryKind::kDevice);
//   ... AllocationTable::Entry e; if (table.Remove(ptr, &e)) Unreserve(quota.used_bytes, e.bytes);
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <initializer_list>

#include "contract/orion_contract.h"

namespace orion::interpose {

// Adds `bytes` to `used` unless that would cross `limit` (0 = unlimited) or wrap. On success
// raises `peak` to the new total. A compare-and-swap loop: the counter is only ever moved to a
// value checked against the limit, so concurrent reservations (threads, or the processes of one
// pod sharing the counter) cannot jointly overshoot, and a counter written over with garbage
// (a huge value, a wrapped one) refuses or admits by the limit, never crashes or wraps. The
// loop gives up (refuses) after kMaxReserveAttempts lost races: somebody keeps rewriting the
// counter, which only the pod's own processes can.
inline constexpr int kMaxReserveAttempts = 4096;
inline bool TryReserve(std::atomic<uint64_t>& used, std::atomic<uint64_t>& peak, uint64_t limit,
                       uint64_t bytes) {
  uint64_t seen = used.load(std::memory_order_relaxed);
  uint64_t after = 0;
  for (int attempt = 0;; ++attempt) {
    after = seen + bytes;
    if (after < seen || (limit != 0 && after > limit)) return false;
    if (used.compare_exchange_weak(seen, after, std::memory_order_acq_rel,
                                   std::memory_order_relaxed)) {
      break;
    }
    if (attempt >= kMaxReserveAttempts) return false;
  }
  uint64_t seen_peak = peak.load(std::memory_order_relaxed);
  while (after > seen_peak &&
         !peak.compare_exchange_weak(seen_peak, after, std::memory_order_relaxed)) {
  }
  return true;
}

// Gives back `bytes`, never going below zero (the counter lives in shared memory the server may
// have reset, or a process of the pod written over). Gives up after kMaxReserveAttempts lost
// races (somebody keeps rewriting the counter): the bytes then stay counted, the safe side.
inline void Unreserve(std::atomic<uint64_t>& used, uint64_t bytes) {
  uint64_t seen = used.load(std::memory_order_relaxed);
  for (int attempt = 0; attempt <= kMaxReserveAttempts; ++attempt) {
    const uint64_t next = seen > bytes ? seen - bytes : 0;
    if (used.compare_exchange_weak(seen, next, std::memory_order_acq_rel)) return;
  }
}

// What cuMemGetInfo reports under a quota: total = limit, free = min(real free, limit - used).
inline void VirtualizeMemInfo(uint64_t limit, uint64_t used, size_t* free_bytes,
                              size_t* total_bytes) {
  if (limit == 0) return;
  const uint64_t headroom = used >= limit ? 0 : limit - used;
  if (free_bytes != nullptr && *free_bytes > headroom) *free_bytes = static_cast<size_t>(headroom);
  if (total_bytes != nullptr) *total_bytes = static_cast<size_t>(limit);
}

// What a CUDA array or mipmapped array is counted at: width x height x depth (0 = 1) x channels
// x element bytes, summed over `levels` mip levels (each halves every dimension, down to 1). The
// driver's row padding is not included. Saturates at 2^62 (the driver refuses such sizes).
inline uint64_t ArrayBytes(uint64_t element_bytes, uint64_t channels, uint64_t width,
                           uint64_t height, uint64_t depth, uint32_t levels) {
  constexpr uint64_t kCap = 1ull << 62;
  uint64_t total = 0;
  auto at_least_1 = [](uint64_t v) { return v == 0 ? 1 : v; };
  uint64_t w = at_least_1(width), h = at_least_1(height), d = at_least_1(depth);
  const uint64_t texel = at_least_1(element_bytes) * at_least_1(channels);
  for (uint32_t level = 0; level < (levels == 0 ? 1 : levels); ++level) {
    uint64_t bytes = texel;
    for (uint64_t dim : {w, h, d}) {
      bytes = bytes > kCap / dim ? kCap : bytes * dim;
    }
    total = total > kCap - bytes ? kCap : total + bytes;
    if (w == 1 && h == 1 && d == 1) break;
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : 1;
    d = d > 1 ? d / 2 : 1;
  }
  return total;
}

// Open-addressing map key -> (bytes, kind, count, link) with linear probing and backward-shift deletion (no
// tombstones, so a long-running process never degrades). Key 0 means empty: CUDA never returns a
// null device pointer or handle for a successful allocation. It holds at most kMaxLive entries
// (7/8 of its slots): past that load linear probes grow long, and every alloc and free would
// crawl through them under the lock.
template <size_t kCapacity>
class AllocationTable {
  static_assert((kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");

 public:
  static constexpr size_t kMaxLive = kCapacity - kCapacity / 8;

  struct Entry {
    uint64_t key;
    uint64_t bytes;
    contract::MemoryKind kind;
    // VMM only (hooks_memory.cc): a handle's live mappings (in the kind's padding), and its
    // references (creation and retains less releases) or a mapping's handle.
    uint32_t count;
    uint64_t link;
  };

  // False when the table is full: a caller under a quota then gives the allocation back and
  // refuses it (see hooks_memory.cc), so nothing it holds goes uncounted.
  bool Insert(uint64_t key, uint64_t bytes, contract::MemoryKind kind, uint32_t count = 0,
              uint64_t link = 0) {
    if (key == 0) return false;
    Lock();
    bool stored = false;
    size_t i = Home(key);
    for (size_t probes = 0; probes < kCapacity; ++probes, i = (i + 1) & kMask) {
      if (entries_[i].key == 0 && size_ >= kMaxLive) break;  // full: a new key is refused
      if (entries_[i].key == 0 || entries_[i].key == key) {
        if (entries_[i].key == 0) ++size_;
        entries_[i] = Entry{key, bytes, kind, count, link};
        stored = true;
        break;
      }
    }
    Unlock();
    return stored;
  }

  bool Find(uint64_t key, Entry* out) {
    Lock();
    const size_t i = Locate(key);
    const bool found = i != kCapacity;
    if (found && out != nullptr) *out = entries_[i];
    Unlock();
    return found;
  }

  bool Remove(uint64_t key, Entry* out) {
    return Change(key, [](Entry&) { return true; }, out);
  }

  // Changes the entry of `key` in place under the table's lock; `change(entry)` returns true to
  // remove it. *out (if given) receives the entry as changed. False if there is none.
  template <typename ChangeFn>
  bool Change(uint64_t key, ChangeFn change, Entry* out) {
    Lock();
    const size_t i = Locate(key);
    const bool found = i != kCapacity;
    if (found) {
      const bool remove = change(entries_[i]);
      if (out != nullptr) *out = entries_[i];
      if (remove) RemoveAt(i);
    }
    Unlock();
    return found;
  }

  size_t size() const { return size_; }
  static constexpr size_t capacity() { return kMaxLive; }
  // Unlocked glance: a quota-holding caller refuses a new allocation rather than leave it
  // uncounted (an Insert can still fail in a race at the boundary; the caller handles that).
  bool full() const { return __atomic_load_n(&size_, __ATOMIC_RELAXED) >= kMaxLive; }

  // After fork: the lock may have been held by a thread that does not exist in the child.
  void ResetLockAfterFork() { lock_.store(0, std::memory_order_relaxed); }
  void Clear() {
    Lock();
    for (auto& e : entries_) e = Entry{0, 0, contract::MemoryKind::kDevice, 0, 0};
    size_ = 0;
    Unlock();
  }

 private:
  static constexpr size_t kMask = kCapacity - 1;

  static size_t Home(uint64_t key) {
    // Fibonacci hashing: device pointers are aligned, so the low bits alone cluster badly.
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & kMask;
  }
  size_t Locate(uint64_t key) const {
    if (key == 0) return kCapacity;
    size_t i = Home(key);
    for (size_t probes = 0; probes < kCapacity; ++probes, i = (i + 1) & kMask) {
      if (entries_[i].key == key) return i;
      if (entries_[i].key == 0) return kCapacity;
    }
    return kCapacity;
  }
  void Lock() {
    while (lock_.exchange(1, std::memory_order_acquire) != 0) {
      while (lock_.load(std::memory_order_relaxed) != 0) CpuRelax();
    }
  }
  void Unlock() { lock_.store(0, std::memory_order_release); }
  // Under the lock: empties slot i, pulling later members of its probe run into the hole
  // (backward shift).
  void RemoveAt(size_t i) {
    size_t hole = i;
    for (size_t j = (hole + 1) & kMask; entries_[j].key != 0; j = (j + 1) & kMask) {
      const size_t home = Home(entries_[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool home_after_hole = ((j - home) & kMask) < ((j - hole) & kMask);
      if (!home_after_hole) {
        entries_[hole] = entries_[j];
        hole = j;
      }
    }
    entries_[hole] = Entry{0, 0, contract::MemoryKind::kDevice, 0, 0};
    --size_;
  }
  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
  }

  std::atomic<uint32_t> lock_{0};
  size_t size_ = 0;
  Entry entries_[kCapacity] = {};
};

}  // namespace orion::interpose
