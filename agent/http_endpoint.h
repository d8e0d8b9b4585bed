// The agent's small HTTP(S) server: /healthz, /readyz and /gpus on the node, /mutate in the
// webhook. CivetWeb (cmake/civetweb.cmake) does the HTTP and TLS; this class adds routing by
// exact path, a bound on request bodies, and TLS from the PEM files Kubernetes mounts (tls.crt
// with its chain, tls.key) with TLS 1.2 as the floor.
//
// Usage:
//   absl::StatusOr<std::unique_ptr<HttpEndpoint>> http = HttpEndpoint::Start(
//       {.listen_address = "0.0.0.0:8081"},
//       {{"/healthz", [](const HttpRequest&) { return HttpReply{200, "text/plain", "ok\n"}; }}});
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct mg_context;
struct mg_connection;
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
    int threads = 4;
  };

  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(Options options,
                                                             std::map<std::string, Handler> routes);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;
  int port() const { return port_; }

 private:
  HttpEndpoint() = default;
  static int OnRequest(mg_connection* conn, void* self);
  static int ProvideTls(void** ssl_ctx, void* self);
  HttpReply Handle(mg_connection* conn) const;

  Options options_;
  std::map<std::string, Handler> routes_;
  ssl_ctx_st* tls_ = nullptr;
  mg_context* server_ = nullptr;
  int port_ = 0;
};

}  // namespace orion::agent
