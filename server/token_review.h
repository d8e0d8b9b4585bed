// Admin callers that present a Kubernetes ServiceAccount token instead of a token of the tokens
// file: the API server says whose token it is (TokenReview, authentication.k8s.io/v1), and
// admin_auth.service_accounts says what that account may do. Answers are cached briefly, so a
// dashboard polling every few seconds costs one review a minute.
//
// Anyone who can reach the admin port can present made-up tokens, so reviews are bounded: a
// token bucket limits reviews of tokens the caches do not know (10 a second, bursts of 20; past
// it the call is refused as RESOURCE_EXHAUSTED without asking), refusals are remembered (60 s) in
// a cache of their own, the cache of accepted tokens evicts the least recently used one instead
// of being cleared, and the API server gets 5 s to answer.
//
// Usage:
//   cfg.timeout_s = TokenReviewLimits{}.api_timeout.count();
//   auto reviewer = std::make_shared<KubeTokenReviewer>(std::make_unique<kube::CurlKubeApi>(cfg));
//   absl::StatusOr<std::string> account = reviewer->Review(token);   // "namespace/name"
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

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

// Bounds of KubeTokenReviewer; the defaults are the server's.
struct TokenReviewLimits {
  double reviews_per_second = 10;  // token bucket refill for tokens no cache knows
  double burst = 20;               // bucket size
  std::chrono::seconds accepted_ttl{60};
  std::chrono::seconds refused_ttl{60};
  size_t max_accepted = 1024;  // LRU beyond this
  size_t max_refused = 1024;   // LRU beyond this, apart from the accepted ones
  std::chrono::seconds api_timeout{5};  // for the KubeApiConfig the reviewer's client is made with
};

class KubeTokenReviewer final : public TokenReviewer {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  explicit KubeTokenReviewer(std::unique_ptr<kube::KubeApi> api, TokenReviewLimits limits = {},
                             Clock clock = nullptr);
  // Answers from a cache, else asks the API server if the bucket allows (an outage is never
  // cached).
  absl::StatusOr<std::string> Review(const std::string& token) override;
  // Reviews refused by the bucket since start.
  size_t rate_limited() const;

 private:
  struct Cached {
    absl::StatusOr<std::string> account;
    std::chrono::steady_clock::time_point until;
    std::list<std::string>::iterator lru;  // position in the owning cache's recency list
  };
  // A token to cache with its answer: least recently used entries make room.
  struct Cache {
    std::unordered_map<std::string, Cached> entries;
    std::list<std::string> recency;  // most recently used first
  };
  static void Put(Cache* cache, size_t max, const std::string& token,
                  absl::StatusOr<std::string> account,
                  std::chrono::steady_clock::time_point until);
  // The cached answer if fresh (and marks it used); nullptr otherwise.
  static const Cached* Find(Cache* cache, const std::string& token,
                            std::chrono::steady_clock::time_point now);
  bool TakeFromBucket(std::chrono::steady_clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<kube::KubeApi> api_;
  const TokenReviewLimits limits_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  Cache accepted_ ABSL_GUARDED_BY(mu_);
  Cache refused_ ABSL_GUARDED_BY(mu_);
  double bucket_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point bucket_at_ ABSL_GUARDED_BY(mu_);
  size_t rate_limited_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace orion::server
