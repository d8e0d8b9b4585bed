// Admin callers that present a Kubernetes ServiceAccount token instead of a token of the tokens
// file: the API server says whose token it is (TokenReview, authentication.k8s.io/v1), and
// admin_auth.service_accounts says what that account may do. Answers are cached briefly, so a
// dashboard polling every few seconds costs one review a minute.
//
// Usage:
//   auto reviewer = std::make_shared<KubeTokenReviewer>(std::make_unique<kube::CurlKubeApi>(cfg));
//   absl::StatusOr<std::string> account = reviewer->Review(token);   // "namespace/name"
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kube/kube_api.h"

namespace orion::server {

class TokenReviewer {
 public:
  virtual ~TokenReviewer() = default;
  // The ServiceAccount `token` authenticates as, "namespace/name"; UNAUTHENTICATED when the API
  // server says it is not valid or not a ServiceAccount's, UNAVAILABLE when it cannot be asked.
  virtual absl::StatusOr<std::string> Review(const std::string& token) = 0;
};

// Parses a TokenReview answer (JSON) into "namespace/name"; errors say what was wrong.
absl::StatusOr<std::string> ParseTokenReviewAnswer(long http_status, const std::string& body);

class KubeTokenReviewer final : public TokenReviewer {
 public:
  explicit KubeTokenReviewer(std::unique_ptr<kube::KubeApi> api) : api_(std::move(api)) {}
  // Asks the API server, or answers from the cache: 60 s for a known account, 5 s for a refusal
  // (an outage is never cached).
  absl::StatusOr<std::string> Review(const std::string& token) override;

 private:
  struct Cached {
    absl::StatusOr<std::string> account;
    std::chrono::steady_clock::time_point until;
  };
  std::unique_ptr<kube::KubeApi> api_;
  absl::Mutex mu_;
  std::map<std::string, Cached> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orion::server
