// HTTP(S) endpoint on POSIX sockets + OpenSSL (see http_endpoint.h).
#include "agent/http_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace orion::agent {
namespace {

constexpr size_t kMaxHeaderBytes = 64 << 10;

const char* StatusText(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// Reads and writes either plain or TLS; every call is bounded by the socket timeouts.
struct Stream {
  int fd;
  SSL* ssl;
  long Read(char* buf, size_t n) {
    return ssl ? SSL_read(ssl, buf, static_cast<int>(n)) : recv(fd, buf, n, 0);
  }
  bool WriteAll(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      const long n = ssl ? SSL_write(ssl, data.data() + done, static_cast<int>(data.size() - done))
                         : send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    Options options, std::map<std::string, Handler> routes) {
  std::unique_ptr<HttpEndpoint> self(new HttpEndpoint());
  self->options_ = std::move(options);
  self->routes_ = std::move(routes);
  const std::string& addr = self->options_.listen_address;
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("listen address \"", addr, "\" is not HOST:PORT"));
  }
  std::string host = addr.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const std::string port = addr.substr(colon + 1);

  if (!self->options_.tls_cert_file.empty() || !self->options_.tls_key_file.empty()) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == nullptr ||
        SSL_CTX_use_certificate_chain_file(ctx, self->options_.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, self->options_.tls_key_file.c_str(), SSL_FILETYPE_PEM) !=
            1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      if (ctx != nullptr) SSL_CTX_free(ctx);
      char err[256];
      ERR_error_string_n(ERR_get_error(), err, sizeof(err));
      return absl::InvalidArgumentError(absl::StrCat("TLS certificate/key ",
                                                     self->options_.tls_cert_file, ", ",
                                                     self->options_.tls_key_file, ": ", err));
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    self->tls_ = ctx;
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse listen address ", addr));
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 64) == 0;
  freeaddrinfo(res);
  if (!bound) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", addr, ": ", why));
  }
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
  self->port_ = ntohs(local.ss_family == AF_INET6
                          ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                          : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  self->listen_fd_ = fd;
  self->acceptor_ = std::thread([raw = self.get()] { raw->AcceptLoop(); });
  return self;
}

HttpEndpoint::~HttpEndpoint() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return active_ == 0; });
  if (tls_ != nullptr) SSL_CTX_free(tls_);
}

void HttpEndpoint::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++active_;
    }
    std::thread([this, fd] {
      Serve(fd);
      close(fd);
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
      idle_.notify_all();
    }).detach();
  }
}

HttpReply HttpEndpoint::Dispatch(const HttpRequest& request) const {
  auto route = routes_.find(request.path);
  if (route == routes_.end()) return {404, "text/plain", "not found\n"};
  return route->second(request);
}

void HttpEndpoint::Serve(int fd) {
  // A slow or stuck peer cannot hold a thread for long.
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  SSL* ssl = nullptr;
  if (tls_ != nullptr) {
    ssl = SSL_new(tls_);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) != 1) {
      SSL_free(ssl);
      return;
    }
  }
  Stream stream{fd, ssl};
  auto finish = [&](const HttpReply& reply) {
    stream.WriteAll(absl::StrCat("HTTP/1.1 ", reply.status, " ", StatusText(reply.status),
                                 "\r\nContent-Type: ", reply.content_type,
                                 "\r\nContent-Length: ", reply.body.size(),
                                 "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
                                 reply.body));
    if (ssl != nullptr) {
      SSL_shutdown(ssl);
      SSL_free(ssl);
    }
  };

  std::string data;
  char buf[16384];
  size_t header_end;
  while ((header_end = data.find("\r\n\r\n")) == std::string::npos) {
    if (data.size() > kMaxHeaderBytes) return finish({413, "text/plain", "headers too large\n"});
    const long n = stream.Read(buf, sizeof(buf));
    if (n <= 0) return finish({400, "text/plain", "incomplete request\n"});
    data.append(buf, static_cast<size_t>(n));
  }
  HttpRequest request;
  const size_t line_end = data.find("\r\n");
  const std::string line = data.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    return finish({400, "text/plain", "bad request line\n"});
  }
  request.method = line.substr(0, sp1);
  request.path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  request.path = request.path.substr(0, request.path.find('?'));
  size_t content_length = 0;
  for (size_t pos = line_end + 2; pos < header_end;) {
    const size_t eol = data.find("\r\n", pos);
    const std::string header = data.substr(pos, eol - pos);
    pos = eol + 2;
    const size_t colon = header.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = Lower(header.substr(0, colon));
    if (name == "content-length") {
      content_length = std::strtoull(header.c_str() + colon + 1, nullptr, 10);
    } else if (name == "transfer-encoding") {
      return finish({400, "text/plain", "chunked request bodies are not supported\n"});
    }
  }
  if (content_length > options_.max_body_bytes) {
    return finish({413, "text/plain", "request body too large\n"});
  }
  request.body = data.substr(header_end + 4);
  while (request.body.size() < content_length) {
    const long n = stream.Read(buf, sizeof(buf));
    if (n <= 0) return finish({400, "text/plain", "incomplete request body\n"});
    request.body.append(buf, static_cast<size_t>(n));
  }
  request.body.resize(content_length);
  finish(Dispatch(request));
}

}  // namespace orion::agent
