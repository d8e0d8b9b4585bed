// A best-effort job of two ranks on two simulated GPUs beside a high-priority CUDA-graph service
// on GPU 0, on the CUDA driver test double with the real orion-server and the interposer.
//
// The regression it guards (two H200s, gpu_hold on): a DDP job's rank held on the GPU behind
// the gate's stream wait while its collectives, never held, spin for a peer that waits for that
// held compute; the service waited behind both (~1,400x its latency alone) and the job made no
// steps. The double models what it takes (tests/cuda_double/sim_job.h, cuda_double.cc): a stream
// wait really holds the work behind it, and a collective occupies its GPU from its start until
// the peer's matching one has started. The job is orion-sim-pipeline-rank (a pipeline-parallel
// rank: rank 0 posts its gradient receive while its forward work may still be queued).
//
// Asserted with gpu_hold on and off, and with rank 1 outside the node's control (no
// interposer): the job advances (steps, no long gap) and the service's p99 and worst latency
// stay bounded. The bounds are wide for a loaded 2-core CI machine. The failure shows as
// service latencies and step gaps of about a second (the gate's staleness rule opens the hold;
// failing that, a collective gives up after ORION_SIM_COLLECTIVE_TIMEOUT_MS, 3 s here), never
// as a hang: every child is killed at the end.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cuda_double/child_process.h"

