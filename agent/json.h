// JSON documents of the Kubernetes API (pods, watch events, AdmissionReview) as
// google::protobuf::Value trees: protobuf's JSON parser is already linked, so no extra JSON
// library is needed. Numbers become doubles, which is fine for the fields read here.
//
// Usage:
//   absl::StatusOr<google::protobuf::Value> doc = ParseJson(body);
//   std::string uid = StringAt(*doc, {"metadata", "uid"});
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "google/protobuf/struct.pb.h"

namespace orion::agent {

using JsonValue = google::protobuf::Value;

absl::StatusOr<JsonValue> ParseJson(std::string_view text);
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

JsonValue JsonString(std::string_view s);
JsonValue JsonNumber(double d);
JsonValue JsonBool(bool b);

}  // namespace orion::agent
