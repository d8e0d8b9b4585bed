// A test Kubernetes API server for the resource.k8s.io/v1 objects the DRA plugin uses: plain
// HTTP on 127.0.0.1, port 0 (the kernel picks). It keeps ResourceClaims a test put there (GET by
// namespace and name) and ResourceSlices as a real API server does: POST creates (409 if the
// name exists), PUT replaces only with the current metadata.resourceVersion (409 otherwise),
// DELETE removes, and a list honours the spec.nodeName and spec.driver field selectors. It
// answers GET /api/v1/nodes/<name> for the nodes a test added. Every request line is recorded;
// FailNext() makes the next requests answer an error.
#pragma once

#include <civetweb.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace orion::agent::testing {

class TestResourceApiServer {
 public:
  TestResourceApiServer() {
    const char* options[] = {"listening_ports", "127.0.0.1:0", "num_threads", "4", nullptr};
    mg_callbacks callbacks{};
    ctx_ = mg_start(&callbacks, this, options);
    mg_set_request_handler(ctx_, "/apis/resource.k8s.io/v1/", &TestResourceApiServer::OnRequest,
                           this);
    mg_set_request_handler(ctx_, "/api/v1/nodes/", &TestResourceApiServer::OnRequest, this);
    mg_server_port ports[1];
    if (mg_get_server_ports(ctx_, 1, ports) > 0) port_ = ports[0].port;
  }
  ~TestResourceApiServer() { mg_stop(ctx_); }

  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // The claim served at GET .../namespaces/<ns>/resourceclaims/<name> (a whole JSON document).
  void PutClaim(const std::string& ns, const std::string& name, std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    claims_[ns + "/" + name] = std::move(body);
  }
  void AddNode(const std::string& name, const std::string& uid) {
    std::lock_guard<std::mutex> lock(mu_);
    nodes_[name] = uid;
  }
  // The next `count` requests get HTTP `status` with `body`.
  void FailNext(int count, int status, std::string body = "{}") {
    std::lock_guard<std::mutex> lock(mu_);
    fail_count_ = count;
    fail_status_ = status;
    fail_body_ = std::move(body);
  }

  std::map<std::string, nlohmann::json> slices() {
    std::lock_guard<std::mutex> lock(mu_);
    return slices_;
  }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  bool WaitFor(const std::function<bool()>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, pred);
  }
  // For WaitFor predicates (called with the lock held).
  const std::map<std::string, nlohmann::json>& slices_unlocked() const { return slices_; }

 private:
  static void Reply(mg_connection* conn, int status, const std::string& body) {
    mg_printf(conn,
              "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
              "Connection: close\r\n\r\n",
              status, body.size());
    mg_write(conn, body.data(), body.size());
  }

  static std::string Status(int code, const std::string& reason) {
    return nlohmann::json{{"kind", "Status"}, {"code", code}, {"reason", reason}}.dump();
  }

  static int OnRequest(mg_connection* conn, void* self_ptr) {
    auto* self = static_cast<TestResourceApiServer*>(self_ptr);
    const mg_request_info* info = mg_get_request_info(conn);
    std::string body;
    char buf[4096];
    for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) body.append(buf, n);
    const std::string method = info->request_method;
    const std::string uri = info->local_uri;
    const std::string query = info->query_string ? info->query_string : "";
    int status = 200;
    std::string reply;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->requests_.push_back(method + " " + uri + (query.empty() ? "" : "?" + query));
      if (self->fail_count_ > 0) {
        --self->fail_count_;
        status = self->fail_status_;
        reply = self->fail_body_;
      } else {
        status = self->Handle(method, uri, query, body, &reply);
      }
    }
    self->cv_.notify_all();
    Reply(conn, status, reply);
    return 1;
  }

  // Called with mu_ held.
  int Handle(const std::string& method, const std::string& uri, const std::string& query,
             const std::string& body, std::string* reply) {
    static const std::string kNamespaces = "/apis/resource.k8s.io/v1/namespaces/";
    static const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";
    static const std::string kNodes = "/api/v1/nodes/";
    if (uri.rfind(kNodes, 0) == 0 && method == "GET") {
      auto it = nodes_.find(uri.substr(kNodes.size()));
      if (it == nodes_.end()) return *reply = Status(404, "NotFound"), 404;
      *reply = nlohmann::json{{"kind", "Node"},
                              {"metadata", {{"name", it->first}, {"uid", it->second}}}}
                   .dump();
      return 200;
    }
    if (uri.rfind(kNamespaces, 0) == 0 && method == "GET") {
      const std::string rest = uri.substr(kNamespaces.size());  // ns/resourceclaims/name
      const size_t a = rest.find("/resourceclaims/");
      if (a == std::string::npos) return *reply = Status(404, "NotFound"), 404;
      auto it = claims_.find(rest.substr(0, a) + "/" + rest.substr(a + 16));
      if (it == claims_.end()) return *reply = Status(404, "NotFound"), 404;
      *reply = it->second;
      return 200;
    }
    if (uri == kSlices && method == "GET") {
      nlohmann::json items = nlohmann::json::array();
      for (const auto& [name, slice] : slices_) {
        const std::string node = slice["spec"].value("nodeName", "");
        const std::string driver = slice["spec"].value("driver", "");
        // fieldSelector=spec.nodeName%3DN%2Cspec.driver%3DD, URL-encoded by the client.
        if (query.find("spec.nodeName%3D" + node + "%2C") == std::string::npos ||
            query.find("spec.driver%3D" + driver) == std::string::npos) {
          continue;
        }
        items.push_back(slice);
      }
      *reply = nlohmann::json{{"kind", "ResourceSliceList"}, {"items", items}}.dump();
      return 200;
    }
    if (uri == kSlices && method == "POST") {
      nlohmann::json slice = nlohmann::json::parse(body, nullptr, false);
      if (slice.is_discarded()) return *reply = Status(400, "BadRequest"), 400;
      const std::string name = slice["metadata"].value("name", "");
      if (slices_.count(name) > 0) return *reply = Status(409, "AlreadyExists"), 409;
      slice["metadata"]["resourceVersion"] = std::to_string(++version_);
      slices_[name] = slice;
      *reply = slice.dump();
      return 201;
    }
    if (uri.rfind(kSlices + "/", 0) == 0) {
      const std::string name = uri.substr(kSlices.size() + 1);
      auto it = slices_.find(name);
      if (it == slices_.end()) return *reply = Status(404, "NotFound"), 404;
      if (method == "DELETE") {
        slices_.erase(it);
        *reply = Status(200, "");
        return 200;
      }
      if (method == "PUT") {
        nlohmann::json slice = nlohmann::json::parse(body, nullptr, false);
        if (slice.is_discarded()) return *reply = Status(400, "BadRequest"), 400;
        if (slice["metadata"].value("resourceVersion", "") !=
            it->second["metadata"].value("resourceVersion", "")) {
          return *reply = Status(409, "Conflict"), 409;
        }
        slice["metadata"]["resourceVersion"] = std::to_string(++version_);
        it->second = slice;
        *reply = slice.dump();
        return 200;
      }
    }
    *reply = Status(405, "MethodNotAllowed");
    return 405;
  }

  mg_context* ctx_ = nullptr;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> claims_;
  std::map<std::string, std::string> nodes_;  // name -> UID
  std::map<std::string, nlohmann::json> slices_;
  std::vector<std::string> requests_;
  uint64_t version_ = 100;
  int fail_count_ = 0;
  int fail_status_ = 500;
  std::string fail_body_;
};

}  // namespace orion::agent::testing
