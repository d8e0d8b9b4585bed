// Kubernetes ServiceAccount tokens on the admin API: the answer of a TokenReview parsed, and a
// real orion-server asking a test API server (a test double of kube-apiserver's TokenReview
// endpoint, tests/agent/test_api_server.h) whose a bearer token is: a reader account reads and
// cannot change anything, an operator account can, an account in neither list and a token the
// API server does not know are refused, and answers are cached. Made-up tokens are bounded: a
// flood of them costs at most the rate limit's reviews and evicts no accepted token.
#include "server/token_review.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "orion/v1/admin.grpc.pb.h"
#include "tests/agent/test_api_server.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

TEST(TokenReviewTest, AnswersAreParsedIntoAccountsOrClearRefusals) {
  auto ok = ParseTokenReviewAnswer(
      201, R"({"status":{"authenticated":true,"user":{"username":"system:serviceaccount:ops:admin"}}})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "ops/admin");
  auto refused = ParseTokenReviewAnswer(
      201, R"({"status":{"authenticated":false,"error":"token expired"}})");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(refused.status().message().find("token expired"), absl::string_view::npos);
  auto user = ParseTokenReviewAnswer(
      201, R"({"status":{"authenticated":true,"user":{"username":"kubernetes-admin"}}})");
  EXPECT_EQ(user.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(user.status().message().find("not a ServiceAccount"), absl::string_view::npos);
  auto forbidden = ParseTokenReviewAnswer(403, "{}");
  EXPECT_EQ(forbidden.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(forbidden.status().message().find("system:auth-delegator"), absl::string_view::npos);
  EXPECT_EQ(ParseTokenReviewAnswer(201, "not json").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(ParseTokenReviewAnswer(201, R"({"kind":"TokenReview"})").status().code(),
            absl::StatusCode::kUnavailable);
}

class ServiceAccountAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api_.AddToken("sa-token-grafana-0123456789", "system:serviceaccount:monitoring:grafana");
    api_.AddToken("sa-token-admin-0123456789", "system:serviceaccount:ops:admin");
    api_.AddToken("sa-token-other-0123456789", "system:serviceaccount:default:default");
    dir_ = testing::MakeTempDir();
    cfg_ = testing::TestConfig(dir_);
    cfg_.admin_service_account_operators = {"ops/admin"};
    cfg_.admin_service_account_readers = {"monitoring/grafana"};
    cfg_.admin_kubernetes_api = api_.base_url();
    server_ = testing::StartServer(cfg_);
    ASSERT_NE(server_, nullptr);
    admin_ = orion::v1::Admin::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->admin_port()),
                            grpc::InsecureChannelCredentials()));
  }
  grpc::Status ListGpus(const std::string& token) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    orion::v1::ListGpusResponse resp;
    return admin_->ListGpus(&ctx, orion::v1::ListGpusRequest(), &resp);
  }
  grpc::Status SetBudget(const std::string& token) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    orion::v1::SetPolicyRequest r;
    r.set_gpu(0);
    r.mutable_knobs()->set_be_budget_us(777);
    r.add_fields("be_budget_us");
    orion::v1::PolicyKnobs resp;
    return admin_->SetPolicy(&ctx, r, &resp);
  }

  agent::testing::TestApiServer api_;
  std::string dir_;
  ServerConfig cfg_;
  std::unique_ptr<OrionServer> server_;
  std::unique_ptr<orion::v1::Admin::Stub> admin_;
};

