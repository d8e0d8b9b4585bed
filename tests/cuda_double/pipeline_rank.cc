// orion-sim-pipeline-rank: one rank of a two-stage pipeline-parallel training job, for the CUDA
// driver test double's simulated jobs (ORION_SIM_JOB, ORION_SIM_RANK; sim_job.h). Driver API
// only, like the samples, so it runs under the interposer exactly as a real rank's launches do.
//
// Each step (--micro-batches M, --kernels K of --compute-us each per stage and micro-batch):
//  - rank 0, the first stage: per micro-batch, K forward kernels and a send of the activations
//    on stream A; then, on stream B, the receive of the gradient (posted while A's work may still
//    be queued, as a pipeline schedule posts its receives early) and K backward kernels behind
//    it;
//  - rank 1, the last stage: per micro-batch, the receive of the activations and K forward
//    kernels; then K backward kernels and the send of the gradient back, all on stream A.
// Sends and receives are collectives (ncclDevKernel_SendRecv, --comm-us): in the double each
// spins on its GPU until the peer's matching one has started. Both ranks synchronize their
// streams at the end of a step and print "step N T" (T = CLOCK_MONOTONIC seconds).
//
// Both ranks must run the same number of steps (a rank that stops early leaves its peer's
// collectives waiting): give them the same --steps; --seconds only bounds a job that stalls.
//
// Last line (machine-readable):
//   result rank=R steps=N seconds=.. steps_per_s=.. max_step_gap_s=..
#include <cinttypes>

#include "samples/sample_common.h"

int main(int argc, char** argv) {
  int64_t rank = 0;
  int64_t device = -1;
  double seconds = 30;
  int64_t max_steps = 500;
  int64_t micro_batches = 4;
  int64_t kernels = 2;
  double compute_us = 250;
  double comm_us = 50;
  orion::samples::Flags flags("orion-sim-pipeline-rank",
                              "one rank of a two-stage pipeline-parallel job on the test double");
  flags.AddInt("rank", &rank, "0 (first stage) or 1 (last stage)");
  flags.AddInt("device", &device, "CUDA device ordinal (default: the rank)");
  flags.AddInt("steps", &max_steps, "steps to run, the same on both ranks (500)");
  flags.AddDouble("seconds", &seconds, "stop after this long even short of --steps (30)");
  flags.AddInt("micro-batches", &micro_batches, "micro-batches per step (4)");
  flags.AddInt("kernels", &kernels, "compute kernels per stage, pass and micro-batch (2)");
  flags.AddDouble("compute-us", &compute_us, "GPU time of a compute kernel in microseconds (250)");
  flags.AddDouble("comm-us", &comm_us, "GPU time of a send or receive once paired (50)");
  flags.Parse(argc, argv);
  if (rank != 0 && rank != 1) flags.Usage(1, "--rank must be 0 or 1");
  if (micro_batches < 1 || kernels < 1 || max_steps < 1) flags.Usage(1, "counts must be >= 1");
  if (device < 0) device = rank;

  orion::samples::Gpu gpu = orion::samples::OpenGpu(static_cast<int>(device));
  CUmodule comm_module = nullptr;
  // NCCL's point-to-point kernel name: the interposer and the double both tell it by name.
  CUfunction send_recv = orion::samples::SpinNamed(gpu, "ncclDevKernel_SendRecv_", &comm_module);
  CUstream a = nullptr, b = nullptr;
  ORION_CHECK_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  ORION_CHECK_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  const auto compute_ns = static_cast<uint64_t>(compute_us * 1000.0);
  const auto comm_ns = static_cast<uint64_t>(comm_us * 1000.0);
  auto compute = [&](CUstream s) {
    for (int64_t k = 0; k < kernels; ++k) orion::samples::LaunchSpin(gpu, s, compute_ns, 132);
  };
  auto communicate = [&](CUstream s) { orion::samples::LaunchSpin(gpu, s, comm_ns, 8, send_recv); };
  printf("orion-sim-pipeline-rank: rank=%" PRId64 " device=%" PRId64 " micro_batches=%" PRId64
         " kernels=%" PRId64 " compute_us=%g comm_us=%g\n",
         rank, device, micro_batches, kernels, compute_us, comm_us);
  printf("ready\n");
  fflush(stdout);

  const uint64_t start = orion::samples::NowNs();
  const uint64_t stop = start + static_cast<uint64_t>(seconds * 1e9);
  uint64_t last = start, max_gap = 0;
  int64_t steps = 0;
  while (steps < max_steps && orion::samples::NowNs() < stop) {
    if (rank == 0) {
      for (int64_t m = 0; m < micro_batches; ++m) {
        compute(a);      // forward
        communicate(a);  // send the activations
      }
      communicate(b);  // receive the gradient
      for (int64_t m = 0; m < micro_batches; ++m) compute(b);  // backward
      ORION_CHECK_CU(cuStreamSynchronize(a));
      ORION_CHECK_CU(cuStreamSynchronize(b));
    } else {
      for (int64_t m = 0; m < micro_batches; ++m) {
        communicate(a);  // receive the activations
        compute(a);      // forward
      }
      for (int64_t m = 0; m < micro_batches; ++m) compute(a);  // backward
      communicate(a);  // send the gradient
      ORION_CHECK_CU(cuStreamSynchronize(a));
    }
    ++steps;
    const uint64_t now = orion::samples::NowNs();
    max_gap = std::max(max_gap, now - last);
    last = now;
    printf("step %" PRId64 " %.6f\n", steps, static_cast<double>(now) / 1e9);
    fflush(stdout);
  }
  const double wall_s = static_cast<double>(orion::samples::NowNs() - start) / 1e9;
  printf("result rank=%" PRId64 " steps=%" PRId64 " seconds=%.3f steps_per_s=%.2f"
         " max_step_gap_s=%.3f\n",
         rank, steps, wall_s, static_cast<double>(steps) / wall_s,
         static_cast<double>(max_gap) / 1e9);
  fflush(stdout);
  ORION_CHECK_CU(cuStreamDestroy(a));
  ORION_CHECK_CU(cuStreamDestroy(b));
  ORION_CHECK_CU(cuModuleUnload(comm_module));
  orion::samples::CloseGpu(gpu);
  return 0;
}
