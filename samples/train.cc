// orion-sample-train: a best-effort trainer in miniature. For --seconds it runs steps of
// --kernels orion_spin kernels of --kernel-us each on one stream, synchronizing after every
// step, as a training loop does at its optimizer step. It keeps the GPU as busy as it can, which
// is what a latency-critical neighbour must be protected from.
//
// With --progress it also prints "ready" before the first step and "step T" after each step
// (T = CLOCK_MONOTONIC seconds), which bench/orion_bench.py priority uses to measure throughput
// inside a time window.
//
// With --device N it runs on CUDA device N of those it sees (a rank of a job on several GPUs).
//
// With --nvtx each step is an NVTX range named "step" (the real NVTX loader from the CUDA
// toolkit's headers: a tool named by NVTX_INJECTION64_PATH sees it), and each step's line also
// carries its duration ("step T D", D in seconds).
//
// Last line (machine-readable):
//   result steps=N kernels=.. seconds=.. steps_per_s=.. kernels_per_s=.. busy_fraction=..
#include <cinttypes>

#include <nvtx3/nvToolsExt.h>

#include "samples/sample_common.h"

int main(int argc, char** argv) {
  double seconds = 10;
  int64_t kernels = 20;
  double kernel_us = 1000;
  int64_t blocks = 132;
  bool progress = false;
  bool nvtx = false;
  std::string kernel_prefix;
  int64_t device = 0;
  orion::samples::Flags flags("orion-sample-train",
                              "best-effort trainer: steps of K kernels for S seconds");
  flags.AddDouble("seconds", &seconds, "how long to train (10)");
  flags.AddInt("kernels", &kernels, "kernels per step (20)");
  flags.AddDouble("kernel-us", &kernel_us, "GPU time of each kernel in microseconds (1000)");
  flags.AddInt("blocks", &blocks, "thread blocks per kernel (132: one per SM of an H100)");
  flags.AddBool("progress", &progress, "print ready and one line per step with its end time");
  flags.AddBool("nvtx", &nvtx, "mark each step with an NVTX range \"step\"");
  flags.AddString("kernel-prefix", &kernel_prefix,
                  "launch orion_spin renamed PREFIXorion_spin (e.g. ncclDevKernel_: named like a "
                  "collective)");
  flags.AddInt("device", &device,
               "CUDA device ordinal (0): one rank's GPU among the container's, as torchrun gives "
               "rank LOCAL_RANK the device cuda:LOCAL_RANK");
  flags.Parse(argc, argv);
  if (kernels < 1 || blocks < 1) flags.Usage(1, "counts must be >= 1");
  if (device < 0) flags.Usage(1, "--device must be >= 0");

  orion::samples::Gpu gpu = orion::samples::OpenGpu(static_cast<int>(device));
  CUmodule named_module = nullptr;
  CUfunction kernel = orion::samples::SpinNamed(gpu, kernel_prefix, &named_module);
  CUstream stream = nullptr;
  ORION_CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const auto kernel_ns = static_cast<uint64_t>(kernel_us * 1000.0);
  printf("orion-sample-train: gpu=\"%s\" seconds=%g kernels=%" PRId64 " kernel_us=%g\n", gpu.name,
         seconds, kernels, kernel_us);
  fflush(stdout);

  const uint64_t start = orion::samples::NowNs();
  const uint64_t stop = start + static_cast<uint64_t>(seconds * 1e9);
  int64_t steps = 0;
  if (progress) printf("ready\n");
  fflush(stdout);
  while (orion::samples::NowNs() < stop) {
    const uint64_t step_start = orion::samples::NowNs();
    if (nvtx) nvtxRangePushA("step");
    for (int64_t k = 0; k < kernels; ++k) {
      orion::samples::LaunchSpin(gpu, stream, kernel_ns, static_cast<unsigned int>(blocks), kernel);
    }
    ORION_CHECK_CU(cuStreamSynchronize(stream));
    if (nvtx) nvtxRangePop();
    ++steps;
    if (progress) {
      const uint64_t now = orion::samples::NowNs();
      if (nvtx) {
        printf("step %.6f %.6f\n", static_cast<double>(now) / 1e9,
               static_cast<double>(now - step_start) / 1e9);
      } else {
        printf("step %.6f\n", static_cast<double>(now) / 1e9);
      }
      fflush(stdout);
    }
  }
  const double wall_s = static_cast<double>(orion::samples::NowNs() - start) / 1e9;
  const double launched = static_cast<double>(steps * kernels);
  printf("result steps=%" PRId64
         " kernels=%.0f seconds=%.3f steps_per_s=%.2f"
         " kernels_per_s=%.1f busy_fraction=%.3f\n",
         steps, launched, wall_s, static_cast<double>(steps) / wall_s, launched / wall_s,
         launched * kernel_us / 1e6 / wall_s);

  ORION_CHECK_CU(cuStreamDestroy(stream));
  if (named_module != nullptr) ORION_CHECK_CU(cuModuleUnload(named_module));
  orion::samples::CloseGpu(gpu);
  return 0;
}
