// Admin API tokens: parsing and the per-call check (see admin_auth.h).
#include "server/admin_auth.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/token_review.h"

namespace orion::server {
namespace {

constexpr size_t kMinTokenBytes = 16;

// Compares without an early exit, so the time taken does not tell how much of a guess matched.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

const char* AdminRoleName(AdminRole role) {
  return role == AdminRole::kOperator ? "operator" : "reader";
}

absl::StatusOr<std::vector<AdminToken>> ParseAdminTokens(absl::string_view text,
                                                         const std::string& source) {
  std::vector<AdminToken> tokens;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    // Split at any ASCII white space: Authorize strips it around a presented token, so a token
    // holding some (a \v, say) could never be presented.
    std::vector<absl::string_view> fields = absl::StrSplit(
        absl::StripAsciiWhitespace(line), absl::ByAnyChar(" \t\v\f\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", what));
    };
    if (fields.size() != 3) {
      return bad(absl::StrCat("expected `ROLE NAME TOKEN`, got ", fields.size(), " field",
                              fields.size() == 1 ? "" : "s"));
    }
    AdminToken t;
    if (fields[0] == "operator") {
      t.role = AdminRole::kOperator;
    } else if (fields[0] == "reader") {
      t.role = AdminRole::kReader;
    } else {
      return bad(absl::StrCat("role must be reader or operator, got \"", fields[0], "\""));
    }
    t.name = std::string(fields[1]);
    if (fields[2].size() < kMinTokenBytes) {
      return bad(absl::StrCat("the token of ", t.name, " is shorter than ", kMinTokenBytes,
                              " characters"));
    }
    t.token = std::string(fields[2]);
    for (const AdminToken& other : tokens) {
      if (other.token == t.token) return bad(absl::StrCat("the token of ", t.name, " repeats"));
    }
    tokens.push_back(std::move(t));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens (a tokens file that "
                                                           "turns auth on must hold one)"));
  }
  return tokens;
}

absl::StatusOr<std::vector<AdminToken>> LoadAdminTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read admin tokens file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseAdminTokens(ss.str(), path);
}

void AdminAuth::AllowServiceAccounts(std::vector<std::string> operators,
                                     std::vector<std::string> readers,
                                     std::shared_ptr<TokenReviewer> reviewer) {
  sa_operators_ = std::move(operators);
  sa_readers_ = std::move(readers);
  reviewer_ = std::move(reviewer);
}

absl::StatusOr<AdminCaller> AdminAuth::Authorize(absl::string_view authorization,
                                                 absl::string_view certificate_name,
                                                 AdminRole needed) const {
  if (!enabled()) return AdminCaller{"anonymous", AdminRole::kOperator};
  auto allowed = [needed](const std::string& name, AdminRole role,
                          const char* what) -> absl::StatusOr<AdminCaller> {
    if (static_cast<int>(role) < static_cast<int>(needed)) {
      return absl::PermissionDeniedError(
          absl::StrCat(name, " holds a reader ", what, "; this call needs an operator"));
    }
    return AdminCaller{name, role};
  };
  constexpr absl::string_view kBearer = "Bearer ";
  if (absl::StartsWithIgnoreCase(authorization, kBearer)) {
    const absl::string_view presented =
        absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
    for (const AdminToken& t : tokens_) {
      if (SameSecret(presented, t.token)) return allowed(t.name, t.role, "token");
    }
    if (reviewer_ == nullptr) {
      return absl::UnauthenticatedError(
          "the bearer token is not one of this orion-server's tokens");
    }
    absl::StatusOr<std::string> account = reviewer_->Review(std::string(presented));
    if (!account.ok()) {
      // Past the review rate the caller may retry; any other failure is a refusal.
      if (account.status().code() == absl::StatusCode::kResourceExhausted) return account.status();
      return absl::UnauthenticatedError(account.status().message());
    }
    const std::string name = absl::StrCat("serviceaccount ", *account);
    auto listed = [&account](const std::vector<std::string>& list) {
      return std::find(list.begin(), list.end(), *account) != list.end();
    };
    if (listed(sa_operators_)) return allowed(name, AdminRole::kOperator, "token");
    if (listed(sa_readers_)) return allowed(name, AdminRole::kReader, "token");
    return absl::PermissionDeniedError(
        absl::StrCat(name, " is in neither admin_auth.service_accounts list"));
  }
  if (!certificate_name.empty()) {
    if (tokens_.empty()) {
      return allowed(std::string(certificate_name), AdminRole::kOperator, "certificate");
    }
    for (const AdminToken& t : tokens_) {
      if (t.name == certificate_name) return allowed(t.name, t.role, "certificate");
    }
    return absl::UnauthenticatedError(absl::StrCat(
        "the client certificate's name '", certificate_name,
        "' is not a NAME of this orion-server's tokens file: present a token"));
  }
  return absl::UnauthenticatedError(
      client_certificates_
          ? "this orion-server requires a client certificate (orion-ctl --cacert CA --cert "
            "CERT --key KEY; grpcurl -cacert CA -cert CERT -key KEY)"
          : "this orion-server requires a token: send metadata 'authorization: Bearer TOKEN' "
            "(orion-ctl --token-file FILE, grpcurl -H 'authorization: Bearer ...')");
}

}  // namespace orion::server
