// Who may call the admin API: bearer tokens with one of two roles, read from a tokens file, and
// client certificates (when the admin API requires them over TLS).
//
// A tokens file has one token a line, `ROLE NAME TOKEN` (ROLE: reader or operator; NAME: who
// holds it, for the audit log), with blank lines and `#` comments allowed:
//
//   operator alice  3f9c...   # may change priorities, pause, resume, set the policy
//   reader   grafana 77ab...  # may list, get, read timelines and profiles
//
// Usage:
//   auto tokens = LoadAdminTokens("/etc/orion/admin-tokens/tokens");   // or ParseAdminTokens
//   AdminAuth auth(std::move(*tokens));
//   absl::StatusOr<AdminCaller> who = auth.Authorize(authorization_header, AdminRole::kOperator);
//
// A bearer token that is not in the tokens file may be a Kubernetes ServiceAccount token: with
// service accounts allowed (admin_auth.service_accounts), the API server is asked whose it is
// (TokenReview, token_review.h) and the account's role is the list it is in.
//
// A caller that presented a client certificate the server verified (TLS with client_ca_file) is
// known by its certificate's common name: with a tokens file, the line whose NAME is that CN gives
// its role (no token needed); without one, every such caller is an operator. A bearer token, when
// sent, decides instead.
//
// With no tokens and no client certificates the API is open (every caller is an anonymous
// operator): the server then listens on loopback by default, and says so at start when it does
// not.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace orion::server {

enum class AdminRole { kReader = 0, kOperator = 1 };  // an operator may do what a reader may

const char* AdminRoleName(AdminRole role);

struct AdminToken {
  AdminRole role = AdminRole::kReader;
  std::string name;
  std::string token;
};

class TokenReviewer;

struct AdminCaller {
  std::string name;  // "anonymous" when auth is off
  AdminRole role = AdminRole::kOperator;
};

// Errors name the source, the line and what was wrong (never the token itself).
absl::StatusOr<std::vector<AdminToken>> ParseAdminTokens(absl::string_view text,
                                                         const std::string& source);
absl::StatusOr<std::vector<AdminToken>> LoadAdminTokens(const std::string& path);

class AdminAuth {
 public:
  explicit AdminAuth(std::vector<AdminToken> tokens, bool client_certificates = false)
      : tokens_(std::move(tokens)), client_certificates_(client_certificates) {}
  bool enabled() const { return !tokens_.empty() || client_certificates_ || reviewer_ != nullptr; }

  // ServiceAccount tokens: the accounts ("namespace/name") of each role, and who asks the API
  // server whose a token is.
  void AllowServiceAccounts(std::vector<std::string> operators, std::vector<std::string> readers,
                            std::shared_ptr<TokenReviewer> reviewer);

  // `authorization` is the request's "authorization" metadata ("Bearer TOKEN"; empty if absent);
  // `certificate_name` the common name of the caller's verified client certificate (empty if
  // none). UNAUTHENTICATED without a known token or certificate, PERMISSION_DENIED for a reader
  // where an operator is needed.
  absl::StatusOr<AdminCaller> Authorize(absl::string_view authorization,
                                        absl::string_view certificate_name,
                                        AdminRole needed) const;

 private:
  std::vector<AdminToken> tokens_;
  bool client_certificates_;
  std::vector<std::string> sa_operators_, sa_readers_;
  std::shared_ptr<TokenReviewer> reviewer_;
};

}  // namespace orion::server
