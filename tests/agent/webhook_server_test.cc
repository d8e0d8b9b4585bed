// The webhook over real HTTPS (CivetWeb + OpenSSL 3, a throw-away certificate), as the API server
// calls it: AdmissionReview POSTs, malformed bodies, wrong methods, health endpoints; and the
// plain-HTTP endpoint the node's health port uses.
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "absl/strings/escaping.h"
#include "agent/json.h"
#include "agent/webhook_routes.h"
#include "tests/agent/testdata.h"

namespace orion::agent {
namespace {

size_t Collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

class WebhookServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/orion-webhook-XXXXXX";
    dir_ = mkdtemp(tmpl);
    const std::string cmd =
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=orion-webhook"
        " -addext subjectAltName=IP:127.0.0.1 -keyout " + dir_ + "/tls.key -out " + dir_ +
        "/tls.crt >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl CLI not available";
    auto endpoint = HttpEndpoint::Start(
        {.listen_address = "127.0.0.1:0", .tls_cert_file = dir_ + "/tls.crt",
         .tls_key_file = dir_ + "/tls.key"},
        WebhookRoutes({}));
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    endpoint_ = *std::move(endpoint);
    ASSERT_GT(endpoint_->port(), 0);
  }
  void TearDown() override {
    endpoint_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Returns the HTTP status; verifies the server against the test certificate.
  long Call(const std::string& method, const std::string& path, const std::string& body,
            std::string* response) {
    CURL* curl = curl_easy_init();
    const std::string url = "https://127.0.0.1:" + std::to_string(endpoint_->port()) + path;
    const std::string ca = dir_ + "/tls.crt";
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_CAINFO, ca.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
    if (method == "POST") {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    }
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, response);
    const CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    EXPECT_EQ(rc, CURLE_OK) << curl_easy_strerror(rc);
    return status;
  }

  std::string dir_;
  std::unique_ptr<HttpEndpoint> endpoint_;
};

TEST_F(WebhookServerTest, MutatesAnnotatedPodOverHttps) {
  std::string response;
  ASSERT_EQ(Call("POST", "/mutate", testing::ReadTestdata("admission-review-pod-high.json"),
                 &response),
            200);
  absl::StatusOr<JsonValue> review = ParseJson(response);
  ASSERT_TRUE(review.ok()) << response;
  EXPECT_EQ(StringAt(*review, {"response", "uid"}), "705ab4f5-6393-11e8-b7cc-42010a800002");
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape(StringAt(*review, {"response", "patch"}), &patch));
  EXPECT_NE(patch.find("orion.io~1gpu"), std::string::npos) << patch;
}

TEST_F(WebhookServerTest, MalformedBodiesAndMethods) {
  std::string response;
  EXPECT_EQ(Call("POST", "/mutate", "{not json", &response), 400);
  EXPECT_NE(response.find("not JSON"), std::string::npos) << response;
  response.clear();
  EXPECT_EQ(Call("GET", "/mutate", "", &response), 405);
  response.clear();
  EXPECT_EQ(Call("POST", "/elsewhere", "{}", &response), 404);
  response.clear();
  // Health has a listener of its own (WebhookHealthRoutes), not the HTTPS port.
  EXPECT_EQ(Call("GET", "/healthz", "", &response), 404);
}

// Plain HTTP (the node's health port): exact routes, query strings ignored, bodies bounded.
TEST(HttpEndpoint, PlainHttpRoutesAndBodyLimit) {
  auto endpoint = HttpEndpoint::Start(
      {.listen_address = "127.0.0.1:0", .max_body_bytes = 1024},
      {{"/echo", [](const HttpRequest& r) {
          return HttpReply{200, "text/plain", r.method + " " + r.path + " " + r.body};
        }}});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);
  auto call = [&](const std::string& path, const std::string& body, std::string* out) {
    CURL* curl = curl_easy_init();
    const std::string url = "http://127.0.0.1:" + std::to_string(port) + path;
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    if (!body.empty()) {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    }
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, out);
    EXPECT_EQ(curl_easy_perform(curl), CURLE_OK);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(curl);
    return status;
  };
  std::string out;
  EXPECT_EQ(call("/echo?x=1", "", &out), 200);
  EXPECT_EQ(out, "GET /echo ");
  out.clear();
  EXPECT_EQ(call("/echo", "hello", &out), 200);
  EXPECT_EQ(out, "POST /echo hello");
  out.clear();
  EXPECT_EQ(call("/echo", std::string(4096, 'x'), &out), 413);
  EXPECT_NE(out.find("too large"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(call("/echo/more", "", &out), 404);

  // The port is taken: a second endpoint on it says so.
  auto second = HttpEndpoint::Start({.listen_address = "127.0.0.1:" + std::to_string(port)}, {});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("cannot serve on 127.0.0.1:"), std::string::npos)
      << second.status();
  EXPECT_FALSE(HttpEndpoint::Start({.listen_address = "8081"}, {}).ok());
}

TEST(HttpEndpoint, RefusesUnreadableCertificate) {
  auto endpoint = HttpEndpoint::Start({.listen_address = "127.0.0.1:0",
                                       .tls_cert_file = "/nonexistent/tls.crt",
                                       .tls_key_file = "/nonexistent/tls.key"},
                                      WebhookRoutes({}));
  EXPECT_FALSE(endpoint.ok());
}

}  // namespace
}  // namespace orion::agent
