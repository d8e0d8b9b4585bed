// The agent's bounded JSON parsing: real API-server and AdmissionReview documents fit the limits
// with room to spare, and hostile bodies (100,000-deep nesting, a megabyte of "0,", oversize text)
// are refused fast with an error that says which bound they hit.
#include "agent/json.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "agent/admission.h"
#include "tests/agent/testdata.h"

namespace orion::agent {
namespace {

using testing::ReadTestdata;

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

std::string Nested(size_t depth, char open, char close) {
  std::string s(depth, open);
  s.append(depth, close);
  return s;
}

int Depth(const JsonValue& v) {
  int d = 0;
  if (v.is_structured()) {
    for (const JsonValue& child : v) d = std::max(d, Depth(child));
    return d + 1;
  }
  return 0;
}

TEST(ParseJson, RealDocumentsFitTheLimitsWithRoom) {
  struct Case {
    const char* file;
    JsonLimits limits;
  };
  for (const Case& c : {Case{"admission-review-pod-high.json", JsonLimits::AdmissionReview()},
                        Case{"admission-review-pod-plain.json", JsonLimits::AdmissionReview()},
                        Case{"pods-list.json", JsonLimits::PodList()}}) {
    const std::string text = ReadTestdata(c.file);
    absl::StatusOr<JsonValue> doc = ParseJson(text, c.limits);
    ASSERT_TRUE(doc.ok()) << c.file << ": " << doc.status();
    const int depth = Depth(*doc);
    std::printf("%s: %zu bytes, %d levels (limits: %zu bytes, %d levels)\n", c.file, text.size(),
                depth, c.limits.max_bytes, c.limits.max_depth);
    EXPECT_LT(text.size() * 100, c.limits.max_bytes) << c.file;
    EXPECT_LT(depth * 4, c.limits.max_depth) << c.file;
  }
}

TEST(ParseJson, DeepNestingIsRefusedAtTheDepthLimitInUnderASecond) {
  {
    const std::string body = Nested(100'000, '[', ']');  // 200 KB
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<JsonValue> doc = ParseJson(body, JsonLimits::AdmissionReview());
    const double ms = MillisSince(start);
    std::printf("100,000-deep array (%zu bytes): refused in %.3f ms: %s\n", body.size(), ms,
                std::string(doc.status().message()).c_str());
    ASSERT_FALSE(doc.ok());
    EXPECT_EQ(doc.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(doc.status().message().find("nested deeper than 64 levels"), std::string::npos);
    EXPECT_LT(ms, 1000);
  }
  std::string objects;
  for (int i = 0; i < 100'000; ++i) objects += "{\"a\":";
  objects += "0";
  objects.append(100'000, '}');
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<JsonValue> doc = ParseJson(objects);
  const double ms = MillisSince(start);
  std::printf("100,000-deep object (%zu bytes): refused in %.3f ms\n", objects.size(), ms);
  EXPECT_EQ(doc.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LT(ms, 1000);
}

TEST(ParseJson, DepthLimitIsExact) {
  EXPECT_TRUE(ParseJson(Nested(JsonLimits::kMaxDepth, '[', ']')).ok());
  EXPECT_EQ(ParseJson(Nested(JsonLimits::kMaxDepth + 1, '[', ']')).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ParseJson("[[1]]", {.max_depth = 2}).ok());
  EXPECT_FALSE(ParseJson("[[1]]", {.max_depth = 1}).ok());
}

TEST(ParseJson, OversizeTextIsRefusedBeforeParsing) {
  std::string body = "[";
  for (int i = 0; i < (2 << 20); ++i) body += "0,";  // 4 MiB of [0,0,...]
  body += "0]";
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<JsonValue> doc = ParseJson(body, JsonLimits::AdmissionReview());
  const double ms = MillisSince(start);
  std::printf("4 MiB [0,0,...]: refused in %.3f ms: %s\n", ms,
              std::string(doc.status().message()).c_str());
  EXPECT_EQ(doc.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(doc.status().message().find("more than the limit of 1048576"), std::string::npos);
  EXPECT_LT(ms, 50);
}

TEST(ParseJson, ValueCountBoundsTheTreeOfABodyUnderTheSizeLimit) {
  std::string body = "[";
  for (int i = 0; i < 500'000; ++i) body += "0,";  // just under 1 MiB, 500,001 values
  body += "0]";
  ASSERT_LE(body.size(), JsonLimits::AdmissionReview().max_bytes);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<JsonValue> doc = ParseJson(body, JsonLimits::AdmissionReview());
  const double ms = MillisSince(start);
  std::printf("%zu-byte [0,0,...]: refused in %.3f ms: %s\n", body.size(), ms,
              std::string(doc.status().message()).c_str());
  EXPECT_EQ(doc.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(doc.status().message().find("more than 100000 values"), std::string::npos);
  EXPECT_TRUE(ParseJson("[0,0,0]", {.max_values = 4}).ok());
  EXPECT_FALSE(ParseJson("[0,0,0,0]", {.max_values = 4}).ok());
}

TEST(ParseJson, SyntaxErrorsSayWhere) {
  for (const char* text : {"", "{\"a\": ", "<html>", "[1, 2,]", "{} {}", "{\"a\": \"\xff\"}"}) {
    absl::StatusOr<JsonValue> doc = ParseJson(text);
    ASSERT_FALSE(doc.ok()) << text;
    EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(doc.status().message().find("not valid JSON"), std::string::npos)
        << doc.status();
  }
}

TEST(WriteJson, InvalidUtf8IsReplacedNotThrown) {
  const JsonValue v = {{"name", std::string("a\xff")}};
  EXPECT_EQ(WriteJson(v), "{\"name\":\"a\xef\xbf\xbd\"}");
}

TEST(ReviewPodAdmission, HostileBodiesGetAClearErrorFast) {
  const auto start = std::chrono::steady_clock::now();
  AdmissionReply deep = ReviewPodAdmission(Nested(100'000, '[', ']'), {});
  EXPECT_LT(MillisSince(start), 1000);
  EXPECT_EQ(deep.http_status, 400);
  EXPECT_NE(deep.body.find("nested deeper than 64 levels"), std::string::npos) << deep.body;
  AdmissionReply big = ReviewPodAdmission(std::string((1 << 20) + 1, ' '), {});
  EXPECT_EQ(big.http_status, 413);
  EXPECT_NE(big.body.find("request body refused"), std::string::npos) << big.body;
}

}  // namespace
}  // namespace orion::agent
