// libcurl client of the Kubernetes API (see kube_api.h).
#include "kube/kube_api.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace orion::kube {
namespace {

constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

void EnsureCurlGlobal() {
  static CurlGlobal* once = new CurlGlobal();  // never destroyed: no exit-time teardown races
  (void)once;
}

std::string ReadToken(const std::string& file) {
  if (file.empty()) return "";
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  return token;
}

struct Transfer {
  std::string body;
  std::string pending;  // partial line of a stream
  const std::function<bool(std::string_view)>* on_line = nullptr;
  const std::atomic<bool>* stop = nullptr;
  CURL* curl = nullptr;
  bool stopped_by_callback = false;
};

size_t OnData(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->on_line == nullptr || status != 200) {
    t->body.append(data, bytes);
    return bytes;
  }
  t->pending.append(data, bytes);
  size_t start = 0;
  for (size_t nl; (nl = t->pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(t->pending.data() + start, nl - start);
    if (!line.empty() && !(*t->on_line)(line)) {
      t->stopped_by_callback = true;
      return 0;  // aborts the transfer
    }
  }
  t->pending.erase(0, start);
  return bytes;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return t->stop != nullptr && t->stop->load() ? 1 : 0;
}

}  // namespace

std::string UrlEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

absl::StatusOr<KubeApiConfig> InClusterKubeApiConfig() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || port == nullptr) {
    return absl::FailedPreconditionError(
        "not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset); pass --kube-api-url");
  }
  KubeApiConfig config;
  const std::string h = host;
  // IPv6 service addresses need brackets in a URL.
  config.base_url = absl::StrCat("https://", h.find(':') != std::string::npos ? "[" + h + "]" : h,
                                 ":", port);
  config.token_file = absl::StrCat(kServiceAccountDir, "/token");
  config.ca_file = absl::StrCat(kServiceAccountDir, "/ca.crt");
  return config;
}

CurlKubeApi::CurlKubeApi(KubeApiConfig config) : config_(std::move(config)) {
  EnsureCurlGlobal();
}

namespace {

// `method`: nullptr for GET, or POST with a body; "PUT" (with a body) or "DELETE" otherwise.
absl::StatusOr<long> Perform(const KubeApiConfig& config, const std::string& path,
                             const std::string* post_body, Transfer* t, bool streaming,
                             const char* method = nullptr) {
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  t->curl = curl.get();
  const std::string url = config.base_url + path;
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept: application/json");
  const std::string token = ReadToken(config.token_file);
  const std::string auth = "Authorization: Bearer " + token;
  if (!token.empty()) headers = curl_slist_append(headers, auth.c_str());
  if (post_body != nullptr) headers = curl_slist_append(headers, "Content-Type: application/json");
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> header_guard(headers,
                                                                            curl_slist_free_all);
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, OnData);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, t);
  curl_easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_CONNECTTIMEOUT,
                   std::min(10L, std::max(1L, config.timeout_s)));
  curl_easy_setopt(curl.get(), CURLOPT_USERAGENT, "orion-agent");
  if (!config.ca_file.empty()) curl_easy_setopt(curl.get(), CURLOPT_CAINFO, config.ca_file.c_str());
  if (post_body != nullptr) {
    curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDS, post_body->c_str());
    curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDSIZE, static_cast<long>(post_body->size()));
  }
  if (method != nullptr) curl_easy_setopt(curl.get(), CURLOPT_CUSTOMREQUEST, method);
  if (streaming) {
    curl_easy_setopt(curl.get(), CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFODATA, t);
    // A silent connection for this long is dead: the server sends bookmarks far more often.
    curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_TIME, 600L);
  } else {
    curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT, std::max(1L, config.timeout_s));
  }
  const CURLcode rc = curl_easy_perform(curl.get());
  long status = 0;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK && !t->stopped_by_callback &&
      !(rc == CURLE_ABORTED_BY_CALLBACK && t->stop != nullptr && t->stop->load())) {
    return absl::UnavailableError(absl::StrCat(url, ": ", curl_easy_strerror(rc)));
  }
  return status;
}

}  // namespace

absl::StatusOr<HttpResponse> CurlKubeApi::Get(const std::string& path) {
  Transfer t;
  absl::StatusOr<long> status = Perform(config_, path, nullptr, &t, false);
  if (!status.ok()) return status.status();
  return HttpResponse{*status, std::move(t.body)};
}

absl::StatusOr<HttpResponse> CurlKubeApi::Post(const std::string& path, const std::string& json) {
  Transfer t;
  absl::StatusOr<long> status = Perform(config_, path, &json, &t, false);
  if (!status.ok()) return status.status();
  return HttpResponse{*status, std::move(t.body)};
}

absl::StatusOr<HttpResponse> CurlKubeApi::Put(const std::string& path, const std::string& json) {
  Transfer t;
  absl::StatusOr<long> status = Perform(config_, path, &json, &t, false, "PUT");
  if (!status.ok()) return status.status();
  return HttpResponse{*status, std::move(t.body)};
}

absl::StatusOr<HttpResponse> CurlKubeApi::Delete(const std::string& path) {
  Transfer t;
  absl::StatusOr<long> status = Perform(config_, path, nullptr, &t, false, "DELETE");
  if (!status.ok()) return status.status();
  return HttpResponse{*status, std::move(t.body)};
}

absl::StatusOr<long> CurlKubeApi::Stream(const std::string& path,
                                         const std::function<bool(std::string_view)>& on_line,
                                         const std::atomic<bool>* stop, std::string* error_body) {
  Transfer t;
  t.on_line = &on_line;
  t.stop = stop;
  absl::StatusOr<long> status = Perform(config_, path, nullptr, &t, true);
  if (status.ok() && *status != 200 && error_body != nullptr) *error_body = std::move(t.body);
  return status;
}

}  // namespace orion::kube
