// orion-bench-launch: the CPU cost of one kernel launch, alone and with each extra driver call
// the interposer makes around a tracked launch (current context, capture check, completion
// event), and while another thread polls completion events the way the interposer's poller does.
// Run it plain and under orion-run to see what the interposer adds:
//   orion-bench-launch [--launches N]
//   orion-run --priority high -- orion-bench-launch
// Prints one line per variant: "name ns_per_launch=.." (the best of 5 batches of N launches of an
// empty kernel; only the launch calls are timed, the GPU is drained between groups of 64).
// Then the paired figure, which resolves what an interposer adds inside one process: groups of 64
// launches through the linked cuLaunchKernel (the interposer's, when one is preloaded) and through
// the driver's own entry point, alternating group by group (--pairs pairs, the order flipping
// every pair), each pair's difference per launch; prints
// "paired interposed_ns=.. driver_ns=.. adds_ns=.. ci_low=.. ci_high=.. pairs=.." (medians; the
// 95% confidence interval of the median difference). Without an interposer both paths are the
// driver's, so the line is an A/A control: how finely the host resolves a difference.
// --pollute KB runs the paired figure with the caches cold, as a launch finds them between a
// framework's own work: before every launch (untimed) it writes KB of memory, and each launch is
// timed alone; the line then ends "pollute_kb=KB". --kernels N launches N distinct kernels in
// turn (orion_spin loaded N times under N names), as a framework's forward pass launches its own
// kernels once each: the interposer then finds each kernel's record as cold as the kernel's turn
// is far; the line then ends "kernels=N". --pair-switch WORD pairs the interposer with itself:
// the second path is the linked cuLaunchKernel again, with the benchmark switch (the file that
// ORION_BENCH_SWITCH names, which the interposer maps) set to WORD during its groups and to 0
// (as usual) during the first path's, so "adds" is what the part WORD leaves out costs, inside
// one process; the line then ends "pair_switch=WORD". --segments K prints the paired line K times
// in a row, each of --pairs pairs and ending "segment=I": how far a process's speed moves over its
// life. --memory-latency MB then times loads that miss, as the process finds its memory: a chase
// of dependent loads through one random cycle over every cache line of 1 MB (a core's own cache),
// 64 MB (the shared cache) and MB (past it), printing "memory l2_before_ns=.. l2_ns=..
// shared_ns=.. far_ns=.. mb=MB" (ns per load; the 1 MB chase also before the paired figure), so
// a process that launches slowly can be told apart from one whose loads are slow. --no-polled
// leaves out the variant with a polling thread, whose work grows with the run's time rather than
// its launches (launch-instructions counts instructions per launch).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "samples/sample_common.h"

