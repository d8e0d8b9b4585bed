// What the cuBLAS double's end-to-end tests share: run a probe program on the test doubles (a
// private simulated GPU, no orion-server unless given one, the interposer's split report on) and
// read its "case=NAME key=value ..." lines, plus the interposer's "orion: gemm split:" report.
#pragma once

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cuda_double/child_process.h"

namespace orion::testing {

using Fields = std::map<std::string, std::string>;

struct ProbeRun {
  int status = -1;
  std::string output;                   // stdout and stderr
  Fields libs;                          // the "libs" line, where the probe prints one
  Fields reload;                        // the "reload" line, where the probe prints one
  Fields device;                        // the "double" line: the driver double's counts
  std::map<std::string, Fields> cases;  // name -> key -> value
};

// Runs `argv` with `env` added on the doubles (ORION_CUDA_DOUBLE_DIR), at most 240 s; with no
// server unless `env` names an ORION_SOCKET.
inline ProbeRun RunProbe(const std::vector<std::string>& argv, std::vector<std::string> env,
                         const char* dir_prefix) {
  ProbeRun run;
  const std::string dir = MakeTestDir(dir_prefix);
  if (dir.empty()) return run;
  env.push_back("ORION_SIM_DIR=" + dir);
  env.push_back(std::string("LD_LIBRARY_PATH=") + ORION_CUDA_DOUBLE_DIR);
  bool socket_given = false;
  for (const std::string& kv : env) socket_given = socket_given || kv.rfind("ORION_SOCKET=", 0) == 0;
  if (!socket_given) env.push_back("ORION_SOCKET=/nonexistent/orion.sock");
  env.push_back("ORION_QUIET=1");
  env.push_back("ORION_GEMM_SPLIT_REPORT=1");
  const std::string log = dir + "/probe.log";
  const pid_t pid = StartProcess(argv, env, log);
  const double deadline = NowS() + 240;
  int wstatus = 0;
  while (waitpid(pid, &wstatus, WNOHANG) == 0) {
    if (NowS() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      break;
    }
    usleep(20'000);
  }
  run.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  run.output = ReadFile(log);
  std::istringstream lines(run.output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("libs ", 0) == 0) run.libs = KeyValueFields(line);
    if (line.rfind("reload ", 0) == 0) run.reload = KeyValueFields(line);
    if (line.rfind("double ", 0) == 0) run.device = KeyValueFields(line);
    if (line.rfind("case=", 0) != 0) continue;
    Fields values = KeyValueFields(line);
    run.cases[values["case"]] = values;
  }
  return run;
}

// A field as an integer, -1 where it is missing.
inline int Int(const Fields& values, const char* key) {
  auto it = values.find(key);
  return it == values.end() ? -1 : std::stoi(it->second);
}

// "orion: gemm split: N calls looked at, S split into P pieces": {N, S, P}, or -1s.
inline std::vector<long long> Report(const std::string& output) {
  const size_t at = output.find("orion: gemm split: ");
  long long looked = -1, split = -1, pieces = -1;
  if (at != std::string::npos) {
    sscanf(output.c_str() + at,
           "orion: gemm split: %lld calls looked at, %lld split into %lld pieces", &looked,
           &split, &pieces);
  }
  return {looked, split, pieces};
}

}  // namespace orion::testing
