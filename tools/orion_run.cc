// orion-run: runs a program under the interposer in standalone mode (no Kubernetes):
//   orion-run --priority high --memory-limit 8Gi -- python serve.py
// It only sets the environment (LD_PRELOAD, ORION_*) and execs the program; the server decides
// whether to honour the requests (standalone.trust_client_requests), and only users of this
// node can reach its socket.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "contract/orion_contract.h"
#include "orion_version.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: orion-run [options] -- COMMAND [ARGS...]\n"
               "  --priority high|best-effort   requested priority (default best-effort)\n"
               "  --memory-limit SIZE            GPU memory cap: bytes, or a number with K, M,\n"
               "                                 G, T (powers of 1000: 8G = 8,000,000,000\n"
               "                                 bytes) or Ki, Mi, Gi, Ti (powers of 1024:\n"
               "                                 8Gi = 8,589,934,592 bytes); 0 or left out:\n"
               "                                 no limit\n"
               "  --latency-target-ms N          high-priority latency target\n"
               "  --job NAME                     the job this command's processes are ranks\n"
               "                                 of (ORION_JOB; lowercase letters, digits, '-',\n"
               "                                 '.'); default: processes started by one\n"
               "                                 parent (torchrun) are one job\n"
               "  --mps-thread-percentage N      best-effort: SM share under MPS (default 50;\n"
               "                                 0: not set)\n"
               "  --socket PATH                  the server's socket_path, passed on as\n"
               "                                 $ORION_SOCKET (default: $ORION_SOCKET if set,\n"
               "                                 else %s); needed when the server's\n"
               "                                 config moves socket_path\n"
               "  --log-dir DIR                  with no server to register with, write call\n"
               "                                 logs there (ORION_LOG_DIR; orion-ctl timeline\n"
               "                                 --from-log DIR turns them into a trace)\n"
               "  --interposer PATH              liborion_interpose.so to preload\n"
               "                                 (default: $ORION_INTERPOSER, else next to this\n"
               "                                 program or in ../lib)\n"
               "With no server at the socket the program runs unshared (the interposer says so on\n"
               "its stderr). Without an NVIDIA GPU, `source tools/simulated-gpu.sh` first runs\n"
               "programs on the CUDA driver test double (a simulated GPU).\n",
               orion::contract::kDefaultSocketPath);
}

bool ValidSize(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0) return false;
  const std::string unit = s.substr(i);
  for (const char* u : {"", "B", "K", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"}) {
    if (unit == u) return true;
  }
  return false;
}

// A whole decimal integer in [lo, hi]: digits only (no sign, space or anything after them).
bool ParseInRange(const std::string& text, long lo, long hi, long* out) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return false;
  char* end = nullptr;
  *out = std::strtol(text.c_str(), &end, 10);
  return *end == '\0' && *out >= lo && *out <= hi;
}

std::string SelfDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/'));
}