namespace {

using orion::samples::Gpu;
using orion::samples::NowNs;

struct Extras {
  bool ctx = false;        // cuCtxGetCurrent before the launch
  bool capturing = false;  // cuStreamIsCapturing before the launch
  bool event = false;      // cuEventRecord after the launch
};

constexpr int kGroup = 64;
constexpr int kEvents = 1024;
constexpr size_t kSteadyLaunches = 1024;

double NsPerLaunch(const Gpu& gpu, CUstream stream, CUevent* events, int launches, Extras x) {
  unsigned long long zero = 0;
  void* args[] = {&zero};
  double best = 1e30;
  for (int batch = 0; batch < 5; ++batch) {
    uint64_t timed_ns = 0;
    for (int done = 0; done < launches; done += kGroup) {
      const uint64_t t0 = NowNs();
      for (int i = 0; i < kGroup; ++i) {
        if (x.ctx) {
          CUcontext c;
          ORION_CHECK_CU(cuCtxGetCurrent(&c));
        }
        if (x.capturing) {
          CUstreamCaptureStatus s;
          ORION_CHECK_CU(cuStreamIsCapturing(stream, &s));
        }
        ORION_CHECK_CU(cuLaunchKernel(gpu.spin, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
        if (x.event) ORION_CHECK_CU(cuEventRecord(events[(done + i) % kEvents], stream));
      }
      timed_ns += NowNs() - t0;
      ORION_CHECK_CU(cuStreamSynchronize(stream));
    }
    const int rounded = (launches + kGroup - 1) / kGroup * kGroup;
    best = std::min(best, static_cast<double>(timed_ns) / rounded);
  }
  return best;
}

using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void**, void**);

// The driver's own cuLaunchKernel, past any interposer: glibc's dlsym (found by version through
// dlvsym, which interposers leave alone) asked for the symbol in the loaded libcuda.so.1.
LaunchFn DriverLaunch() {
  using Dlsym = void* (*)(void*, const char*);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr || cuda == nullptr) return nullptr;
  auto real_dlsym = reinterpret_cast<Dlsym>(dlvsym(libc, "dlsym", "GLIBC_2.34"));
  if (real_dlsym == nullptr) real_dlsym = reinterpret_cast<Dlsym>(dlvsym(libc, "dlsym", "GLIBC_2.2.5"));
  if (real_dlsym == nullptr) return nullptr;
  return reinterpret_cast<LaunchFn>(real_dlsym(cuda, "cuLaunchKernel"));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Writes one byte of every cache line of `buf`: what the next launch finds of its caches.
void Pollute(std::vector<unsigned char>& buf) {
  for (size_t i = 0; i < buf.size(); i += 64) buf[i] = static_cast<unsigned char>(buf[i] + 1);
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

// The benchmark switch's word for --pair-switch: the file ORION_BENCH_SWITCH names, mapped
// shared and writable (the interposer maps it read-only and reads it at every launch).
std::atomic<uint32_t>* MapPairSwitch() {
  const char* path = getenv("ORION_BENCH_SWITCH");
  if (path == nullptr || path[0] == '\0') {
    fprintf(stderr, "orion-bench-launch: --pair-switch needs ORION_BENCH_SWITCH (a 4-byte file)\n");
    exit(2);
  }
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  void* addr = fd < 0 ? MAP_FAILED
                      : mmap(nullptr, sizeof(uint32_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (addr == MAP_FAILED) {
    fprintf(stderr, "orion-bench-launch: cannot map ORION_BENCH_SWITCH=%s for writing\n", path);
    exit(2);
  }
  return static_cast<std::atomic<uint32_t>*>(addr);
}

// `pair_switch` null: the second path is the driver's own entry point; else the linked entry
// again with *pair_switch set to `word` during its groups (0 during the first path's).
void PrintPaired(const Gpu& gpu, CUstream stream, int pairs, int64_t pollute_kb,
                 const std::vector<CUfunction>& kernels, std::atomic<uint32_t>* pair_switch,
                 uint32_t word, int segment) {
  const LaunchFn driver = pair_switch != nullptr ? nullptr : DriverLaunch();
  if (pair_switch == nullptr && driver == nullptr) {
    fprintf(stderr, "orion-bench-launch: the driver's cuLaunchKernel was not found; no paired line\n");
    return;
  }
  unsigned long long zero = 0;
  void* args[] = {&zero};
  std::vector<unsigned char> dirt(static_cast<size_t>(pollute_kb) * 1024);
  size_t turn = 0;  // the next kernel of `kernels`, in turn across groups and both paths
  auto launch = [&](bool through_driver) {
    CUfunction f = kernels[turn++ % kernels.size()];
    ORION_CHECK_CU(through_driver && driver != nullptr
                       ? driver(f, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr)
                       : cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
  };
  auto group_ns = [&](bool through_driver) {
    if (pair_switch != nullptr) pair_switch->store(through_driver ? word : 0);
    uint64_t took = 0;
    if (dirt.empty()) {
      const uint64_t t0 = NowNs();
      for (int i = 0; i < kGroup; ++i) launch(through_driver);
      took = NowNs() - t0;
    } else {
      for (int i = 0; i < kGroup; ++i) {
        Pollute(dirt);
        const uint64_t t0 = NowNs();
        launch(through_driver);
        took += NowNs() - t0;
      }
    }
    ORION_CHECK_CU(cuStreamSynchronize(stream));
    if (pair_switch != nullptr) pair_switch->store(0);
    return static_cast<double>(took) / kGroup;
  };
  // First each kernel is launched as often as a service that has run for minutes launched it
  // (kSteadyLaunches), so the pairs see the interposer's steady state and not a new kernel's
  // first launches (which it times more often, to learn them).
  for (size_t i = 0; i < kernels.size() * kSteadyLaunches; i += kGroup) {
    for (int j = 0; j < kGroup; ++j) launch(false);
    ORION_CHECK_CU(cuStreamSynchronize(stream));
  }
  std::vector<double> linked, direct, diffs;
  for (int p = 0; p < pairs; ++p) {
    const bool driver_first = (p & 1) != 0;
    const double first = group_ns(driver_first);
    const double second = group_ns(!driver_first);
    const double l = driver_first ? second : first;
    const double d = driver_first ? first : second;
    linked.push_back(l);
    direct.push_back(d);
    diffs.push_back(l - d);
  }
  // The median's 95% interval from order statistics (the sign-test interval, no distribution
  // assumed): ranks n/2 -+ 1.96 sqrt(n)/2.
  std::vector<double> sorted = diffs;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double half = 1.96 * std::sqrt(static_cast<double>(n)) / 2;
  const size_t lo = static_cast<size_t>(std::max(0.0, std::floor(n / 2.0 - half)));
  const size_t hi = std::min(n - 1, static_cast<size_t>(std::ceil(n / 2.0 + half)));
  printf("paired interposed_ns=%.1f driver_ns=%.1f adds_ns=%.1f ci_low=%.1f ci_high=%.1f pairs=%d",
         Median(linked), Median(direct), Median(diffs), sorted[lo], sorted[hi], pairs);
  if (pollute_kb > 0) printf(" pollute_kb=%lld", static_cast<long long>(pollute_kb));
  if (kernels.size() > 1) printf(" kernels=%zu", kernels.size());
  if (pair_switch != nullptr) printf(" pair_switch=%u", word);
  if (segment > 0) printf(" segment=%d", segment);
  printf("\n");
  fflush(stdout);
}

// ns per load of a chase of dependent loads through one random cycle (Sattolo's) over every
// 64-byte line of `bytes` of fresh memory: one line each, `loads` of them after one lap's warm-up.
double ChaseNs(size_t bytes, size_t loads) {
  const size_t lines = bytes / 64;
  std::vector<uint32_t> order(lines);
  for (size_t i = 0; i < lines; ++i) order[i] = static_cast<uint32_t>(i);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (size_t i = lines - 1; i > 0; --i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(order[i], order[(seed >> 33) % i]);  // j < i: one cycle through every line
  }
  struct alignas(64) Line {
    const Line* next;
    char pad[56];
  };
  std::vector<Line> memory(lines);
  for (size_t i = 0; i < lines; ++i) memory[i].next = &memory[order[i]];
  const Line* at = &memory[0];
  for (size_t i = 0; i < std::min(lines, loads); ++i) at = at->next;
  const uint64_t t0 = NowNs();
  for (size_t i = 0; i < loads; ++i) at = at->next;
  const uint64_t t1 = NowNs();
  return at == nullptr ? 0 : static_cast<double>(t1 - t0) / static_cast<double>(loads);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t launches = 20000;
  orion::samples::Flags flags("orion-bench-launch", "CPU cost of a kernel launch and its extras");
  int64_t pairs = 2000;
  flags.AddInt("launches", &launches, "launches per batch (best of 5 batches)");
  flags.AddInt("pairs", &pairs, "pairs of 64-launch groups for the paired line (0: none)");
  int64_t pollute_kb = 0;
  flags.AddInt("pollute", &pollute_kb,
               "KB of memory written before every launch of the paired line (0: caches warm)");
  int64_t kernel_count = 1;
  flags.AddInt("kernels", &kernel_count,
               "distinct kernels the paired line launches in turn (1: the same one each time)");
  int64_t pair_switch = -1;
  flags.AddInt("pair-switch", &pair_switch,
               "the paired line against the interposer itself with this benchmark switch word");
  int64_t segments = 1;
  flags.AddInt("segments", &segments,
               "the paired line this many times in a row, each of --pairs pairs (a process's "
               "speed over its life)");
  int64_t memory_mb = 0;
  flags.AddInt("memory-latency", &memory_mb,
               "then time loads that miss: a chase through 1 MB, 64 MB and this many MB (0: none)");
  bool no_polled = false;
  flags.AddBool("no-polled", &no_polled,
                "leave out the variant with a second thread polling events every 20 us");
  flags.Parse(argc, argv);
  if (launches <= 0) flags.Usage(1, "--launches must be positive");
  if (pairs < 0 || pairs > 1'000'000) flags.Usage(1, "--pairs wants 0 to 1000000");
  if (pollute_kb < 0 || pollute_kb > 1'048'576) flags.Usage(1, "--pollute wants 0 to 1048576 KB");
  if (kernel_count < 1 || kernel_count > 4096) flags.Usage(1, "--kernels wants 1 to 4096");
  if (pair_switch < -1 || pair_switch > 1000) flags.Usage(1, "--pair-switch wants 0 to 1000");
  if (memory_mb < 0 || memory_mb > 16384) flags.Usage(1, "--memory-latency wants 0 to 16384 MB");
  if (segments < 1 || segments > 10000) flags.Usage(1, "--segments wants 1 to 10000");
  std::atomic<uint32_t>* switch_word = pair_switch >= 0 ? MapPairSwitch() : nullptr;

  Gpu gpu = orion::samples::OpenGpu();
  CUstream stream;
  ORION_CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUevent events[kEvents];
  for (CUevent& e : events) ORION_CHECK_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  const int n = static_cast<int>(launches);
  NsPerLaunch(gpu, stream, events, n / 4 + 1, {});  // warm-up

  struct Row {
    const char* name;
    Extras extras;
  };
  const Row rows[] = {
      {"launch", {}},
      {"launch+ctx", {.ctx = true}},
      {"launch+capturing", {.capturing = true}},
      {"launch+event", {.event = true}},
      {"launch+ctx+capturing+event", {true, true, true}},
  };
  for (const Row& row : rows) {
    printf("%-34s ns_per_launch=%.0f\n", row.name, NsPerLaunch(gpu, stream, events, n, row.extras));
  }
  // The same with a second thread querying the events every 20 us, as a completion poller does.
  if (!no_polled) {
    std::atomic<bool> stop{false};
    std::thread poller([&] {
      ORION_CHECK_CU(cuCtxSetCurrent(gpu.context));
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 64; ++i) (void)cuEventQuery(events[i]);
        const timespec ts{0, 20'000};
        nanosleep(&ts, nullptr);
      }
    });
    printf("%-34s ns_per_launch=%.0f\n", "launch+event, 64 queried per 20us",
           NsPerLaunch(gpu, stream, events, n, {.event = true}));
    stop.store(true);
    poller.join();
  }
  // What one reading of the clock the interposer stamps events with costs on this host (a vDSO
  // call where the clock source allows it, a system call where it does not).
  {
    uint64_t sink = 0;
    const uint64_t t0 = NowNs();
    for (int i = 0; i < 1'000'000; ++i) {
      timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      sink += static_cast<uint64_t>(ts.tv_nsec);
    }
    printf("%-34s ns_per_call=%.0f%s\n", "clock_gettime(CLOCK_MONOTONIC)",
           static_cast<double>(NowNs() - t0) / 1'000'000, sink == 1 ? " " : "");
  }
  std::vector<CUmodule> modules(static_cast<size_t>(kernel_count) - 1);
  std::vector<CUfunction> kernels{gpu.spin};
  for (size_t i = 0; i < modules.size(); ++i) {
    kernels.push_back(orion::samples::SpinNamed(gpu, "k" + std::to_string(i) + "_", &modules[i]));
  }
  const double l2_before = memory_mb > 0 ? ChaseNs(size_t{1} << 20, 2'000'000) : 0;
  if (pairs > 0) {
    for (int64_t segment = 1; segment <= segments; ++segment) {
      PrintPaired(gpu, stream, static_cast<int>(pairs), pollute_kb, kernels, switch_word,
                  static_cast<uint32_t>(std::max<int64_t>(pair_switch, 0)),
                  segments > 1 ? static_cast<int>(segment) : 0);
    }
  }
  if (memory_mb > 0) {
    const double l2 = ChaseNs(size_t{1} << 20, 2'000'000);
    const double shared = ChaseNs(size_t{64} << 20, 2'000'000);
    const double far = ChaseNs(static_cast<size_t>(memory_mb) << 20, 2'000'000);
    printf("memory l2_before_ns=%.1f l2_ns=%.1f shared_ns=%.1f far_ns=%.1f mb=%lld\n", l2_before,
           l2, shared, far, static_cast<long long>(memory_mb));
  }
  for (CUmodule m : modules) ORION_CHECK_CU(cuModuleUnload(m));
  for (CUevent& e : events) ORION_CHECK_CU(cuEventDestroy(e));
  ORION_CHECK_CU(cuStreamDestroy(stream));
  orion::samples::CloseGpu(gpu);
  return 0;
}
