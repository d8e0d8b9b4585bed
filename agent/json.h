// JSON documents of the Kubernetes API (pods, pod lists, watch events, AdmissionReview, Events)
// as nlohmann::json values (Debian's nlohmann-json3-dev). Every body that arrives from outside
// goes through ParseJson, which enforces a size limit before parsing and a nesting depth and
// value count while parsing (a SAX handler stops the parser at the limit), so a hostile body costs
// bounded time and memory. Limits are per call: JsonLimits::AdmissionReview() for the webhook,
// PodList() and WatchEvent() for the API server's answers.
//
// Usage:
//   absl::StatusOr<JsonValue> doc = ParseJson(body, JsonLimits::AdmissionReview());
//   std::string uid = StringAt(*doc, {"metadata", "uid"});
#pragma once

#include <cstddef>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace orion::agent {

using JsonValue = nlohmann::json;

// Bounds on one parsed document. A real pod AdmissionReview (tests/agent/testdata) is about
// 4 KB, 10 levels deep and 130 values; a pod is at most 1.5 MiB (etcd's request limit).
struct JsonLimits {
  // Deepest Kubernetes pod path is about 12 levels inside an AdmissionReview
  // (request.object.spec.affinity.nodeAffinity...matchExpressions[].values[]); 64 leaves 5x
  // headroom and keeps every recursive walk over the result (nlohmann's dump, the admission
  // code) shallow. A 100,000-deep body stops at byte 65.
  static constexpr int kMaxDepth = 64;

  size_t max_bytes = 1 << 20;
  int max_depth = kMaxDepth;
  // Values (scalars, objects, arrays) in the document: bounds the parsed tree at about 64 bytes
  // a value, whatever the text is made of ("[[],[],...]" costs more per byte than a pod does).
  size_t max_values = 100'000;

  // The webhook's body: 1 MiB, 250 times the test review, and 100,000 values (750 times).
  static JsonLimits AdmissionReview() { return {}; }
  // One line of a pod watch: one pod, at most etcd's 1.5 MiB, plus the event around it.
  static JsonLimits WatchEvent() { return {.max_bytes = 2 << 20, .max_values = 200'000}; }
  // The node's pods in one list: 110 by default, a few hundred at most, 5-20 KB and about 110
  // values each (tests/agent/testdata/pods-list.json); the tree stays within the agent's memory.
  static JsonLimits PodList() { return {.max_bytes = 16 << 20, .max_values = 500'000}; }
};

// InvalidArgument for text that is not JSON, ResourceExhausted for a document over a limit; the
// message says which, and at which byte.
absl::StatusOr<JsonValue> ParseJson(std::string_view text, const JsonLimits& limits = {});
// Compact JSON; invalid UTF-8 in strings is replaced by U+FFFD rather than failing.
std::string WriteJson(const JsonValue& value);

// The member `key` of an object, or nullptr if `value` is no object or has no such member.
const JsonValue* Member(const JsonValue& value, std::string_view key);
// Follows object members; nullptr when any step is missing.
const JsonValue* At(const JsonValue& value, std::initializer_list<std::string_view> path);
// The string at `path`, or "" when missing or not a string.
std::string StringAt(const JsonValue& value, std::initializer_list<std::string_view> path);
// String members of the object at `path` (e.g. metadata.annotations); others are skipped.
std::map<std::string, std::string> StringMapAt(const JsonValue& value,
                                               std::initializer_list<std::string_view> path);

}  // namespace orion::agent
