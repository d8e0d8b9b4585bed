// End-to-end test of the sample workloads on the CUDA driver test double (no GPU needed): the
// unchanged binaries find the double through LD_LIBRARY_PATH, and because the double serialises
// kernels across processes, an inference service's latency must grow when a trainer runs
// beside it, as it does on a time-sliced GPU. Thresholds are generous: CI machines are noisy.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tests/cuda_double/child_process.h"

namespace {

struct SampleRun {
  int status = -1;
  std::string output;
  std::map<std::string, std::string> result;  // key=value pairs of the "result" line
};

class SamplesOnDoubleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static char dir[] = "/tmp/orion-sim-samples-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    setenv("ORION_SIM_DIR", dir, 1);
    setenv("ORION_SIM_MEMORY", "4Gi", 1);
    const char* old = getenv("LD_LIBRARY_PATH");
    std::string path = ORION_CUDA_DOUBLE_DIR;
    if (old != nullptr && *old != '\0') path += std::string(":") + old;
    setenv("LD_LIBRARY_PATH", path.c_str(), 1);
    unsetenv("LD_PRELOAD");  // the bare double, no interposer
  }

  // Starts a sample with its stdout going to a pipe; returns the pid.
  static pid_t Start(const std::vector<std::string>& argv, int* out_fd) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    *out_fd = fds[0];
    return pid;
  }

  // Reads `fd` until its output holds `text` or `seconds` pass; what it read, for Finish.
  static std::string ReadUntil(int fd, const std::string& text, int seconds) {
    std::string read_so_far;
    char buffer[4096];
    for (int waited_ms = 0;
         read_so_far.find(text) == std::string::npos && waited_ms < seconds * 1000;
         waited_ms += 50) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n <= 0) break;
      read_so_far.append(buffer, n);
    }
    return read_so_far;
  }

  static SampleRun Finish(pid_t pid, int fd, std::string already_read = "") {
    SampleRun run;
    run.output = std::move(already_read);
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) > 0) run.output.append(buffer, n);
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    run.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    run.result = orion::testing::ResultFields(run.output);
    return run;
  }

  static SampleRun RunToEnd(const std::vector<std::string>& argv) {
    int fd = -1;
    const pid_t pid = Start(argv, &fd);
    return Finish(pid, fd);
  }

  static double Number(const SampleRun& run, const std::string& key) {
    auto it = run.result.find(key);
    return it == run.result.end() ? -1 : std::stod(it->second);
  }
};

// 2 kernels of 0.5 ms per request at 100 requests/s: about 1 ms alone.
const std::vector<std::string> kInfer = {
    ORION_SAMPLE_INFER, "--rate", "100",      "--requests", "150", "--kernels", "2",
    "--kernel-us",      "500",    "--warmup", "5"};

TEST_F(SamplesOnDoubleTest, BadFlagsPrintUsage) {
  const SampleRun run = RunToEnd({ORION_SAMPLE_INFER, "--no-such-flag"});
  EXPECT_EQ(run.status, 1);
  EXPECT_NE(run.output.find("usage: orion-sample-infer"), std::string::npos) << run.output;
}

TEST_F(SamplesOnDoubleTest, InferLatencyGrowsBesideATrainer) {
  const SampleRun alone = RunToEnd(kInfer);
  ASSERT_EQ(alone.status, 0) << alone.output;
  const double alone_p50 = Number(alone, "p50_us");
  ASSERT_GT(alone_p50, 900) << alone.output;  // cannot beat the simulated GPU time

  // The trainer keeps the device busy with 5 ms kernels; every request then waits on average
  // half a kernel before its own kernels run, and more when it lands behind a whole step.
  int train_fd = -1;
  const pid_t trainer = Start(
      {ORION_SAMPLE_TRAIN, "--seconds", "4", "--kernels", "10", "--kernel-us", "5000",
       "--progress"},
      &train_fd);
  ASSERT_GT(trainer, 0);
  // The trainer's first step done: its kernels are on the device from here on.
  std::string train_head = ReadUntil(train_fd, "step ", 10);
  ASSERT_NE(train_head.find("step "), std::string::npos) << train_head;
  const SampleRun shared = RunToEnd(kInfer);
  const SampleRun train = Finish(trainer, train_fd, std::move(train_head));
  ASSERT_EQ(shared.status, 0) << shared.output;
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_GT(Number(train, "steps"), 10) << train.output;

  const double shared_p50 = Number(shared, "p50_us");
  const double shared_p99 = Number(shared, "p99_us");
  EXPECT_GT(shared_p50, alone_p50 + 1000) << alone.output << shared.output;
  EXPECT_GT(shared_p99, 5000) << shared.output;
}

TEST_F(SamplesOnDoubleTest, GraphReplayRunsTheSameWork) {
  const SampleRun run = RunToEnd({ORION_SAMPLE_INFER, "--rate", "0", "--requests", "50",
                                  "--kernels", "4", "--kernel-us", "250", "--graph"});
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(run.result.at("graph"), "1");
  EXPECT_GT(Number(run, "p50_us"), 900) << run.output;
}

TEST_F(SamplesOnDoubleTest, AllocStopsAtTheSimulatedCapacity) {
  for (const char* mode : {"", "--async", "--vmm"}) {
    std::vector<std::string> argv = {ORION_SAMPLE_ALLOC, "--chunk", "512Mi"};
    if (*mode) argv.push_back(mode);
    const SampleRun run = RunToEnd(argv);
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_EQ(run.result.at("chunks"), "8") << run.output;
    EXPECT_EQ(run.result.at("failure"), "CUDA_ERROR_OUT_OF_MEMORY") << run.output;
    EXPECT_EQ(run.result.at("free_after"), "0") << run.output;
    EXPECT_EQ(run.result.at("free_end"), run.result.at("total")) << run.output;
  }
}

}  // namespace
