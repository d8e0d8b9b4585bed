// JSON helpers over google::protobuf::Value (see json.h).
#include "agent/json.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace orion::agent {

absl::StatusOr<JsonValue> ParseJson(std::string_view text) {
  JsonValue value;
  google::protobuf::util::JsonParseOptions options;
  const auto status =
      google::protobuf::util::JsonStringToMessage(std::string(text), &value, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", status.message().ToString()));
  }
  return value;
}

std::string WriteJson(const JsonValue& value) {
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(value, &out);
  return out;
}

const JsonValue* Member(const JsonValue& value, std::string_view key) {
  if (value.kind_case() != JsonValue::kStructValue) return nullptr;
  const auto& fields = value.struct_value().fields();
  auto it = fields.find(std::string(key));
  return it == fields.end() ? nullptr : &it->second;
}

const JsonValue* At(const JsonValue& value, std::initializer_list<std::string_view> path) {
  const JsonValue* cur = &value;
  for (std::string_view key : path) {
    cur = Member(*cur, key);
    if (cur == nullptr) return nullptr;
  }
  return cur;
}

std::string StringAt(const JsonValue& value, std::initializer_list<std::string_view> path) {
  const JsonValue* v = At(value, path);
  return v != nullptr && v->kind_case() == JsonValue::kStringValue ? v->string_value() : "";
}

std::map<std::string, std::string> StringMapAt(const JsonValue& value,
                                               std::initializer_list<std::string_view> path) {
  std::map<std::string, std::string> out;
  const JsonValue* v = At(value, path);
  if (v == nullptr || v->kind_case() != JsonValue::kStructValue) return out;
  for (const auto& [k, item] : v->struct_value().fields()) {
    if (item.kind_case() == JsonValue::kStringValue) out[k] = item.string_value();
  }
  return out;
}

JsonValue JsonString(std::string_view s) {
  JsonValue v;
  v.set_string_value(std::string(s));
  return v;
}

JsonValue JsonNumber(double d) {
  JsonValue v;
  v.set_number_value(d);
  return v;
}

JsonValue JsonBool(bool b) {
  JsonValue v;
  v.set_bool_value(b);
  return v;
}

}  // namespace orion::agent