TEST_F(ServiceAccountAuthTest, TheApiServerSaysWhoAndTheListsSayWhatTheyMayDo) {
  EXPECT_EQ(ListGpus("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ListGpus("sa-token-grafana-0123456789").ok());
  const grpc::Status reader_set = SetBudget("sa-token-grafana-0123456789");
  EXPECT_EQ(reader_set.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(reader_set.error_message().find("serviceaccount monitoring/grafana holds a reader"),
            std::string::npos)
      << reader_set.error_message();
  const grpc::Status op = SetBudget("sa-token-admin-0123456789");
  EXPECT_TRUE(op.ok()) << op.error_message();
  const grpc::Status other = ListGpus("sa-token-other-0123456789");
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(other.error_message().find("default/default is in neither"), std::string::npos)
      << other.error_message();
  const grpc::Status unknown = ListGpus("not-a-token-the-api-server-knows");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(unknown.error_message().find("invalid bearer token"), std::string::npos)
      << unknown.error_message();
  // Answers are cached: the reader's token is not reviewed again within a minute.
  const size_t reviews = api_.token_reviews();
  EXPECT_TRUE(ListGpus("sa-token-grafana-0123456789").ok());
  EXPECT_TRUE(ListGpus("sa-token-grafana-0123456789").ok());
  EXPECT_EQ(api_.token_reviews(), reviews);
}

// A test double of the API server's TokenReview endpoint: accepts tokens it was given, counts
// every review.
class FakeReviewApi final : public kube::KubeApi {
 public:
  explicit FakeReviewApi(size_t* reviews) : reviews_(reviews) {}
  absl::StatusOr<kube::HttpResponse> Get(const std::string&) override {
    return absl::UnimplementedError("get");
  }
  absl::StatusOr<kube::HttpResponse> Post(const std::string&, const std::string& json) override {
    ++*reviews_;
    const bool valid = json.find("\"valid-") != std::string::npos;
    const std::string name = valid ? json.substr(json.find("valid-") + 6, 4) : "";
    if (!valid) {
      return kube::HttpResponse{
          201, R"({"status":{"authenticated":false,"error":"invalid bearer token"}})"};
    }
    return kube::HttpResponse{201, R"({"status":{"authenticated":true,"user":{"username":)"
                                   R"("system:serviceaccount:ns:)" +
                                       name + R"("}}})"};
  }
  absl::StatusOr<long> Stream(const std::string&, const std::function<bool(std::string_view)>&,
                              const std::atomic<bool>*, std::string*) override {
    return absl::UnimplementedError("stream");
  }

 private:
  size_t* reviews_;
};

class BoundedReviewTest : public ::testing::Test {
 protected:
  std::unique_ptr<KubeTokenReviewer> Make(TokenReviewLimits limits = {}) {
    return std::make_unique<KubeTokenReviewer>(std::make_unique<FakeReviewApi>(&reviews_), limits,
                                               [this] { return now_; });
  }
  size_t reviews_ = 0;
  std::chrono::steady_clock::time_point now_ = std::chrono::steady_clock::time_point() +
                                               std::chrono::hours(1);
};

TEST_F(BoundedReviewTest, BogusTokensCostAtMostTheBucketAndEvictNoValidToken) {
  auto reviewer = Make();
  ASSERT_TRUE(reviewer->Review("valid-good").ok());
  ASSERT_EQ(reviews_, 1u);
  // 1,024 distinct made-up tokens at once: the bucket (burst 20, one taken) allows 19 reviews.
  size_t refused = 0, limited = 0;
  for (int i = 0; i < 1024; ++i) {
    auto r = reviewer->Review("bogus-" + std::to_string(i));
    ASSERT_FALSE(r.ok());
    if (r.status().code() == absl::StatusCode::kUnauthenticated) ++refused;
    if (r.status().code() == absl::StatusCode::kResourceExhausted) ++limited;
  }
  std::printf("1024 bogus tokens at once: %zu reviews, %zu refused by the API server, %zu "
              "rate-limited\n", reviews_ - 1, refused, limited);
  EXPECT_LE(reviews_ - 1, 20u);
  EXPECT_EQ(refused + limited, 1024u);
  EXPECT_EQ(reviewer->rate_limited(), limited);
  // The valid token is still cached: no review.
  ASSERT_TRUE(reviewer->Review("valid-good").ok());
  EXPECT_LE(reviews_ - 1, 20u);
  const size_t before = reviews_;
  // Spread over 10 s, the same flood costs at most the burst plus 10 a second.
  for (int i = 0; i < 1024; ++i) {
    now_ += std::chrono::milliseconds(10);
    (void)reviewer->Review("later-bogus-" + std::to_string(i));
  }
  std::printf("1024 bogus tokens over 10.24 s: %zu reviews\n", reviews_ - before);
  EXPECT_LE(reviews_ - before, 20u + 103u);
  auto good = reviewer->Review("valid-good");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, "ns/good");
}

