// orion-bench-launch: the CPU cost of one kernel launch, alone and with each extra driver call
// the interposer makes around a tracked launch (current context, capture check, completion
// event), and while another thread polls completion events the way the interposer's poller does.
// Run it plain and under orion-run to see what the interposer adds:
//   orion-bench-launch [--launches N]
//   orion-run --priority high -- orion-bench-launch
// Prints one line per variant: "name ns_per_launch=.." (the best of 5 batches of N launches of an
// empty kernel; only the launch calls are timed, the GPU is drained between groups of 64).
#include <atomic>
#include <cstdio>
#include <thread>

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

}  // namespace

int main(int argc, char** argv) {
  int64_t launches = 20000;
  orion::samples::Flags flags("orion-bench-launch", "CPU cost of a kernel launch and its extras");
  flags.AddInt("launches", &launches, "launches per batch (best of 5 batches)");
  flags.Parse(argc, argv);
  if (launches <= 0) flags.Usage(1, "--launches must be positive");

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
  for (CUevent& e : events) ORION_CHECK_CU(cuEventDestroy(e));
  ORION_CHECK_CU(cuStreamDestroy(stream));
  orion::samples::CloseGpu(gpu);
  return 0;
}
