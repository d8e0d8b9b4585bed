// Small HTTP/1.1 server (one request per connection) for the agent's /healthz and /readyz and
// the webhook's /mutate, on POSIX sockets with OpenSSL for TLS, loading the PEM files
// Kubernetes mounts (tls.crt, tls.key). Not civetweb: Debian's civetweb loads OpenSSL 1.1
// symbols at run time and crashes against OpenSSL 3.
//
// Usage:
//   absl::StatusOr<std::unique_ptr<HttpEndpoint>> http = HttpEndpoint::Start(
//       {.listen_address = "0.0.0.0:8081"},
//       {{"/healthz", [](const HttpRequest&) { return HttpReply{200, "text/plain", "ok\n"}; }}});
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

struct ssl_ctx_st;

namespace orion::agent {

struct HttpRequest {
  std::string method;
  std::string path;
  std::string body;
};

struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
};

class HttpEndpoint {
 public:
  using Handler = std::function<HttpReply(const HttpRequest&)>;
  struct Options {
    std::string listen_address;  // HOST:PORT; port 0 lets the kernel pick (tests)
    std::string tls_cert_file;   // both set: HTTPS
    std::string tls_key_file;
    size_t max_body_bytes = 4 << 20;
  };

  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(Options options,
                                                             std::map<std::string, Handler> routes);
  ~HttpEndpoint();
  int port() const { return port_; }

 private:
  HttpEndpoint() = default;
  void AcceptLoop();
  void Serve(int fd);
  HttpReply Dispatch(const HttpRequest& request) const;

  Options options_;
  std::map<std::string, Handler> routes_;
  ssl_ctx_st* tls_ = nullptr;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable idle_;
  int active_ = 0;  // connections being served, guarded by mu_
};

}  // namespace orion::agent
