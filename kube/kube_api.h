// The few Kubernetes API calls orion makes (the agent lists and watches pods, creates Events,
// reads ResourceClaims and writes its ResourceSlices; the server reviews ServiceAccount tokens), behind a small interface so tests can point it at a
// plain-HTTP test API server. CurlKubeApi is the
// real client: in-cluster service-account token (re-read on every request, since bound tokens
// rotate) and the cluster CA.
//
// Usage:
//   absl::StatusOr<KubeApiConfig> config = InClusterKubeApiConfig();
//   CurlKubeApi api(*config);
//   absl::StatusOr<HttpResponse> r = api.Get("/api/v1/pods?fieldSelector=...");
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace orion::kube {

struct HttpResponse {
  long status = 0;
  std::string body;
};

class KubeApi {
 public:
  virtual ~KubeApi() = default;
  virtual absl::StatusOr<HttpResponse> Get(const std::string& path) = 0;
  virtual absl::StatusOr<HttpResponse> Post(const std::string& path, const std::string& json) = 0;
  // Replace and delete (the DRA plugin's ResourceSlices); a client that never writes objects
  // need not have them.
  virtual absl::StatusOr<HttpResponse> Put(const std::string& path, const std::string& json) {
    return absl::UnimplementedError("PUT " + path + ": not supported by this client");
  }
  virtual absl::StatusOr<HttpResponse> Delete(const std::string& path) {
    return absl::UnimplementedError("DELETE " + path + ": not supported by this client");
  }
  // A streaming GET (watch): on_line gets every complete line; returning false ends the stream.
  // Returns the HTTP status once the server closes the stream, on_line stops it, or *stop is
  // set; the body of a non-200 answer goes to *error_body.
  virtual absl::StatusOr<long> Stream(const std::string& path,
                                      const std::function<bool(std::string_view)>& on_line,
                                      const std::atomic<bool>* stop, std::string* error_body) = 0;
};

struct KubeApiConfig {
  std::string base_url;     // https://10.96.0.1:443, or http://127.0.0.1:PORT in tests
  std::string token_file;   // empty: no Authorization header
  std::string ca_file;      // empty: system trust store
  long timeout_s = 60;      // a whole GET or POST (not Stream); connecting takes at most 10 s
};

// From KUBERNETES_SERVICE_HOST/PORT and the mounted service-account files.
absl::StatusOr<KubeApiConfig> InClusterKubeApiConfig();

class CurlKubeApi final : public KubeApi {
 public:
  explicit CurlKubeApi(KubeApiConfig config);
  absl::StatusOr<HttpResponse> Get(const std::string& path) override;
  absl::StatusOr<HttpResponse> Post(const std::string& path, const std::string& json) override;
  absl::StatusOr<HttpResponse> Put(const std::string& path, const std::string& json) override;
  absl::StatusOr<HttpResponse> Delete(const std::string& path) override;
  absl::StatusOr<long> Stream(const std::string& path,
                              const std::function<bool(std::string_view)>& on_line,
                              const std::atomic<bool>* stop, std::string* error_body) override;

 private:
  const KubeApiConfig config_;
};

// "a b=c" -> "a%20b%3Dc": query parameter values.
std::string UrlEncode(std::string_view text);

}  // namespace orion::kube
