// Test support for the tests that run the samples, orion-server and the interposer as real
// processes on the CUDA driver test double: start a program with extra environment, its output
// in a log file, optionally pinned to one CPU; read a file; a monotonic clock in seconds; the
// key=value fields of a sample's "result ..." line.
//
// Usage:
//   const pid_t pid = orion::testing::StartProcess({ORION_SERVER, "--config", cfg}, env, log);
#pragma once

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace orion::testing {

inline double NowS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Starts argv with `env` (KEY=VALUE) added to the environment, stdout and stderr appended to
// `log`, pinned to `cpu` when cpu >= 0. Returns the child's pid.
inline pid_t StartProcess(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env, const std::string& log,
                          int cpu = -1) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
  if (freopen(log.c_str(), "a", stdout) == nullptr) _exit(126);
  dup2(STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

// A fresh folder for one test's server and clients: /tmp/<prefix>-XXXXXX; "" on failure.
inline std::string MakeTestDir(const char* prefix) {
  std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
  return mkdtemp(tmpl.data()) != nullptr ? tmpl : std::string();
}

// orion-server's config for a test in `dir` (socket there, ports the kernel picks,
// priority mode); returns its path.
inline std::string WriteServerConfig(const std::string& dir, const std::string& policy = "") {
  const std::string path = dir + "/orion.yaml";
  std::ofstream(path) << "socket_path: " << dir << "/orion.sock\n"
                      << "admin_address: 127.0.0.1:0\nmetrics_address: 127.0.0.1:0\n"
                      << "mode: priority\n"
                      << (policy.empty() ? "" : "policy: " + policy + "\n");
  return path;
}

// The environment of a client on the CUDA driver test double under the interposer, talking to
// the server of `dir`.
inline std::vector<std::string> ClientEnv(const std::string& dir, const char* gpu_memory,
                                          const char* interposer, const char* double_dir) {
  return {"ORION_SIM_DIR=" + dir, std::string("ORION_SIM_MEMORY=") + gpu_memory,
          std::string("LD_LIBRARY_PATH=") + double_dir, std::string("LD_PRELOAD=") + interposer,
          "ORION_SOCKET=" + dir + "/orion.sock"};
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The key=value fields of one line (words without '=' are skipped; a later key wins).
inline std::map<std::string, std::string> KeyValueFields(const std::string& line) {
  std::map<std::string, std::string> result;
  std::istringstream fields(line);
  std::string field;
  while (fields >> field) {
    const size_t eq = field.find('=');
    if (eq != std::string::npos) result[field.substr(0, eq)] = field.substr(eq + 1);
  }
  return result;
}

// The key=value fields of the "result ..." lines in a sample's output (a later line's value of a
// key wins).
inline std::map<std::string, std::string> ResultFields(const std::string& output) {
  std::map<std::string, std::string> result;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("result ", 0) != 0) continue;
    for (auto& [key, value] : KeyValueFields(line.substr(7))) result[key] = value;
  }
  return result;
}

}  // namespace orion::testing
