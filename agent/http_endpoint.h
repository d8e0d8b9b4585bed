// The agent's small HTTP(S) server: /healthz, /readyz and /gpus on the node, /mutate in the
// webhook (whose health is a second, plain-HTTP endpoint). CivetWeb (cmake/civetweb.cmake) does
// the HTTP and TLS; this class adds routing by exact path, TLS from the PEM files Kubernetes
// mounts (tls.crt with its chain, tls.key) with TLS 1.2 as the floor, and bounds for clients
// that are slow or hostile:
//   - a body over max_body_bytes is refused with 413 from its Content-Length, before any of it
//     is read; chunked bodies (no length) are refused with 400;
//   - the TLS handshake, request line and headers must arrive within read_timeout_ms of the
//     connection's turn (CivetWeb's request_timeout_ms), else the connection is closed;
//   - the body must arrive within read_timeout_ms after the headers, else 408;
//   - `threads` connections are served at once; more wait in CivetWeb's queue, so a handful of
//     slow clients delay others by at most read_timeout_ms, and never another endpoint.
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
    // 1 MiB: 250 times a real pod AdmissionReview (about 4 KB), below which a pod is rarely
    // found; Kubernetes itself stores no object over 1.5 MiB.
    size_t max_body_bytes = 1 << 20;
    int threads = 4;
    int read_timeout_ms = 5000;
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