TEST_F(BoundedReviewTest, RefusalsAreRememberedForAMinute) {
  auto reviewer = Make();
  EXPECT_EQ(reviewer->Review("bogus").status().code(), absl::StatusCode::kUnauthenticated);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(reviewer->Review("bogus").status().code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(reviews_, 1u);
  now_ += std::chrono::seconds(59);
  (void)reviewer->Review("bogus");
  EXPECT_EQ(reviews_, 1u);
  now_ += std::chrono::seconds(2);
  (void)reviewer->Review("bogus");
  EXPECT_EQ(reviews_, 2u);
}

TEST_F(BoundedReviewTest, AcceptedTokensAreEvictedLeastRecentlyUsedFirst) {
  TokenReviewLimits limits;
  limits.max_accepted = 3;
  auto reviewer = Make(limits);
  for (const char* t : {"valid-aaaa", "valid-bbbb", "valid-cccc"}) {
    ASSERT_TRUE(reviewer->Review(t).ok());
  }
  ASSERT_TRUE(reviewer->Review("valid-aaaa").ok());  // used: bbbb is now the oldest
  EXPECT_EQ(reviews_, 3u);
  ASSERT_TRUE(reviewer->Review("valid-dddd").ok());  // evicts bbbb only
  EXPECT_EQ(reviews_, 4u);
  ASSERT_TRUE(reviewer->Review("valid-aaaa").ok());
  ASSERT_TRUE(reviewer->Review("valid-cccc").ok());
  EXPECT_EQ(reviews_, 4u);
  ASSERT_TRUE(reviewer->Review("valid-bbbb").ok());
  EXPECT_EQ(reviews_, 5u);
}

TEST_F(ServiceAccountAuthTest, AFloodOfBogusTokensThroughTheAdminApiIsBounded) {
  ASSERT_TRUE(ListGpus("sa-token-grafana-0123456789").ok());
  const size_t reviews = api_.token_reviews();
  const auto start = std::chrono::steady_clock::now();
  size_t exhausted = 0;
  for (int i = 0; i < 1024; ++i) {
    const grpc::Status s = ListGpus("bogus-token-" + std::to_string(i) + "-0123456789");
    ASSERT_FALSE(s.ok());
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t made = api_.token_reviews() - reviews;
  std::printf("admin API, 1024 bogus tokens in %.2f s: %zu TokenReviews, %zu "
              "RESOURCE_EXHAUSTED\n",
              seconds, made, exhausted);
  EXPECT_LE(made, static_cast<size_t>(20 + 10 * seconds + 1));
  EXPECT_GT(exhausted, 0u);
  EXPECT_TRUE(ListGpus("sa-token-grafana-0123456789").ok());
  EXPECT_EQ(api_.token_reviews() - reviews, made);  // still cached: no new review
}

TEST(ServiceAccountConfigTest, AccountsAreNamespaceSlashName) {
  auto c = ParseServerConfig("admin_auth: {service_accounts: {readers: [grafana]}}", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("admin_auth.service_accounts.readers[0]: expected "
                                      "namespace/name of a ServiceAccount"),
            absl::string_view::npos)
      << c.status();
  auto good = ParseServerConfig(
      "admin_auth: {service_accounts: {operators: [ops/admin], readers: [mon/grafana]}}", "t");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->admin_service_account_operators, std::vector<std::string>{"ops/admin"});
}

}  // namespace
}  // namespace orion::server
