// orion_test_registrar: runs one command under liborion_interpose.so with the test registrar in
// place of orion-server, drains the clients' event rings while it runs, and prints what the
// interposer reported. Used to check the interposer against real programs (PyTorch on a GPU)
// where no orion-server is built.
//
// Usage:
//   orion_test_registrar [--limit BYTES] [--high] [--profile] [--gate BE_BUDGET_US] -- cmd...
//   (LD_PRELOAD must already name liborion_interpose.so; the registrar sets ORION_SOCKET.)
//   --gate turns on the priority gate of GPU 0 with fixed knobs (no best-effort kernel fits
//   beside high-priority work unless its estimate fits BE_BUDGET_US); each client's own
//   ORION_PRIORITY decides its class.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "tests/interpose/test_registrar.h"

namespace {

namespace c = orion::contract;

struct SlotTally {
  std::map<uint32_t, uint64_t> kinds;  // EventKind -> events
  uint64_t launch_kernels = 0;         // kLaunch + graph kernel nodes
  uint64_t kernel_time_ns = 0;
  std::set<std::string> names;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t limit = 0;
  bool high = false;
  int64_t gate_budget_us = -1;
  int first = 1;
  for (; first < argc; ++first) {
    if (strcmp(argv[first], "--limit") == 0 && first + 1 < argc) {
      limit = strtoull(argv[++first], nullptr, 10);
    } else if (strcmp(argv[first], "--high") == 0) {
      high = true;
    } else if (strcmp(argv[first], "--gate") == 0 && first + 1 < argc) {
      gate_budget_us = strtoll(argv[++first], nullptr, 10);
    } else if (strcmp(argv[first], "--profile") == 0) {
      setenv("ORION_PROFILE", "1", 1);
    } else if (strcmp(argv[first], "--") == 0) {
      ++first;
      break;
    } else {
      break;
    }
  }
  if (first >= argc) {
    fprintf(stderr, "usage: %s [--limit BYTES] [--high] [--profile] -- command...\n", argv[0]);
    return 2;
  }
  char dir_template[] = "/tmp/orion-test-registrar-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return 2;
  const std::string dir = dir_template;
  std::map<uint32_t, SlotTally> tallies;
  int exit_code = 0;
  {
    orion::interpose::testing::TestRegistrar registrar(dir, limit, /*honour_priority=*/true);
    if (!registrar.ok()) {
      fprintf(stderr, "orion_test_registrar: cannot create board/socket in %s\n", dir.c_str());
      return 2;
    }
    setenv("ORION_SOCKET", registrar.socket_path().c_str(), 1);
    if (gate_budget_us >= 0) {
      c::GpuState& gpu = registrar.board().gpus[0];
      gpu.sm_threshold.store(0xFFFFFFFFu);
      gpu.be_budget_ns.store(static_cast<uint64_t>(gate_budget_us) * 1000);
      gpu.spin_ns.store(20'000);
      gpu.hp_stale_ns.store(100'000'000);
      gpu.mode.store(static_cast<uint32_t>(c::GateMode::kPriority));
    }
    if (high) setenv("ORION_PRIORITY", "high", 1);
    std::atomic<bool> done{false};
    auto drain = [&] {
      for (uint32_t s = 0; s < 64; ++s) {
        if (registrar.board().slots[s].state.load() == 0) continue;
        for (const c::Event& e : registrar.Drain(s)) {
          SlotTally& t = tallies[s];
          ++t.kinds[static_cast<uint32_t>(e.kind)];
          if (e.kind == c::EventKind::kLaunch) ++t.launch_kernels;
          if (e.kind == c::EventKind::kGraphLaunch) t.launch_kernels += e.aux;
          if (e.kind == c::EventKind::kKernelName) t.names.insert(e.name);
          if (e.kind == c::EventKind::kKernelTime) t.kernel_time_ns += e.duration_ns;
        }
      }
    };
    std::thread drainer([&] {
      while (!done) {
        drain();
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      drain();
    });
    const pid_t child = fork();
    if (child == 0) {
      execvp(argv[first], argv + first);
      perror("execvp");
      _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    done = true;
    drainer.join();
    const auto requests = registrar.requests();
    printf("registrations=%zu\n", requests.size());
    for (size_t s = 0; s < requests.size(); ++s) {
      const c::ClientSlot& slot = registrar.board().slots[s];
      const c::SlotGate& gate = registrar.gate().slots[s];
      const c::ClientArea* area = registrar.area(static_cast<uint32_t>(s));
      if (area == nullptr) continue;
      const c::ClientArea::Counters& n = area->counters;
      SlotTally& t = tallies[static_cast<uint32_t>(s)];
      printf(
          "slot=%zu process=%s priority=%u uuid=%s launches=%llu event_kernels=%llu dropped=%llu "
          "inflight=%u throttled_ns=%llu mem_used=%llu mem_peak=%llu names=%zu "
          "kernel_time_ns=%llu",
          s, requests[s].process_name, slot.priority.load(), requests[s].gpu_uuid,
          // The counter lags each thread still running at exit by up to 31 kernels
          // (interpose/client_state.h, CountLaunch); the events hold those.
          static_cast<unsigned long long>(std::max<uint64_t>(n.launches.load(), t.launch_kernels)),
          static_cast<unsigned long long>(t.launch_kernels),
          static_cast<unsigned long long>(area->ring.dropped.load()), gate.inflight.load(),
          static_cast<unsigned long long>(n.throttled_ns.load()),
          static_cast<unsigned long long>(n.memory_used_bytes.load()),
          static_cast<unsigned long long>(n.memory_peak_bytes.load()), t.names.size(),
          static_cast<unsigned long long>(t.kernel_time_ns));
      for (const auto& [kind, count] : t.kinds) {
        printf(" kind%u=%llu", kind, static_cast<unsigned long long>(count));
      }
      printf("\n");
    }
  }
  const std::string cleanup = "rm -rf " + dir;
  if (system(cleanup.c_str()) != 0) fprintf(stderr, "could not remove %s\n", dir.c_str());
  return exit_code;
}
