// JSON parsing with bounds, and lookups, over nlohmann::json (see json.h).
#include "agent/json.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace orion::agent {
namespace {

// nlohmann's own DOM builder behind a SAX handler that counts depth and values and stops the
// parser (by returning false) at the first one over its limit. The parser itself is iterative,
// so nothing recurses before the check.
class BoundedDomBuilder {
 public:
  using Dom = nlohmann::detail::json_sax_dom_parser<JsonValue>;
  using number_integer_t = JsonValue::number_integer_t;
  using number_unsigned_t = JsonValue::number_unsigned_t;
  using number_float_t = JsonValue::number_float_t;
  using string_t = JsonValue::string_t;
  using binary_t = JsonValue::binary_t;

  BoundedDomBuilder(JsonValue* root, const JsonLimits& limits)
      : dom_(*root, /*allow_exceptions=*/false), limits_(limits) {}

  bool null() { return Count() && dom_.null(); }
  bool boolean(bool v) { return Count() && dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return Count() && dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return Count() && dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) {
    return Count() && dom_.number_float(v, s);
  }
  bool string(string_t& v) { return Count() && dom_.string(v); }
  bool binary(binary_t& v) { return Count() && dom_.binary(v); }
  bool start_object(std::size_t n) { return Enter() && dom_.start_object(n); }
  bool key(string_t& k) { return dom_.key(k); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Enter() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    error_ = absl::InvalidArgumentError(absl::StrCat("not valid JSON at byte ", position, ": ",
                                                     e.what()));
    return false;
  }

  const absl::Status& error() const { return error_; }

 private:
  bool Count() {
    if (++values_ <= limits_.max_values) return true;
    error_ = absl::ResourceExhaustedError(
        absl::StrCat("JSON refused: more than ", limits_.max_values, " values"));
    return false;
  }
  bool Enter() {
    if (!Count()) return false;
    if (++depth_ <= limits_.max_depth) return true;
    error_ = absl::ResourceExhaustedError(
        absl::StrCat("JSON refused: nested deeper than ", limits_.max_depth, " levels"));
    return false;
  }

  Dom dom_;
  const JsonLimits& limits_;
  int depth_ = 0;
  size_t values_ = 0;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<JsonValue> ParseJson(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "JSON refused: ", text.size(), " bytes, more than the limit of ", limits.max_bytes));
  }
  JsonValue root;
  BoundedDomBuilder builder(&root, limits);
  const bool ok = JsonValue::sax_parse(text.data(), text.data() + text.size(), &builder,
                                       JsonValue::input_format_t::json, /*strict=*/true);
  if (!ok) {
    if (!builder.error().ok()) return builder.error();
    return absl::InvalidArgumentError("not valid JSON");
  }
  return root;
}

std::string WriteJson(const JsonValue& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, JsonValue::error_handler_t::replace);
}

const JsonValue* Member(const JsonValue& value, std::string_view key) {
  if (!value.is_object()) return nullptr;
  auto it = value.find(key);
  return it == value.end() ? nullptr : &*it;
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
  return v != nullptr && v->is_string() ? v->get<std::string>() : "";
}

std::map<std::string, std::string> StringMapAt(const JsonValue& value,
                                               std::initializer_list<std::string_view> path) {
  std::map<std::string, std::string> out;
  const JsonValue* v = At(value, path);
  if (v == nullptr || !v->is_object()) return out;
  for (const auto& [k, item] : v->items()) {
    if (item.is_string()) out[k] = item.get<std::string>();
  }
  return out;
}

}  // namespace orion::agent
