// Tenant-supplied strings with invalid UTF-8 (its comm, kernel and NVTX range names) must not
// blind operators: the admin API's answers and /metrics stay valid, with U+FFFD in their place.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "orion/v1/admin.grpc.pb.h"
#include "server/utf8.h"
#include "tests/http_get.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Event;
using contract::EventKind;
using contract::Priority;

constexpr char kBad[] = "\xff\xfe";
constexpr char kShown[] = "\xEF\xBF\xBD\xEF\xBF\xBD";  // two U+FFFD

TEST(Utf8Test, InvalidBytesAreReplacedAndValidTextKept) {
  EXPECT_EQ(SanitizeUtf8("resnet50 \xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x9A\x80"),
            "resnet50 \xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x9A\x80");
  EXPECT_EQ(SanitizeUtf8(std::string(kBad) + "x"), std::string(kShown) + "x");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), std::string(kShown));           // overlong '/'
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(SanitizeUtf8("ab\xE2\x82"), "ab\xEF\xBF\xBD\xEF\xBF\xBD");  // cut short
  EXPECT_EQ(SanitizeUtf8("a\x1b[31mb\n"), "a\xEF\xBF\xBD[31mb\xEF\xBF\xBD");  // controls
}

TEST(TenantStringsTest, InvalidUtf8ReachesNoAnswerRaw) {
  const std::string dir = testing::MakeTempDir();
  ServerConfig cfg = testing::TestConfig(dir);
  auto server = testing::StartServer(cfg);
  ASSERT_NE(server, nullptr);
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = fork();
  if (child == 0) {
    // Its comm, its kernel's name and its NVTX range's name carry invalid bytes.
    prctl(PR_SET_NAME, (std::string(kBad) + "comm").c_str());
    contract::RegisterReply reply{};
    testing::ClientMaps maps;
    const int fd = testing::RegisterClient(
        cfg.socket_path, testing::MakeRequest(cfg.gpus[0].c_str(), Priority::kHigh), &reply,
        &maps);
    if (fd < 0 || reply.status != 0 || maps.area == nullptr) _exit(3);
    Event e{};
    e.kind = EventKind::kKernelName;
    e.func = 0x77;
    std::snprintf(e.name, sizeof(e.name), "%sgemm", kBad);
    maps.area->ring.TryPush(e);
    e = Event{};
    e.kind = EventKind::kLaunch;
    e.func = 0x77;
    e.cpu_ns = MonotonicNs();
    e.grid[0] = e.grid[1] = e.grid[2] = 1;
    e.block[0] = e.block[1] = e.block[2] = 32;
    maps.area->ring.TryPush(e);
    e = Event{};
    e.kind = EventKind::kRange;
    e.cpu_ns = MonotonicNs();
    e.duration_ns = 1000;
    std::snprintf(e.name, sizeof(e.name), "%sstep", kBad);
    maps.area->ring.TryPush(e);
    (void)!write(ready[1], "r", 1);
    char c;
    (void)!read(done[0], &c, 1);
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_TRUE(testing::WaitFor([&] { return server->state().Snapshot().events_ingested >= 3; }));

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->admin_port()),
                                     grpc::InsecureChannelCredentials());
  auto admin = orion::v1::Admin::NewStub(channel);
  grpc::ClientContext list_ctx;
  orion::v1::ListClientsResponse clients;
  ASSERT_TRUE(admin->ListClients(&list_ctx, {}, &clients).ok());
  ASSERT_EQ(clients.clients_size(), 1);
  EXPECT_EQ(clients.clients(0).process_name(), std::string(kShown) + "comm");

  grpc::ClientContext profile_ctx;
  orion::v1::KernelProfileRequest profile_req;
  profile_req.set_client_id(clients.clients(0).client_id());
  orion::v1::KernelProfileResponse profile;
  ASSERT_TRUE(admin->GetKernelProfile(&profile_ctx, profile_req, &profile).ok());
  ASSERT_EQ(profile.kernels_size(), 1);
  EXPECT_EQ(profile.kernels(0).name(), std::string(kShown) + "gemm");

  grpc::ClientContext timeline_ctx;
  orion::v1::TimelineRequest timeline_req;
  orion::v1::TimelineResponse timeline;
  ASSERT_TRUE(admin->GetTimeline(&timeline_ctx, timeline_req, &timeline).ok());
  bool kernel = false, step = false;
  for (const auto& s : timeline.spans()) {
    kernel = kernel || s.name() == std::string(kShown) + "gemm";
    step = step || s.name() == std::string(kShown) + "step";
  }
  EXPECT_TRUE(kernel);
  EXPECT_TRUE(step);

  // Standalone, the process name is the pod label of the client's series.
  const std::string metrics = orion::testing::HttpGet(server->metrics_port(), "/metrics");
  EXPECT_NE(metrics.find(std::string("pod=\"") + kShown + "comm\""), std::string::npos);
  EXPECT_EQ(metrics.find(kBad), std::string::npos);
  (void)!write(done[1], "d", 1);
  waitpid(child, nullptr, 0);
}

}  // namespace
}  // namespace orion::server