namespace {

using orion::testing::NowS;
using orion::testing::ReadFile;
using orion::testing::ResultFields;
using orion::testing::StartProcess;

constexpr int kJobSteps = 500;  // ~150 steps/s alone: longer than the service runs
constexpr int kServiceRequests = 300;  // 100 per second: ~3 s of the job's 5
// Measured on a 2-core machine, gpu_hold on: with the gate on the CPU (the fix) the service's
// p50/p99/max were 1.4/6.3/8.8 ms and rank 0 made ~330 steps beside it, 20 ms apart at most;
// held on the GPU (the old behaviour) 609/1,006/1,008 ms and 12 steps, 1.15 s apart: every
// deadlock lasts until the service's work counts as stale (hp_stale_ms, 1 s) and the hold opens.
constexpr double kServiceP99BoundUs = 200'000;
constexpr double kServiceMaxBoundUs = 500'000;
constexpr int kMinJobSteps = 50;
constexpr double kMaxStepGapS = 0.5;

struct RankLog {
  int steps = 0;
  double max_gap_s = 0;  // between steps, and from the service's start to the first one after it
};

// Steps of a rank's log ("step N T") and the longest gap between them inside [from_s, to_s].
RankLog ReadSteps(const std::string& log, double from_s, double to_s) {
  RankLog out;
  std::istringstream lines(log);
  std::string line;
  double last = from_s;
  while (std::getline(lines, line)) {
    int n = 0;
    double t = 0;
    if (sscanf(line.c_str(), "step %d %lf", &n, &t) != 2) continue;
    ++out.steps;
    if (t < from_s || t > to_s) continue;
    out.max_gap_s = std::max(out.max_gap_s, t - last);
    last = t;
  }
  out.max_gap_s = std::max(out.max_gap_s, to_s - last);
  return out;
}

class MultiGpuJobTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (pid_t pid : {service_, rank0_, rank1_, server_}) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    if (!dir_.empty()) ASSERT_EQ(system(("rm -rf " + dir_).c_str()), 0);
  }

  // Waits up to `seconds` for `pid` to exit; its status, or -1 (then it is killed).
  static int WaitExit(pid_t* pid, double seconds) {
    int status = -1;
    const double t0 = NowS();
    while (NowS() - t0 < seconds) {
      if (waitpid(*pid, &status, WNOHANG) == *pid) {
        *pid = -1;
        return status;
      }
      usleep(20'000);
    }
    kill(*pid, SIGKILL);
    waitpid(*pid, nullptr, 0);
    *pid = -1;
    return -1;
  }

  static bool WaitForLine(const std::string& path, const char* text, double seconds) {
    const double t0 = NowS();
    while (ReadFile(path).find(text) == std::string::npos) {
      if (NowS() - t0 > seconds) return false;
      usleep(20'000);
    }
    return true;
  }

  void Run(bool gpu_hold, bool rank1_interposed, const char* label) {
    dir_ = orion::testing::MakeTestDir("orion-multigpu");
    ASSERT_FALSE(dir_.empty());
    const std::string config = orion::testing::WriteServerConfig(
        // The hold's bound off: a rank held on the GPU would otherwise be let go after 500 ms,
        // and what is tested is that it is never held at all.
        dir_, gpu_hold ? "{gpu_hold: true, gpu_hold_max_ms: 0}" : "{gpu_hold: false}");
    std::vector<std::string> env =
        orion::testing::ClientEnv(dir_, "4Gi", ORION_INTERPOSE_LIB, ORION_CUDA_DOUBLE_DIR);
    env.push_back("ORION_SIM_DEVICES=2");
    env.push_back("ORION_SIM_COLLECTIVE_TIMEOUT_MS=3000");

    server_ = StartProcess({ORION_SERVER, "--config", config}, env, dir_ + "/server.log");
    for (int i = 0; i < 200 && access((dir_ + "/orion.sock").c_str(), F_OK) != 0; ++i) {
      usleep(25'000);
    }
    ASSERT_EQ(access((dir_ + "/orion.sock").c_str(), F_OK), 0) << ReadFile(dir_ + "/server.log");

    std::vector<std::string> hp_env = env, rank_env = env;
    hp_env.push_back("ORION_PRIORITY=high");
    rank_env.push_back("ORION_PRIORITY=best-effort");
    rank_env.push_back("ORION_SIM_JOB=pipeline");
    std::vector<std::string> rank0_env = rank_env, rank1_env = rank_env;
    rank0_env.push_back("ORION_SIM_RANK=0");
    rank1_env.push_back("ORION_SIM_RANK=1");
    if (!rank1_interposed) {  // a peer outside the node's control: the double only
      rank1_env = {"ORION_SIM_DIR=" + dir_, "ORION_SIM_MEMORY=4Gi",
                   std::string("LD_LIBRARY_PATH=") + ORION_CUDA_DOUBLE_DIR, "ORION_SIM_DEVICES=2",
                   "ORION_SIM_COLLECTIVE_TIMEOUT_MS=3000", "ORION_SIM_JOB=pipeline",
                   "ORION_SIM_RANK=1"};
    }
    const std::string steps = std::to_string(kJobSteps);
    rank0_ = StartProcess({ORION_SIM_PIPELINE_RANK, "--rank", "0", "--steps", steps, "--seconds",
                           "40"},
                          rank0_env, dir_ + "/rank0.log");
    rank1_ = StartProcess({ORION_SIM_PIPELINE_RANK, "--rank", "1", "--steps", steps, "--seconds",
                           "40"},
                          rank1_env, dir_ + "/rank1.log");
    ASSERT_TRUE(WaitForLine(dir_ + "/rank0.log", "step 1 ", 10.0)) << ReadFile(dir_ + "/rank0.log");
    ASSERT_TRUE(WaitForLine(dir_ + "/rank1.log", "step 1 ", 10.0)) << ReadFile(dir_ + "/rank1.log");

    // The service on GPU 0 at moderate load (100 requests/s of 1 ms graphs), once the job runs.
    const double service_start = NowS();
    service_ = StartProcess({ORION_SAMPLE_INFER, "--graph", "--rate", "100", "--requests",
                             std::to_string(kServiceRequests), "--kernels", "2", "--kernel-us",
                             "500", "--warmup", "10"},
                            hp_env, dir_ + "/service.log");
    const int service_status = WaitExit(&service_, 40.0);
    const double service_end = NowS();
    const int rank0_status = WaitExit(&rank0_, 60.0);
    const int rank1_status = WaitExit(&rank1_, 20.0);

    const std::string service_log = ReadFile(dir_ + "/service.log");
    const std::string rank0_log = ReadFile(dir_ + "/rank0.log");
    const std::string rank1_log = ReadFile(dir_ + "/rank1.log");
    auto fields = ResultFields(service_log);
    const double p99 = fields.count("p99_us") ? std::stod(fields["p99_us"]) : -1;
    const double max = fields.count("max_us") ? std::stod(fields["max_us"]) : -1;
    const double p50 = fields.count("p50_us") ? std::stod(fields["p50_us"]) : -1;
    // The job while the service ran beside it.
    const RankLog r0 = ReadSteps(rank0_log, service_start, service_end);
    const RankLog r1 = ReadSteps(rank1_log, service_start, service_end);
    int r0_during = 0;
    {
      std::istringstream lines(rank0_log);
      std::string line;
      while (std::getline(lines, line)) {
        int n = 0;
        double t = 0;
        if (sscanf(line.c_str(), "step %d %lf", &n, &t) == 2 && t >= service_start &&
            t <= service_end) {
          ++r0_during;
        }
      }
    }
    printf("{\"case\":\"%s\",\"service_p50_us\":%.0f,\"service_p99_us\":%.0f,"
           "\"service_max_us\":%.0f,\"service_s\":%.2f,\"rank0_steps\":%d,"
           "\"rank0_steps_beside_service\":%d,\"rank0_max_gap_s\":%.3f,\"rank1_steps\":%d,"
           "\"rank1_max_gap_s\":%.3f}\n",
           label, p50, p99, max, service_end - service_start, r0.steps, r0_during, r0.max_gap_s,
           r1.steps, r1.max_gap_s);
    fflush(stdout);

    ASSERT_TRUE(WIFEXITED(service_status) && WEXITSTATUS(service_status) == 0)
        << service_log << ReadFile(dir_ + "/server.log");
    EXPECT_TRUE(WIFEXITED(rank0_status) && WEXITSTATUS(rank0_status) == 0) << rank0_log;
    EXPECT_TRUE(WIFEXITED(rank1_status) && WEXITSTATUS(rank1_status) == 0) << rank1_log;
    EXPECT_LE(p99, kServiceP99BoundUs) << service_log;
    EXPECT_LE(max, kServiceMaxBoundUs) << service_log;
    EXPECT_GE(r0_during, kMinJobSteps) << rank0_log;
    EXPECT_LE(r0.max_gap_s, kMaxStepGapS) << rank0_log;
    EXPECT_LE(r1.max_gap_s, kMaxStepGapS) << rank1_log;
  }

  std::string dir_;
  pid_t server_ = -1, service_ = -1, rank0_ = -1, rank1_ = -1;
};

TEST_F(MultiGpuJobTest, GpuHoldOnServiceBoundedAndJobAdvances) {
  Run(/*gpu_hold=*/true, /*rank1_interposed=*/true, "gpu-hold-on");
}

TEST_F(MultiGpuJobTest, GpuHoldOffServiceBoundedAndJobAdvances) {
  Run(/*gpu_hold=*/false, /*rank1_interposed=*/true, "gpu-hold-off");
}

// Rank 1 runs without the interposer (a peer the node does not control): rank 0, beside the
// service, must still not hold its compute on the GPU while its collectives spin.
TEST_F(MultiGpuJobTest, GpuHoldOnPeerOutsideTheNodeServiceBoundedAndJobAdvances) {
  Run(/*gpu_hold=*/true, /*rank1_interposed=*/false, "gpu-hold-on-bare-peer");
}

}  // namespace
