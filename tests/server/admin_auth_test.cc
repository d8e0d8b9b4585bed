// Admin API tokens: the tokens file format (errors name the line and never the token) and the
// per-call check (no token, unknown token, reader where an operator is needed).
#include "server/admin_auth.h"

#include <gtest/gtest.h>

namespace orion::server {
namespace {

TEST(AdminTokensTest, ParsesRolesNamesAndComments) {
  auto t = ParseAdminTokens("# node operators\n\noperator alice aaaaaaaaaaaaaaaa  # on call\n"
                            "reader\tgrafana  bbbbbbbbbbbbbbbb\n",
                            "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].role, AdminRole::kOperator);
  EXPECT_EQ((*t)[0].name, "alice");
  EXPECT_EQ((*t)[1].role, AdminRole::kReader);
  EXPECT_EQ((*t)[1].token, "bbbbbbbbbbbbbbbb");
}

TEST(AdminTokensTest, BadLinesSayWhereAndWhat) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"operator alice\n", "tokens:1: expected `ROLE NAME TOKEN`, got 2 fields"},
           Case{"\nadmin bob cccccccccccccccc\n", "tokens:2: role must be reader or operator"},
           Case{"reader carol short\n", "tokens:1: the token of carol is shorter than 16"},
           Case{"reader a dddddddddddddddd\noperator b dddddddddddddddd\n",
                "tokens:2: the token of b repeats"},
           Case{"# nothing\n", "tokens: no tokens"},
       }) {
    auto t = ParseAdminTokens(c.text, "tokens");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(t.status().message()).find(c.message), std::string::npos)
        << t.status();
    EXPECT_EQ(std::string(t.status().message()).find("dddddddddddddddd"), std::string::npos);
  }
  EXPECT_EQ(LoadAdminTokens("/nonexistent/tokens").status().code(), absl::StatusCode::kNotFound);
}

TEST(AdminAuthTest, ChecksTokenAndRole) {
  AdminAuth auth(*ParseAdminTokens(
      "operator alice aaaaaaaaaaaaaaaa\nreader grafana bbbbbbbbbbbbbbbb\n", "t"));
  ASSERT_TRUE(auth.enabled());
  auto op = auth.Authorize("Bearer aaaaaaaaaaaaaaaa", "", AdminRole::kOperator);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->name, "alice");
  auto reader = auth.Authorize("bearer bbbbbbbbbbbbbbbb", "", AdminRole::kReader);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->role, AdminRole::kReader);
  EXPECT_EQ(auth.Authorize("Bearer bbbbbbbbbbbbbbbb", "", AdminRole::kOperator).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize("", "", AdminRole::kReader).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize("Bearer aaaaaaaaaaaaaaab", "", AdminRole::kReader).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize("Basic aaaaaaaaaaaaaaaa", "", AdminRole::kReader).status().code(),
            absl::StatusCode::kUnauthenticated);
}

// A verified client certificate's common name: the tokens line of that NAME gives the role; a
// name in no line must bring a token; without tokens every certificate holder is an operator; a
// token, when sent, decides.
TEST(AdminAuthTest, ClientCertificateNamesFindTheirRole) {
  AdminAuth auth(*ParseAdminTokens(
                     "operator alice aaaaaaaaaaaaaaaa\nreader grafana bbbbbbbbbbbbbbbb\n", "t"),
                 /*client_certificates=*/true);
  auto alice = auth.Authorize("", "alice", AdminRole::kOperator);
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(auth.Authorize("", "grafana", AdminRole::kReader)->role, AdminRole::kReader);
  const auto denied = auth.Authorize("", "grafana", AdminRole::kOperator);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.status().message().find("reader certificate"), absl::string_view::npos);
  EXPECT_EQ(auth.Authorize("", "mallory", AdminRole::kReader).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize("Bearer bbbbbbbbbbbbbbbb", "mallory", AdminRole::kReader)->name,
            "grafana");
  EXPECT_EQ(auth.Authorize("Bearer bbbbbbbbbbbbbbbb", "alice", AdminRole::kOperator)
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);  // the token decides
  const auto none = auth.Authorize("", "", AdminRole::kReader);
  EXPECT_NE(none.status().message().find("requires a client certificate"),
            absl::string_view::npos);

  AdminAuth certificates_only({}, /*client_certificates=*/true);
  EXPECT_TRUE(certificates_only.enabled());
  auto anyone = certificates_only.Authorize("", "ci-bot", AdminRole::kOperator);
  ASSERT_TRUE(anyone.ok());
  EXPECT_EQ(anyone->name, "ci-bot");
  EXPECT_EQ(certificates_only.Authorize("", "", AdminRole::kReader).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AdminAuthTest, NoTokensMeansOpen) {
  AdminAuth open({});
  EXPECT_FALSE(open.enabled());
  auto caller = open.Authorize("", "", AdminRole::kOperator);
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->name, "anonymous");
}

}  // namespace
}  // namespace orion::server
