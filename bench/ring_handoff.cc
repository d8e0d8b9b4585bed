// What a launch event's push into the event ring costs its thread where the consumer is another
// core, as orion-server's drain loop is: CPU only, no GPU, the real contract::EventRing.
//
// A producer thread pushes launch-sized events (contract::kEventHeadBytes) with `--gap-us` of
// its own work between them (reading a 64 KiB working set, as an application does between two
// launches); a consumer thread on another CPU reads what was published every millisecond, as the
// server does. The producer times each push together with the next locked instruction after it
// (an application's reference count, the driver's lock), which waits for the push's stores: a
// store to a line the consumer read waits for that line to come back. Three arms take turns in
// blocks of 256 pushes: no push (the timer's and the locked instruction's own cost), push, push
// with the next entry prefetched for writing (EventRing::PrefetchNextEntry, as the interposer
// does). One JSON line per arm:
//   orion-bench-ring [--pushes 60000] [--gap-us 4] [--producer-cpu 0] [--consumer-cpu 1]
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "contract/orion_contract.h"

namespace {

using orion::contract::Event;
using orion::contract::EventRing;

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

const char* const kArms[] = {"no push", "push", "push, next entry prefetched"};
constexpr int kArmCount = 3;
constexpr int kBlock = 256;
constexpr int kNoPrefetchExit = 77;  // nothing measured: the CPU cannot prefetch for writing

}  // namespace

int main(int argc, char** argv) {
  int pushes = 60000, producer_cpu = 0, consumer_cpu = 1;
  double gap_us = 4.0;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 == argc) {
      std::fprintf(stderr, "orion-bench-ring: %s needs a value\n", argv[i]);
      return 2;
    }
    if (flag == "--pushes") pushes = std::atoi(argv[i + 1]);
    else if (flag == "--gap-us") gap_us = std::atof(argv[i + 1]);
    else if (flag == "--producer-cpu") producer_cpu = std::atoi(argv[i + 1]);
    else if (flag == "--consumer-cpu") consumer_cpu = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "orion-bench-ring: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (pushes < kBlock * kArmCount || gap_us < 0 || gap_us > 1000) {
    std::fprintf(stderr, "orion-bench-ring: --pushes >= %d and --gap-us in [0, 1000]\n",
                 kBlock * kArmCount);
    return 2;
  }
  if (!EventRing::CanPrefetchNextEntry()) {
    std::fprintf(stderr, "orion-bench-ring: this CPU has no PREFETCHW (nothing to compare)\n");
    return kNoPrefetchExit;
  }
  std::unique_ptr<EventRing, void (*)(void*)> owner(
      static_cast<EventRing*>(std::aligned_alloc(64, sizeof(EventRing))), std::free);
  EventRing* ring = owner.get();
  std::memset(static_cast<void*>(ring), 0, sizeof(EventRing));
  if (!Pin(producer_cpu)) {
    std::fprintf(stderr, "orion-bench-ring: cannot run on CPU %d (--producer-cpu)\n", producer_cpu);
    return 2;
  }
  std::atomic<bool> stop{false};
  std::atomic<int> consumer_state{0};  // 1: pinned and reading, 2: could not be pinned
  std::thread consumer([&] {
    if (!Pin(consumer_cpu)) {
      consumer_state.store(2);
      return;
    }
    consumer_state.store(1);
    uint64_t pos = 0;
    Event e;
    while (!stop.load(std::memory_order_relaxed)) {
      while (ring->ReadAt(pos, &e)) {
        ++pos;
        ring->tail.store(pos, std::memory_order_release);
      }
      timespec ms{0, 1'000'000};
      nanosleep(&ms, nullptr);
    }
  });
  while (consumer_state.load() == 0) std::this_thread::yield();
  if (consumer_state.load() == 2) {
    consumer.join();
    std::fprintf(stderr, "orion-bench-ring: cannot run on CPU %d (--consumer-cpu)\n", consumer_cpu);
    return 2;
  }

  std::vector<uint64_t> work(8192);  // 64 KiB: the application's own data between launches
  for (size_t i = 0; i < work.size(); ++i) work[i] = i;
  std::atomic<uint64_t> refcount{0};
  Event ev{};
  ev.kind = orion::contract::EventKind::kLaunch;
  std::vector<std::vector<uint32_t>> ticks(kArmCount);
  // TSC ticks per ns, from the whole run.
  const uint64_t tsc0 = __rdtsc(), ns0 = NowNs();
  uint64_t sink = 0;
  for (int i = 0; i < pushes; ++i) {
    const int arm = (i / kBlock) % kArmCount;
    ev.cpu_ns = static_cast<uint64_t>(i);
    ev.func = 0x1000 + static_cast<uint64_t>(i % 200);
    _mm_lfence();
    const uint64_t a = __rdtsc();
    _mm_lfence();
    if (arm != 0) ring->TryPush(ev, orion::contract::kEventHeadBytes);
    if (arm == 2) ring->PrefetchNextEntry();
    refcount.fetch_add(1, std::memory_order_acq_rel);  // the next locked instruction
    _mm_lfence();
    ticks[arm].push_back(static_cast<uint32_t>(__rdtsc() - a));
    // The application's work up to its next launch.
    const uint64_t until = NowNs() + static_cast<uint64_t>(gap_us * 1000);
    for (uint64_t k = 0; NowNs() < until; ++k) {
      for (int j = 0; j < 64; ++j) sink += work[(k * 67 + static_cast<uint64_t>(j) * 131) & 8191];
    }
  }
  const double tsc_per_ns = static_cast<double>(__rdtsc() - tsc0) / static_cast<double>(NowNs() - ns0);
  stop.store(true);
  consumer.join();

  double base_mean = 0;
  for (int arm = 0; arm < kArmCount; ++arm) {
    std::vector<uint32_t>& t = ticks[arm];
    std::sort(t.begin(), t.end());
    double mean = 0;
    for (uint32_t x : t) mean += x;
    mean = mean / static_cast<double>(t.size()) / tsc_per_ns;
    if (arm == 0) base_mean = mean;
    auto at = [&](double q) { return t[static_cast<size_t>(q * static_cast<double>(t.size() - 1))] / tsc_per_ns; };
    std::printf("{\"arm\": \"%s\", \"pushes\": %zu, \"gap_us\": %.1f, \"producer_cpu\": %d, "
                "\"consumer_cpu\": %d, \"p50_ns\": %.1f, \"p90_ns\": %.1f, \"p99_ns\": %.1f, "
                "\"mean_ns\": %.1f, \"mean_over_no_push_ns\": %.1f, \"dropped\": %llu, "
                "\"sink\": %llu}\n",
                kArms[arm], t.size(), gap_us, producer_cpu, consumer_cpu, at(0.5), at(0.9),
                at(0.99), mean, mean - base_mean,
                static_cast<unsigned long long>(ring->dropped.load()),
                static_cast<unsigned long long>(sink & 1));
  }
  return 0;
}
