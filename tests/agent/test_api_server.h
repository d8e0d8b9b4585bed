// A test Kubernetes API server: plain HTTP on 127.0.0.1, port 0 (the kernel picks), serving
// scripted answers built from recorded API-server JSON. Each GET of /api/v1/pods takes the next
// scripted list or watch answer; a watch with nothing scripted stays open (like a quiet real
// watch) until the server stops. POSTed Events are recorded. TokenReviews are answered from the
// ServiceAccount tokens a test added (any other token is not authenticated).
#pragma once

#include <civetweb.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace orion::agent::testing {

class TestApiServer {
 public:
  struct Answer {
    int status = 200;
    std::string body;  // a whole document, or watch lines
  };

  TestApiServer() {
    const char* options[] = {"listening_ports", "127.0.0.1:0", "num_threads", "4", nullptr};
    mg_callbacks callbacks{};
    ctx_ = mg_start(&callbacks, this, options);
    mg_set_request_handler(ctx_, "/api/v1/pods", &TestApiServer::OnPods, this);
    mg_set_request_handler(ctx_, "/api/v1/namespaces/", &TestApiServer::OnNamespaced, this);
    mg_set_request_handler(ctx_, "/apis/authentication.k8s.io/v1/tokenreviews",
                           &TestApiServer::OnTokenReview, this);
    mg_server_port ports[1];
    if (mg_get_server_ports(ctx_, 1, ports) > 0) port_ = ports[0].port;
  }
  ~TestApiServer() {
    stopping_ = true;
    cv_.notify_all();
    mg_stop(ctx_);
  }

  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // A token the API server authenticates as `username` (e.g. system:serviceaccount:ns:name).
  void AddToken(const std::string& token, const std::string& username) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.emplace_back(token, username);
  }
  size_t token_reviews() {
    std::lock_guard<std::mutex> lock(mu_);
    return token_reviews_;
  }

  void AddList(Answer a) {
    std::lock_guard<std::mutex> lock(mu_);
    lists_.push_back(std::move(a));
  }
  void AddWatch(Answer a) {
    std::lock_guard<std::mutex> lock(mu_);
    watches_.push_back(std::move(a));
  }
  // Lines that a quiet watch already open sends as they come (a pod deleted while the agent
  // watches), instead of a scripted answer to the next watch request.
  void SendOnOpenWatch(std::string lines) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.push_back(std::move(lines));
    }
    cv_.notify_all();
  }

  // Ends every watch open now (their client went away, e.g. an agent that was restarted), so lines
  // sent later go to the watches opened after.
  void DropOpenWatches() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++watch_epoch_;
    }
    cv_.notify_all();
  }

  bool WaitFor(const std::function<bool()>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, pred);
  }
  // Request lines ("GET /api/v1/pods?...") and POST bodies seen so far; read under WaitFor or
  // through the copies below.
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<std::string> posted_events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  size_t num_requests_unlocked() const { return requests_.size(); }
  size_t num_events_unlocked() const { return events_.size(); }
  size_t num_watches_unlocked() const { return watch_requests_; }

 private:
  static void Reply(mg_connection* conn, int status, const std::string& body) {
    mg_printf(conn,
              "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
              "Connection: close\r\n\r\n",
              status, status == 200 ? "OK" : (status == 201 ? "Created" : "Error"), body.size());
    mg_write(conn, body.data(), body.size());
  }

  static int OnPods(mg_connection* conn, void* self_ptr) {
    auto* self = static_cast<TestApiServer*>(self_ptr);
    const mg_request_info* info = mg_get_request_info(conn);
    const std::string query = info->query_string ? info->query_string : "";
    const bool watch = query.find("watch=1") != std::string::npos ||
                       query.find("watch=true") != std::string::npos;
    Answer answer;
    bool have = false;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->requests_.push_back(std::string(info->request_method) + " " + info->local_uri + "?" +
                                query);
      if (watch) ++self->watch_requests_;
      auto& queue = watch ? self->watches_ : self->lists_;
      if (!queue.empty()) {
        answer = queue.front();
        queue.pop_front();
        have = true;
      }
    }
    self->cv_.notify_all();
    if (!watch) {
      Reply(conn, have ? answer.status : 500, have ? answer.body : "{}");
      return 1;
    }
    if (have && answer.status != 200) {
      Reply(conn, answer.status, answer.body);
      return 1;
    }
    // A real watch streams with chunked encoding; the lines come as they happen.
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
              "Transfer-Encoding: chunked\r\n\r\n");
    if (have) mg_send_chunk(conn, answer.body.data(), answer.body.size());
    if (!have) {
      std::unique_lock<std::mutex> lock(self->mu_);
      const uint64_t epoch = self->watch_epoch_;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (self->cv_.wait_until(lock, until, [self, epoch] {
        return self->stopping_.load() || !self->live_.empty() || self->watch_epoch_ != epoch;
      })) {
        if (self->stopping_.load() || self->watch_epoch_ != epoch) break;
        const std::string lines = std::move(self->live_.front());
        self->live_.pop_front();
        lock.unlock();
        mg_send_chunk(conn, lines.data(), lines.size());
        lock.lock();
      }
    }
    mg_send_chunk(conn, "", 0);
    return 1;
  }

  static int OnNamespaced(mg_connection* conn, void* self_ptr) {
    auto* self = static_cast<TestApiServer*>(self_ptr);
    const mg_request_info* info = mg_get_request_info(conn);
    std::string body;
    char buf[4096];
    for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) body.append(buf, n);
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->requests_.push_back(std::string(info->request_method) + " " + info->local_uri);
      if (std::strcmp(info->request_method, "POST") == 0) self->events_.push_back(body);
    }
    self->cv_.notify_all();
    Reply(conn, 201, body);
    return 1;
  }

  static int OnTokenReview(mg_connection* conn, void* self_ptr) {
    auto* self = static_cast<TestApiServer*>(self_ptr);
    std::string body;
    char buf[4096];
    for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) body.append(buf, n);
    std::string username;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      ++self->token_reviews_;
      for (const auto& [token, user] : self->tokens_) {
        if (body.find("\"token\":\"" + token + "\"") != std::string::npos) username = user;
      }
    }
    const std::string status =
        username.empty()
            ? R"({"authenticated":false,"error":"invalid bearer token"})"
            : R"({"authenticated":true,"user":{"username":")" + username + R"(","groups":[]}})";
    Reply(conn, 201,
          R"({"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","status":)" + status +
              "}");
    return 1;
  }

  mg_context* ctx_ = nullptr;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, std::string>> tokens_;
  size_t token_reviews_ = 0;
  std::deque<Answer> lists_;
  std::deque<Answer> watches_;
  std::deque<std::string> live_;
  std::vector<std::string> requests_;
  std::vector<std::string> events_;
  size_t watch_requests_ = 0;
  uint64_t watch_epoch_ = 0;  // guarded by mu_; DropOpenWatches bumps it
};

}  // namespace orion::agent::testing
