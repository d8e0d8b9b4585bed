// TokenReview of ServiceAccount tokens for the admin API (see token_review.h).
#include "server/token_review.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace orion::server {
namespace {

constexpr char kTokenReviewPath[] = "/apis/authentication.k8s.io/v1/tokenreviews";

// JSON string escaping for the token (tokens are base64url and dots, but never trust that).
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrCat("\\u00", c < 0x10 ? "0" : "", absl::Hex(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

const google::protobuf::Value* Field(const google::protobuf::Struct& s, const char* name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

}  // namespace

absl::StatusOr<std::string> ParseTokenReviewAnswer(long http_status, const std::string& body) {
  if (http_status != 200 && http_status != 201) {
    return absl::UnavailableError(
        absl::StrCat("token review: the API server answered HTTP ", http_status,
                     http_status == 403 ? " (the server's ServiceAccount may not create "
                                          "tokenreviews: bind it to system:auth-delegator)"
                                        : ""));
  }
  google::protobuf::Struct review;
  if (!google::protobuf::util::JsonStringToMessage(body, &review).ok()) {
    return absl::UnavailableError("token review: the API server's answer is not JSON");
  }
  const google::protobuf::Value* status = Field(review, "status");
  if (status == nullptr || !status->has_struct_value()) {
    return absl::UnavailableError("token review: the answer has no status");
  }
  const google::protobuf::Value* ok = Field(status->struct_value(), "authenticated");
  if (ok == nullptr || !ok->bool_value()) {
    const google::protobuf::Value* error = Field(status->struct_value(), "error");
    return absl::UnauthenticatedError(absl::StrCat(
        "the bearer token is not one of this orion-server's tokens, and the Kubernetes API "
        "server did not authenticate it",
        error != nullptr && !error->string_value().empty()
            ? absl::StrCat(" (", error->string_value(), ")")
            : ""));
  }
  const google::protobuf::Value* user = Field(status->struct_value(), "user");
  const google::protobuf::Value* name =
      user != nullptr && user->has_struct_value() ? Field(user->struct_value(), "username")
                                                  : nullptr;
  const std::string username = name != nullptr ? name->string_value() : "";
  // system:serviceaccount:NAMESPACE:NAME
  const std::vector<std::string> parts = absl::StrSplit(username, ':');
  if (parts.size() != 4 || parts[0] != "system" || parts[1] != "serviceaccount" ||
      parts[2].empty() || parts[3].empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the token authenticates '", username, "', not a ServiceAccount"));
  }
  return absl::StrCat(parts[2], "/", parts[3]);
}

KubeTokenReviewer::KubeTokenReviewer(std::unique_ptr<kube::KubeApi> api, TokenReviewLimits limits,
                                     Clock clock)
    : api_(std::move(api)),
      limits_(limits),
      clock_(clock ? std::move(clock) : Clock([] { return std::chrono::steady_clock::now(); })),
      bucket_(limits.burst),
      bucket_at_(clock_()) {}

size_t KubeTokenReviewer::rate_limited() const {
  absl::MutexLock lock(&mu_);
  return rate_limited_;
}

void KubeTokenReviewer::Put(Cache* cache, size_t max, const std::string& token,
                            absl::StatusOr<std::string> account,
                            std::chrono::steady_clock::time_point until) {
  if (auto it = cache->entries.find(token); it != cache->entries.end()) {
    cache->recency.erase(it->second.lru);
    cache->entries.erase(it);
  }
  while (!cache->entries.empty() && cache->entries.size() >= std::max<size_t>(1, max)) {
    cache->entries.erase(cache->recency.back());
    cache->recency.pop_back();
  }
  cache->recency.push_front(token);
  cache->entries.emplace(token, Cached{std::move(account), until, cache->recency.begin()});
}

const KubeTokenReviewer::Cached* KubeTokenReviewer::Find(
    Cache* cache, const std::string& token, std::chrono::steady_clock::time_point now) {
  auto it = cache->entries.find(token);
  if (it == cache->entries.end()) return nullptr;
  if (it->second.until <= now) {
    cache->recency.erase(it->second.lru);
    cache->entries.erase(it);
    return nullptr;
  }
  cache->recency.splice(cache->recency.begin(), cache->recency, it->second.lru);
  return &it->second;
}

bool KubeTokenReviewer::TakeFromBucket(std::chrono::steady_clock::time_point now) {
  const double elapsed = std::chrono::duration<double>(now - bucket_at_).count();
  if (elapsed > 0) {
    bucket_ = std::min(limits_.burst, bucket_ + elapsed * limits_.reviews_per_second);
    bucket_at_ = now;
  }
  if (bucket_ < 1) return false;
  bucket_ -= 1;
  return true;
}

absl::StatusOr<std::string> KubeTokenReviewer::Review(const std::string& token) {
  const auto now = clock_();
  {
    absl::MutexLock lock(&mu_);
    if (const Cached* c = Find(&accepted_, token, now)) return c->account;
    if (const Cached* c = Find(&refused_, token, now)) return c->account;
    if (!TakeFromBucket(now)) {
      ++rate_limited_;
      return absl::ResourceExhaustedError(absl::StrCat(
          "token review: more than ", limits_.reviews_per_second,
          " unknown bearer tokens a second; this one was not reviewed (retry shortly)"));
    }
  }
  const std::string request = absl::StrCat(
      R"({"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":)",
      JsonString(token), "}}");
  absl::StatusOr<kube::HttpResponse> answer = api_->Post(kTokenReviewPath, request);
  if (!answer.ok()) {
    return absl::UnavailableError(
        absl::StrCat("token review: cannot reach the API server: ", answer.status().message()));
  }
  absl::StatusOr<std::string> account = ParseTokenReviewAnswer(answer->status, answer->body);
  if (!account.ok() && account.status().code() == absl::StatusCode::kUnavailable) return account;
  absl::MutexLock lock(&mu_);
  if (account.ok()) {
    Put(&accepted_, limits_.max_accepted, token, account, now + limits_.accepted_ttl);
  } else {
    Put(&refused_, limits_.max_refused, token, account, now + limits_.refused_ttl);
  }
  return account;
}

}  // namespace orion::server
