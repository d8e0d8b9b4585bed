// /metrics over real HTTP: the orion_* families with node/gpu/pod/priority labels, exposition
// accepted by `promtool check metrics`, and a scrape with 256 registered clients timed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "tests/http_get.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {


std::string FindPromtool() {
  for (const char* p : {"/usr/bin/promtool", "/usr/local/bin/promtool"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return {};
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    cfg_ = testing::TestConfig(dir_);
    server_ = testing::StartServer(cfg_);
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(server_->metrics_port(), 0);
  }
  // A best-effort client of the first GPU, its area mapped into *maps; -1 where it failed.
  int RegisterBestEffort(testing::ClientMaps* maps) {
    contract::RegisterReply reply{};
    const int fd = testing::RegisterClient(
        cfg_.socket_path,
        testing::MakeRequest(cfg_.gpus[0].c_str(), contract::Priority::kBestEffort), &reply,
        maps);
    return fd >= 0 && maps->area != nullptr ? fd : -1;
  }
  // The best-effort client's series of `family` in a fresh scrape (-1: none); below.
  double BestEffortSeries(const std::string& family);

  std::string dir_;
  ServerConfig cfg_;
  std::unique_ptr<OrionServer> server_;
};

TEST_F(MetricsTest, ExpositionHasTheOrionFamiliesAndPassesPromtool) {
  contract::RegisterReply hp{}, be{};
  testing::ClientMaps hp_maps, be_maps;
  const int f1 = testing::RegisterClient(
      cfg_.socket_path, testing::MakeRequest(cfg_.gpus[0].c_str(), contract::Priority::kHigh, 1 << 30),
      &hp, &hp_maps);
  const int f2 = testing::RegisterClient(
      cfg_.socket_path, testing::MakeRequest(cfg_.gpus[0].c_str(), contract::Priority::kBestEffort),
      &be, &be_maps);
  ASSERT_GE(f1, 0);
  ASSERT_GE(f2, 0);
  ASSERT_NE(hp_maps.area, nullptr);
  ASSERT_NE(be_maps.area, nullptr);
  hp_maps.area->counters.memory_used_bytes.store(5 << 20);
  be_maps.area->counters.throttled_ns.store(1500000000);
  contract::Event e{};
  e.kind = contract::EventKind::kBusyPeriod;
  e.duration_ns = 3000000;
  ASSERT_TRUE(hp_maps.area->ring.TryPush(e));
  ASSERT_TRUE(testing::WaitFor([&] { return hp_maps.area->ring.tail.load() == 1; }));

  const std::string text = orion::testing::HttpGet(server_->metrics_port(), "/metrics");
  for (const char* want :
       {"orion_clients{node=\"test-node\",gpu=\"0\",priority=\"high\"} 1",
        "orion_client_memory_used_bytes{node=\"test-node\",gpu=\"0\",pod=\"",
        "orion_client_memory_limit_bytes{", "orion_client_kernels_launched_total{",
        "orion_client_events_dropped_total{", "orion_gpu_busy_seconds_total{",
        "orion_gpu_high_priority_busy{", "orion_policy_be_budget_seconds{",
        "orion_gpu_high_priority_pods{node=\"test-node\",gpu=\"0\"} 1",
        "orion_gpu_high_priority_pods_allowed{node=\"test-node\",gpu=\"0\"} 1",
        "orion_registrations_total{node=\"test-node\",result=\"ok\"} 2",
        "orion_events_ingested_total{node=\"test-node\"} 1",
        "orion_events_written_total{node=\"test-node\"} 1",
        "orion_events_skipped_total{node=\"test-node\"} 0",
        "orion_events_dropped_total{node=\"test-node\"} 0",
        "orion_hp_busy_period_seconds_bucket{", "le=\"0.005\"} 1",
        "orion_hp_busy_period_seconds_count{"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\n" << text;
  }
  EXPECT_NE(text.find("orion_client_throttled_seconds_total{node=\"test-node\",gpu=\"0\",pod=\"") ,
            std::string::npos);
  EXPECT_NE(text.find("namespace=\"_standalone\",priority=\"best-effort\""), std::string::npos);

  const std::string promtool = FindPromtool();
  if (promtool.empty()) GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  const std::string file = dir_ + "/metrics.txt";
  std::ofstream(file) << text;
  const std::string cmd = promtool + " check metrics < " + file + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  close(f1);
  close(f2);
}

// A client that leaves with events in its ring: published ones are ingested (also those behind a
// hole), one it claimed and never published (killed mid-write) is counted as skipped, and its drops stay in the node's
// total after its slot is freed. Nothing leaves the books unreported.
TEST_F(MetricsTest, DepartedClientsEventsStayAccountedFor) {
  contract::RegisterReply be{};
  testing::ClientMaps maps;
  const int fd = testing::RegisterClient(
      cfg_.socket_path, testing::MakeRequest(cfg_.gpus[0].c_str(), contract::Priority::kBestEffort),
      &be, &maps);
  ASSERT_GE(fd, 0);
  ASSERT_NE(maps.area, nullptr);
  auto& ring = maps.area->ring;
  ring.dropped.store(5);
  contract::Event e{};
  e.kind = contract::EventKind::kBusyPeriod;
  e.duration_ns = 1000;
  // A hole first (claimed, never published), then two events behind it: the server cannot drain
  // past the hole while the client lives; when it leaves, the hole is skipped and both are read.
  ring.head.fetch_add(1);
  ASSERT_TRUE(ring.TryPush(e));
  ASSERT_TRUE(ring.TryPush(e));
  close(fd);  // the client leaves
  ASSERT_TRUE(testing::WaitFor([&] { return server_->state().ListClients({}).empty(); }));
  const std::string text = orion::testing::HttpGet(server_->metrics_port(), "/metrics");
  for (const char* want : {"orion_events_written_total{node=\"test-node\"} 3",
                           "orion_events_skipped_total{node=\"test-node\"} 1",
                           "orion_events_ingested_total{node=\"test-node\"} 2",
                           "orion_events_dropped_total{node=\"test-node\"} 5"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\n" << text;
  }
}

// The value of the one series of `family` in an exposition whose labels contain `match`.
double SeriesValue(const std::string& text, const std::string& family, const std::string& match) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(family + "{", 0) == 0 && line.find(match) != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

double MetricsTest::BestEffortSeries(const std::string& family) {
  return SeriesValue(orion::testing::HttpGet(server_->metrics_port(), "/metrics"), family,
                     "priority=\"best-effort\"");
}

TEST_F(MetricsTest, HeldSecondsShowAWaitInProgressAndNeverGoBack) {
  testing::ClientMaps maps;
  const int fd = RegisterBestEffort(&maps);
  ASSERT_GE(fd, 0);
  auto held = [&] { return BestEffortSeries("orion_client_throttled_seconds_total"); };
  auto& counters = maps.area->counters;
  usleep(600'000);  // held time is bounded by the client's life: give it some
  counters.throttled_ns.store(100'000'000);  // 0.1 s of finished waits
  EXPECT_DOUBLE_EQ(held(), 0.1);
  // A wait in progress for 0.2 s: shown before it ends, and growing.
  ASSERT_TRUE(contract::PublishWaitStart(counters, server::MonotonicNs() - 200'000'000));
  const double during = held();
  EXPECT_GE(during, 0.3);
  EXPECT_LT(during, 0.45);
  usleep(50'000);
  EXPECT_GT(held(), during);
  // The client takes its published start back without adding it (a tenant may): the counter
  // does not go back.
  counters.waiting_since_ns.store(0);
  const double after = held();
  EXPECT_GE(after, during);
  // Nor does it show more than the client has lived, whatever it writes.
  counters.throttled_ns.store(1000'000'000'000);
  EXPECT_LT(held(), 5.0);
  EXPECT_GE(held(), after);
  close(fd);
}

// The releases of a client's GPU hold past its bound (client-written, as its held time): shown
// per client from 0, and never going back when the client writes less.
TEST_F(MetricsTest, GpuHoldReleasesShowPerClientAndNeverGoBack) {
  testing::ClientMaps maps;
  const int fd = RegisterBestEffort(&maps);
  ASSERT_GE(fd, 0);
  auto releases = [&] { return BestEffortSeries("orion_client_gpu_hold_releases_total"); };
  EXPECT_DOUBLE_EQ(releases(), 0);
  maps.area->counters.hold_releases.store(3);
  EXPECT_DOUBLE_EQ(releases(), 3);
  maps.area->counters.hold_releases.store(1);
  EXPECT_DOUBLE_EQ(releases(), 3);
  close(fd);
}

TEST_F(MetricsTest, ScrapeWith256ClientsIsFast) {
  std::vector<int> fds;
  for (uint32_t i = 0; i < contract::kMaxSlots; ++i) {
    contract::RegisterReply r{};
    const int fd = testing::RegisterClient(
        cfg_.socket_path,
        testing::MakeRequest(cfg_.gpus[i % 2].c_str(),
                             i % 4 ? contract::Priority::kBestEffort : contract::Priority::kHigh),
        &r);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(r.status, 0u);
    fds.push_back(fd);
  }
  orion::testing::HttpGet(server_->metrics_port(), "/metrics");  // warm up
  double worst_ms = 0;
  size_t bytes = 0;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    bytes = orion::testing::HttpGet(server_->metrics_port(), "/metrics").size();
    worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(
                                      std::chrono::steady_clock::now() - t0)
                                      .count());
  }
  std::printf("/metrics with 256 clients: %zu bytes, slowest of 10 scrapes %.2f ms\n", bytes,
              worst_ms);
  EXPECT_GT(bytes, 256u * 6 * 100);  // every client appears in every per-client family
  for (int fd : fds) close(fd);
}

}  // namespace
}  // namespace orion::server
