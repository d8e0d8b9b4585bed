// Kubernetes ServiceAccount tokens on the admin API: the answer of a TokenReview parsed, and a
// real orion-server asking a test API server (a test double of kube-apiserver's TokenReview
// endpoint, tests/agent/test_api_server.h) whose a bearer token is: a reader account reads and
// cannot change anything, an operator account can, an account in neither list and a token the
// API server does not know are refused, and answers are cached.
#include "server/token_review.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

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
