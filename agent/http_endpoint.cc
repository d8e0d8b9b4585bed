// HTTP(S) endpoint on CivetWeb (see http_endpoint.h).
#include "agent/http_endpoint.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "civetweb.h"

namespace orion::agent {
namespace {

const char* StatusText(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

void InitCivetWebOnce() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(MG_FEATURES_TLS | MG_FEATURES_IPV6); });
}

std::string OpenSslError() {
  char err[256] = "unknown error";
  const unsigned long code = ERR_get_error();
  if (code != 0) ERR_error_string_n(code, err, sizeof(err));
  return err;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    Options options, std::map<std::string, Handler> routes) {
  std::unique_ptr<HttpEndpoint> self(new HttpEndpoint());
  self->options_ = std::move(options);
  self->routes_ = std::move(routes);
  const std::string& addr = self->options_.listen_address;
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon + 1 == addr.size()) {
    return absl::InvalidArgumentError(absl::StrCat("listen address \"", addr, "\" is not HOST:PORT"));
  }
  std::string host = addr.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  const std::string port = addr.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("listen address \"", addr, "\": bad port"));
  }
  const bool tls = !self->options_.tls_cert_file.empty() || !self->options_.tls_key_file.empty();

  if (tls) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == nullptr ||
        SSL_CTX_use_certificate_chain_file(ctx, self->options_.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, self->options_.tls_key_file.c_str(), SSL_FILETYPE_PEM) !=
            1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      const std::string why = OpenSslError();
      if (ctx != nullptr) SSL_CTX_free(ctx);
      return absl::InvalidArgumentError(absl::StrCat("TLS certificate/key ",
                                                     self->options_.tls_cert_file, ", ",
                                                     self->options_.tls_key_file, ": ", why));
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    self->tls_ = ctx;
  }

  InitCivetWebOnce();
  // CivetWeb's listening_ports: HOST:PORT, with an "s" suffix for TLS; [v6]:PORT for IPv6.
  const std::string listen = absl::StrCat(addr, tls ? "s" : "");
  const std::string threads = std::to_string(std::max(1, self->options_.threads));
  // request_timeout_ms bounds the TLS handshake and the request line + headers as a whole (from
  // the moment a worker takes the connection), and each mg_read of the body.
  const std::string timeout = std::to_string(std::max(1, self->options_.read_timeout_ms));
  const char* config[] = {"listening_ports", listen.c_str(),
                          "num_threads", threads.c_str(),
                          "request_timeout_ms", timeout.c_str(),
                          "enable_keep_alive", "no",
                          nullptr, nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.external_ssl_ctx = &HttpEndpoint::ProvideTls;
  mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.user_data = self.get();
  init.configuration_options = config;
  char error_text[256] = "";
  mg_error_data error;
  std::memset(&error, 0, sizeof(error));
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  self->server_ = mg_start2(&init, &error);
  if (self->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve on ", addr, ": ", error_text));
  }
  mg_set_request_handler(self->server_, "/", &HttpEndpoint::OnRequest, self.get());
  mg_server_port ports[4];
  const int n = mg_get_server_ports(self->server_, 4, ports);
  if (n >= 1) self->port_ = ports[0].port;
  return self;
}

HttpEndpoint::~HttpEndpoint() {
  if (server_ != nullptr) mg_stop(server_);  // waits for requests in flight
  if (tls_ != nullptr) SSL_CTX_free(tls_);
}

// CivetWeb asks for the TLS context at start and again at stop; 1 means "ours, do not touch".
int HttpEndpoint::ProvideTls(void** ssl_ctx, void* self) {
  auto* endpoint = static_cast<HttpEndpoint*>(self);
  if (endpoint->tls_ == nullptr) return 0;
  *ssl_ctx = endpoint->tls_;
  return 1;
}

int HttpEndpoint::OnRequest(mg_connection* conn, void* self) {
  const HttpReply reply = static_cast<const HttpEndpoint*>(self)->Handle(conn);
  // Close without reading what is left of the body: CivetWeb would otherwise drain it after a
  // 413 or 408, at the sender's pace.
  mg_disable_connection_keep_alive(conn);
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            reply.status, StatusText(reply.status), reply.content_type.c_str(), reply.body.size());
  mg_write(conn, reply.body.data(), reply.body.size());
  return reply.status;
}

HttpReply HttpEndpoint::Handle(mg_connection* conn) const {
  const mg_request_info* info = mg_get_request_info(conn);
  HttpRequest request;
  request.method = info->request_method != nullptr ? info->request_method : "";
  request.path = info->local_uri != nullptr ? info->local_uri : "";  // no query string
  auto route = routes_.find(request.path);
  if (route == routes_.end()) return {404, "text/plain", "not found\n"};
  if (const char* te = mg_get_header(conn, "Transfer-Encoding"); te != nullptr) {
    return {400, "text/plain", "chunked request bodies are not supported\n"};
  }
  if (info->content_length > 0) {
    if (static_cast<unsigned long long>(info->content_length) > options_.max_body_bytes) {
      return {413, "text/plain", "request body too large\n"};
    }
    request.body.resize(static_cast<size_t>(info->content_length));
    // mg_read returns once all it was asked for has arrived, or no byte came for
    // read_timeout_ms: a body sent a byte at a time would hold a larger read as long as the
    // sender likes. Asking for one byte a call checks the deadline after every byte; under TLS
    // the bytes come from the decrypted record, without a system call each.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(options_.read_timeout_ms);
    size_t done = 0;
    while (done < request.body.size()) {
      const int n = mg_read(conn, request.body.data() + done, 1);
      if (n > 0) done += static_cast<size_t>(n);
      if (done == request.body.size()) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        return {408, "text/plain", "request body not received in time\n"};
      }
      if (n <= 0) return {400, "text/plain", "incomplete request body\n"};
    }
  }
  return route->second(request);
}

}  // namespace orion::agent
