// orion-sample-infer: a latency-critical inference service in miniature. Requests arrive
// (Poisson at --rate, or back to back with --rate 0); each runs --kernels orion_spin kernels of
// --kernel-us on one stream and waits for them. Latency counts from the request's scheduled
// arrival, so time spent queued behind earlier requests (a service that cannot keep up) shows,
// as it would for a real client. --graph captures one request into a CUDA graph and replays it.
//
// With --nvtx each measured request is an NVTX start/end range named "request" (the real NVTX
// loader from the CUDA toolkit's headers: a tool named by NVTX_INJECTION64_PATH sees it).
//
// Last line (machine-readable):
//   result requests=N rate=R kernels=K kernel_us=U graph=0|1 p50_us=.. p99_us=.. p999_us=..
//          mean_us=.. max_us=.. throughput_rps=.. wall_s=.. cpu_s=..
// cpu_s is the process's CPU time (all threads, user + system) over the measured requests only:
// start-up (the GPU's, and whatever a preloaded library does when it starts) is not in it.
#include <sys/resource.h>

#include <cinttypes>
#include <random>

#include <nvtx3/nvToolsExt.h>

#include "samples/sample_common.h"

namespace {

using orion::samples::Flags;
using orion::samples::Gpu;

// CPU time of the whole process so far (all threads, user + system), in seconds.
double ProcessCpuS() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  double rate = 100;
  int64_t requests = 1000;
  int64_t kernels = 4;
  double kernel_us = 250;
  double cpu_us = 0;
  int64_t blocks = 1;
  int64_t warmup = 10;
  int64_t seed = 1;
  bool graph = false;
  bool nvtx = false;
  Flags flags("orion-sample-infer",
              "latency-critical service: Poisson requests of K kernels each, p50/p99/p99.9");
  flags.AddDouble("rate", &rate, "requests per second, Poisson arrivals; 0 = closed loop (100)");
  flags.AddInt("requests", &requests, "requests to measure (1000)");
  flags.AddInt("kernels", &kernels, "kernels per request (4)");
  flags.AddDouble("kernel-us", &kernel_us, "GPU time of each kernel in microseconds (250)");
  flags.AddDouble("cpu-us", &cpu_us,
                  "CPU time spent before each kernel's launch, as an eager framework spends it "
                  "(0); longer than --kernel-us, the GPU idles between kernels");
  flags.AddInt("blocks", &blocks, "thread blocks per kernel (1)");
  flags.AddInt("warmup", &warmup, "unmeasured requests before the run (10)");
  flags.AddInt("seed", &seed, "arrival process seed (1)");
  flags.AddBool("graph", &graph, "capture a request into a CUDA graph and replay it");
  flags.AddBool("nvtx", &nvtx, "mark each measured request with an NVTX range \"request\"");
  flags.Parse(argc, argv);
  if (requests < 1 || kernels < 1 || blocks < 1) flags.Usage(1, "counts must be >= 1");

  Gpu gpu = orion::samples::OpenGpu();
  CUstream stream = nullptr;
  ORION_CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const auto kernel_ns = static_cast<uint64_t>(kernel_us * 1000.0);
  const auto cpu_ns = static_cast<uint64_t>(cpu_us * 1000.0);

  CUgraphExec exec = nullptr;
  if (graph) {
    CUgraph captured = nullptr;
    ORION_CHECK_CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int64_t k = 0; k < kernels; ++k) {
      orion::samples::LaunchSpin(gpu, stream, kernel_ns, static_cast<unsigned int>(blocks));
    }
    ORION_CHECK_CU(cuStreamEndCapture(stream, &captured));
    ORION_CHECK_CU(cuGraphInstantiateWithFlags(&exec, captured, 0));
    ORION_CHECK_CU(cuGraphDestroy(captured));
  }
  auto serve = [&] {
    if (graph) {
      ORION_CHECK_CU(cuGraphLaunch(exec, stream));
    } else {
      for (int64_t k = 0; k < kernels; ++k) {
        if (cpu_ns > 0) {
          const uint64_t until = orion::samples::NowNs() + cpu_ns;
          while (orion::samples::NowNs() < until) {
          }
        }
        orion::samples::LaunchSpin(gpu, stream, kernel_ns, static_cast<unsigned int>(blocks));
      }
    }
    ORION_CHECK_CU(cuStreamSynchronize(stream));
  };
  for (int64_t i = 0; i < warmup; ++i) serve();

  printf("orion-sample-infer: gpu=\"%s\" rate=%g requests=%" PRId64 " kernels=%" PRId64
         " kernel_us=%g graph=%d\n",
         gpu.name, rate, requests, kernels, kernel_us, graph ? 1 : 0);
  fflush(stdout);

  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  std::exponential_distribution<double> gap_s(rate > 0 ? rate : 1.0);
  std::vector<double> latency_us;
  latency_us.reserve(static_cast<size_t>(requests));
  const double start_cpu_s = ProcessCpuS();
  const uint64_t start = orion::samples::NowNs();
  uint64_t arrival = start;
  for (int64_t i = 0; i < requests; ++i) {
    if (rate > 0) {
      arrival += static_cast<uint64_t>(gap_s(rng) * 1e9);
      orion::samples::SleepUntilNs(arrival);  // returns at once if we are behind
    } else {
      arrival = orion::samples::NowNs();
    }
    nvtxRangeId_t range = 0;
    if (nvtx) {
      // Start/end with event attributes (the trainer's steps use push/pop): both kinds of range.
      nvtxEventAttributes_t attributes{};
      attributes.version = NVTX_VERSION;
      attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
      attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
      attributes.message.ascii = "request";
      range = nvtxRangeStartEx(&attributes);
    }
    serve();
    if (nvtx) nvtxRangeEnd(range);
    latency_us.push_back(static_cast<double>(orion::samples::NowNs() - arrival) / 1e3);
  }
  const double wall_s = static_cast<double>(orion::samples::NowNs() - start) / 1e9;
  const double cpu_s = ProcessCpuS() - start_cpu_s;

  double sum = 0;
  for (double v : latency_us) sum += v;
  const double p50 = orion::samples::Percentile(latency_us, 0.50);
  const double p99 = orion::samples::Percentile(latency_us, 0.99);
  const double p999 = orion::samples::Percentile(latency_us, 0.999);
  const double max = orion::samples::Percentile(latency_us, 1.0);
  printf("latency_us p50=%.1f p99=%.1f p99.9=%.1f max=%.1f\n", p50, p99, p999, max);
  printf("result requests=%" PRId64 " rate=%g kernels=%" PRId64
         " kernel_us=%g graph=%d p50_us=%.1f p99_us=%.1f p999_us=%.1f mean_us=%.1f max_us=%.1f"
         " throughput_rps=%.1f wall_s=%.3f cpu_s=%.4f\n",
         requests, rate, kernels, kernel_us, graph ? 1 : 0, p50, p99, p999,
         sum / static_cast<double>(requests), max, static_cast<double>(requests) / wall_s, wall_s,
         cpu_s);

  if (exec != nullptr) ORION_CHECK_CU(cuGraphExecDestroy(exec));
  ORION_CHECK_CU(cuStreamDestroy(stream));
  orion::samples::CloseGpu(gpu);
  return 0;
}
