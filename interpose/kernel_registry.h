// Per-kernel knowledge of one process, keyed by CUfunction (or CUgraphExec): whether its name
// was already sent to the server, how often it launched (for 1-in-N timing samples) and its
// learned GPU duration (the launch gate's estimate).
//
// Lock-free: a fixed array with linear probing where a key is claimed by CAS and never removed,
// so the launch path does one hash probe and a few relaxed atomics, and takes no lock. When the
// array is full, unknown functions just get the defaults (no name, no samples, 50 us estimate).
//
// Usage:
//   KernelRecord* k = registry.FindOrInsert(reinterpret_cast<uint64_t>(func));
//   if (k && k->ClaimNameReport()) push kKernelName;
//   if (k && ShouldSample(k->NextLaunchIndex())) time this launch;
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <atomic>

namespace orion::interpose {

inline constexpr uint64_t kDefaultKernelEstimateNs = 50'000;

// First 3 launches of a kernel (warm-up samples: they teach the gate a duration at once, but run
// cold, so the server's estimates prefer later ones), then 1 in `every` (a power of two) chosen
// by a hash of the launch's index: a fixed stride would keep timing the same layer of a model
// that launches a kernel a few times per step, and the durations it learns (and the busy time
// counted from them) would be that layer's.
//
// A rate sparser than 1 in 64 learns first: 1 in 8 of a kernel's first 256 launches, so every
// kernel and each of its shapes has measured samples early, however rarely a request launches
// it. Without them, an eager ResNet50 service timed 1 in 256 read 1.056x the profiler's kernel
// time at 120 requests/s (a kernel launched once a request had a measured sample only every 256
// requests, and was drawn at its cold warm-up samples until then); with them, 0.996x and 0.998x
// at 120 and 40 requests/s (H100, docs/benchmarks.md).
//
// High-priority clients are timed 1 in 256 by default, best-effort ones 1 in 64. Each timed
// launch costs the launching thread two event records and a stream wait (about 3 us, against
// 0.2 us for an untimed launch), and a high-priority service's time is what a user measures;
// a best-effort trainer's samples also teach the gate its kernels' lengths, and a trainer timed
// more often read no closer (ORION_SAMPLE_EVERY=16). ORION_SAMPLE_EVERY and
// ORION_SAMPLE_EVERY_HIGH choose (env_config.h).
inline constexpr uint64_t kWarmupLaunches = 3;
inline constexpr uint64_t kLearningLaunches = 256;
inline constexpr uint64_t kLearningEvery = 8;
inline constexpr uint32_t kDefaultSampleEvery = 64;
inline constexpr uint32_t kDefaultSampleEveryHigh = 256;
inline bool ShouldSample(uint64_t launch_index, uint64_t every = kDefaultSampleEvery) {
  if (launch_index < kWarmupLaunches) return true;
  if (launch_index < kLearningLaunches && every > kDefaultSampleEvery) every = kLearningEvery;
  uint64_t z = launch_index + 0x9E3779B97F4A7C15ull;  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return ((z ^ (z >> 31)) & (every - 1)) == 0;
}

// Exponentially weighted moving average with weight 1/4 for the new sample; the first sample
// replaces the default.
inline uint64_t BlendEstimate(uint64_t old_ns, uint64_t sample_ns, bool first) {
  if (first) return sample_ns;
  return old_ns - old_ns / 4 + sample_ns / 4;
}

// A line of its own: 56 bytes packed straddled two lines for 6 records in 8, and a launch reads
// and writes its record's words.
struct alignas(64) KernelRecord {
  std::atomic<uint64_t> key;
  std::atomic<uint64_t> launches;
  std::atomic<uint64_t> estimate_ns;  // 0 = not measured yet
  std::atomic<uint32_t> name_reported;
  std::atomic<uint32_t> aux;  // graphs: kernel nodes counted at instantiation
  std::atomic<uint32_t> kclass;  // contract::KernelClass (board encoding) from the kernel's name
  std::atomic<uint32_t> communication;  // 1: a collective (contract::IsCommunicationKernelName)
  // Graphs: the mean of the uncontended samples timed behind queued work (0: none yet), for
  // the ones timed on an idle stream (sample_timing.h IdleGraphTiming).
  std::atomic<uint64_t> queued_ns;
  // Bit d: a timed launch of it went out on device d before (its first launch on a GPU may load
  // its module there and wait for its stream: never held for timing, timing_hold.h).
  std::atomic<uint64_t> devices;

