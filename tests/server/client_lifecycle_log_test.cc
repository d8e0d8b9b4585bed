// The registration and exit lines: who the process is (name, PID, or its pod), at most N lines a
// second with the rest counted in the next line written, and the exited clients it keeps.
#include "server/client_lifecycle_log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace orion::server {
namespace {

ClientView Process(uint32_t id, const std::string& name, uint32_t pid) {
  ClientView v;
  v.client_id = id;
  v.process_name = name;
  v.host_pid = pid;
  v.uid = 1000;
  v.kernels_launched = 42;
  v.throttled_ns = 1500000000;
  return v;
}

TEST(ClientLifecycleLogTest, NamesTheProcessOnRegistrationAndExit) {
  std::vector<std::string> lines;
  ClientLifecycleLog log([&](const std::string& l) { lines.push_back(l); });
  ClientView v = Process(3, "train", 4321);
  v.policy.memory_limit_bytes = 8ull << 30;
  log.Registered(v, 1000000000);
  log.Exited(v, 2000000000);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "orion-server: client 3 registered: train (pid 4321), uid 1000, GPU 0, best-effort, "
            "memory limit 8192 MiB");
  EXPECT_EQ(lines[1],
            "orion-server: client 3 exited: train (pid 4321), GPU 0, best-effort, 42 kernels, "
            "1.500 s held at the gate");
  ClientView pod = Process(4, "python", 99);
  pod.ns = "ml";
  pod.pod = "serve-0";
  EXPECT_EQ(ClientLifecycleLog::Who(pod), "ml/serve-0 (pid 99)");
}

TEST(ClientLifecycleLogTest, AtMostNLinesASecondAndTheRestCounted) {
  std::vector<std::string> lines;
  ClientLifecycleLog log([&](const std::string& l) { lines.push_back(l); }, 3);
  const uint64_t t0 = 5000000000;
  for (uint32_t i = 0; i < 10; ++i) log.Registered(Process(i, "p", 100 + i), t0 + i * 1000);
  EXPECT_EQ(lines.size(), 3u);
  log.Exited(Process(0, "p", 100), t0 + 999999999);  // still the same second
  EXPECT_EQ(lines.size(), 3u);
  log.Exited(Process(1, "p", 101), t0 + 1000000000);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[3], "orion-server: 8 registration/exit line(s) left out (3 a second at most)");
  EXPECT_NE(lines[4].find("client 1 exited: p (pid 101)"), std::string::npos) << lines[4];
}

TEST(ClientLifecycleLogTest, KeepsTheLastExitedClients) {
  ClientLifecycleLog log([](const std::string&) {}, 20, 2);
  for (uint32_t i = 1; i <= 3; ++i) log.Exited(Process(i, "p", i), i * 1000000000ull);
  ASSERT_EQ(log.exited().size(), 2u);
  EXPECT_EQ(log.exited().front().client_id, 2u);
  EXPECT_EQ(log.exited().back().client_id, 3u);
  EXPECT_TRUE(log.exited().back().exited);
}

}  // namespace
}  // namespace orion::server