std::string FindInterposer() {
  if (const char* e = std::getenv("ORION_INTERPOSER"); e && *e) return e;
  const std::string dir = SelfDir();
  for (const std::string& c :
       {dir + "/liborion_interpose.so", dir + "/../lib/liborion_interpose.so",
        dir + "/../interpose/liborion_interpose.so"}) {
    if (access(c.c_str(), R_OK) == 0) {
      char real[PATH_MAX];
      return realpath(c.c_str(), real) ? real : c;
    }
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  std::string priority = "best-effort", memory_limit, latency_ms, socket_path, interposer;
  std::string log_dir, job;
  long mps_percentage = orion::contract::kDefaultBestEffortMpsThreadPercentage;
  bool mps_percentage_given = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "orion-run: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "--priority") {
      priority = value("--priority");
      if (priority != "high" && priority != "best-effort") {
        std::fprintf(stderr, "orion-run: --priority: expected high or best-effort, got '%s'\n",
                     priority.c_str());
        return 2;
      }
    } else if (a == "--job") {
      job = value("--job");
      if (const char* why = orion::contract::JobNameProblem(job.data(), job.size())) {
        std::fprintf(stderr, "orion-run: --job '%s' %s\n", job.c_str(), why);
        return 2;
      }
    } else if (a == "--mps-thread-percentage") {
      const std::string text = value("--mps-thread-percentage");
      if (!ParseInRange(text, 0, 100, &mps_percentage)) {
        std::fprintf(stderr,
                     "orion-run: --mps-thread-percentage: expected 0..100 (0: not set), got '%s'\n",
                     text.c_str());
        return 2;
      }
      mps_percentage_given = true;
    } else if (a == "--memory-limit") {
      memory_limit = value("--memory-limit");
      if (!ValidSize(memory_limit)) {
        std::fprintf(stderr,
                     "orion-run: --memory-limit: expected bytes or a size such as 8Gi "
                     "(8 x 2^30 bytes), 8G (8 x 10^9 bytes) or 512Mi; 0: no limit; got '%s'\n",
                     memory_limit.c_str());
        return 2;
      }
    } else if (a == "--latency-target-ms") {
      latency_ms = value("--latency-target-ms");
      long v = 0;
      if (!ParseInRange(latency_ms, 1, 3600000, &v)) {
        std::fprintf(stderr, "orion-run: --latency-target-ms: expected 1..3600000, got '%s'\n",
                     latency_ms.c_str());
        return 2;
      }
    } else if (a == "--socket") {
      socket_path = value("--socket");
    } else if (a == "--log-dir") {
      log_dir = value("--log-dir");
    } else if (a == "--interposer") {
      interposer = value("--interposer");
    } else if (a == "--version") {
      std::printf("%s %s\n", "orion-run", ORION_VERSION_LINE);
      return 0;
    } else if (a == "-h" || a == "--help") {
      Usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "orion-run: unknown option '%s'\n", a.c_str());
      Usage(stderr);
      return 2;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "orion-run: no command given\n");
    Usage(stderr);
    return 2;
  }
  if (interposer.empty()) interposer = FindInterposer();
  if (interposer.empty() || access(interposer.c_str(), R_OK) != 0) {
    std::fprintf(stderr,
                 "orion-run: liborion_interpose.so not found (set --interposer or "
                 "ORION_INTERPOSER)\n");
    return 2;
  }
  std::string preload = interposer;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
  setenv("LD_PRELOAD", preload.c_str(), 1);
  // NVTX ranges (steps, requests) come through the interposer as the process's NVTX tool, unless
  // the caller already chose one (e.g. a profiler).
  setenv(orion::contract::kEnvNvtxInjection, interposer.c_str(), 0);
  setenv(orion::contract::kEnvPriority, priority.c_str(), 1);
  // Under MPS a best-effort process queues behind others (client priority 1) and uses at most its
  // SM share (CUDA ignores both without the MPS daemon). Settings already in the environment win
  // over the defaults; --mps-thread-percentage wins over the environment. Both are fixed at
  // context creation: a later promotion through the admin API changes the gate, not these.
  if (priority == "best-effort") {
    setenv(orion::contract::kEnvMpsClientPriority, "1", 0);
    if (mps_percentage != 0) {
      setenv(orion::contract::kEnvMpsThreadPercentage, std::to_string(mps_percentage).c_str(),
             mps_percentage_given ? 1 : 0);
    }
  } else if (mps_percentage_given) {
    std::fprintf(stderr, "orion-run: --mps-thread-percentage applies to best-effort only; "
                         "ignored for --priority high\n");
  }
  if (!job.empty()) setenv(orion::contract::kEnvJob, job.c_str(), 1);
  if (!memory_limit.empty()) setenv(orion::contract::kEnvMemoryLimit, memory_limit.c_str(), 1);
  if (!latency_ms.empty()) setenv(orion::contract::kEnvLatencyTargetMs, latency_ms.c_str(), 1);
  if (!socket_path.empty()) setenv(orion::contract::kEnvSocket, socket_path.c_str(), 1);
  if (!log_dir.empty()) setenv(orion::contract::kEnvLogDir, log_dir.c_str(), 1);
  execvp(argv[i], argv + i);
  std::fprintf(stderr, "orion-run: cannot run '%s': %s\n", argv[i], std::strerror(errno));
  return 127;
}