  // The launch's index among the kernel's launches, for ShouldSample: a load and a store, not a
  // locked add (about 20 ns on the launch path). Threads launching one kernel at once may read
  // the same index: a sample more or less, never a wrong one.
  uint64_t NextLaunchIndex() {
    const uint64_t index = launches.load(std::memory_order_relaxed);
    launches.store(index + 1, std::memory_order_relaxed);
    return index;
  }

  // True exactly once per record, for the thread that should send the kernel's name.
  bool ClaimNameReport() {
    return name_reported.load(std::memory_order_relaxed) == 0 &&
           name_reported.exchange(1, std::memory_order_relaxed) == 0;
  }
  uint64_t EstimateNs() const {
    const uint64_t e = estimate_ns.load(std::memory_order_relaxed);
    return e == 0 ? kDefaultKernelEstimateNs : e;
  }
  void AddSample(uint64_t duration_ns) {
    uint64_t old = estimate_ns.load(std::memory_order_relaxed);
    const uint64_t next = BlendEstimate(old, duration_ns == 0 ? 1 : duration_ns, old == 0);
    // A lost race only drops one sample from the average.
    estimate_ns.compare_exchange_strong(old, next, std::memory_order_relaxed);
  }
  bool LaunchedOn(int device) const {
    return device >= 0 && device < 64 &&
           (devices.load(std::memory_order_relaxed) >> device & 1) != 0;
  }
  void NoteLaunchedOn(int device) {
    if (device < 0 || device >= 64) return;
    const uint64_t bit = uint64_t{1} << device;
    if ((devices.load(std::memory_order_relaxed) & bit) == 0) {
      devices.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  void AddQueuedSample(uint64_t duration_ns) {
    uint64_t old = queued_ns.load(std::memory_order_relaxed);
    queued_ns.compare_exchange_strong(
        old, BlendEstimate(old, duration_ns == 0 ? 1 : duration_ns, old == 0),
        std::memory_order_relaxed);
  }
};
static_assert(sizeof(KernelRecord) == 64);

template <size_t kCapacity>
class KernelRegistry {
  static_assert((kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");

 public:
  // Null for key 0 or a full table.
  KernelRecord* FindOrInsert(uint64_t key) {
    if (key == 0) return nullptr;
    size_t i = Home(key);
    for (size_t probes = 0; probes < kMaxProbes; ++probes, i = (i + 1) & (kCapacity - 1)) {
      KernelRecord& r = records_[i];
      uint64_t seen = r.key.load(std::memory_order_acquire);
      if (seen == key) return &r;
      if (seen == 0) {
        if (r.key.compare_exchange_strong(seen, key, std::memory_order_acq_rel)) return &r;
        if (seen == key) return &r;
      }
    }
    return nullptr;
  }

  KernelRecord* Find(uint64_t key) {
    if (key == 0) return nullptr;
    size_t i = Home(key);
    for (size_t probes = 0; probes < kMaxProbes; ++probes, i = (i + 1) & (kCapacity - 1)) {
      const uint64_t seen = records_[i].key.load(std::memory_order_acquire);
      if (seen == key) return &records_[i];
      if (seen == 0) return nullptr;
    }
    return nullptr;
  }

  // A new server knows no names: each is sent again on the record's next launch (safe while
  // other threads launch: at worst a name goes twice).
  void ForgetNameReports() {
    for (auto& r : records_) r.name_reported.store(0, std::memory_order_relaxed);
  }

  // Only when no other thread can use the registry (a fork child before any CUDA call).
  void Clear() {
    for (auto& r : records_) {
      r.key.store(0, std::memory_order_relaxed);
      r.launches.store(0, std::memory_order_relaxed);
      r.estimate_ns.store(0, std::memory_order_relaxed);
      r.name_reported.store(0, std::memory_order_relaxed);
      r.aux.store(0, std::memory_order_relaxed);
      r.kclass.store(0, std::memory_order_relaxed);
      r.communication.store(0, std::memory_order_relaxed);
      r.queued_ns.store(0, std::memory_order_relaxed);
      r.devices.store(0, std::memory_order_relaxed);
    }
  }

 private:
  static constexpr size_t kMaxProbes = 64;  // bounds the launch path on a crowded table
  static size_t Home(uint64_t key) {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 24) & (kCapacity - 1);
  }
  KernelRecord records_[kCapacity] = {};
};

}  // namespace orion::interpose
