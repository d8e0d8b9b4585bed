// AdmissionReview v1 handling of the orion webhook (see admission.h).
#include "agent/admission.h"

#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/annotations.h"

namespace orion::agent {
namespace {

constexpr std::string_view kWholeGpuResource = "nvidia.com/gpu";

JsonValue PatchOp(std::string path, JsonValue value) {
  JsonValue op;
  auto& f = *op.mutable_struct_value()->mutable_fields();
  f["op"] = JsonString("add");
  f["path"] = JsonString(path);
  f["value"] = std::move(value);
  return op;
}

JsonValue ObjectWith(std::string_view key, JsonValue value) {
  JsonValue obj;
  (*obj.mutable_struct_value()->mutable_fields())[std::string(key)] = std::move(value);
  return obj;
}

bool HasMember(const JsonValue* obj, std::string_view key) {
  return obj != nullptr && Member(*obj, key) != nullptr;
}

bool SetsEnv(const JsonValue& container, std::string_view name) {
  const JsonValue* env = Member(container, "env");
  if (env == nullptr || env->kind_case() != JsonValue::kListValue) return false;
  for (const JsonValue& e : env->list_value().values()) {
    if (StringAt(e, {"name"}) == name) return true;
  }
  return false;
}

JsonValue EnvVar(std::string_view name, std::string value) {
  JsonValue v = ObjectWith("name", JsonString(std::string(name)));
  (*v.mutable_struct_value()->mutable_fields())["value"] = JsonString(std::move(value));
  return v;
}

// The SM percentage for a best-effort pod: its annotation if valid (0: leave both variables out),
// else the default.
int MpsThreadPercentage(const std::map<std::string, std::string>& annotations,
                        const AdmissionOptions& options, std::vector<std::string>* warnings) {
  auto it = annotations.find(std::string(kAnnotationMpsThreadPercentage));
  if (it == annotations.end()) return options.best_effort_mps_thread_percentage;
  int v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < 0 || v > 100) {
    const int d = options.best_effort_mps_thread_percentage;
    warnings->push_back(absl::StrCat(
        std::string(kAnnotationMpsThreadPercentage), ": \"", it->second,
        "\" is not an integer in [0, 100] (0: no MPS variables); ",
        d == 0 ? std::string("no MPS variables set") : absl::StrCat("using ", d)));
    return options.best_effort_mps_thread_percentage;
  }
  return v;
}

AdmissionReply BadRequest(std::string_view why) {
  JsonValue err = ObjectWith("error", JsonString(absl::StrCat("orion webhook: ", std::string(why))));
  return {400, WriteJson(err)};
}

// Appends "add" operations that give the container each variable it does not set itself.
void AddEnvPatch(const JsonValue& container, int index,
                 const std::vector<std::pair<std::string_view, std::string>>& vars,
                 JsonValue* patch) {
  const std::string base = absl::StrCat("/spec/containers/", index, "/env");
  const JsonValue* env = Member(container, "env");
  bool has_list = env != nullptr && env->kind_case() == JsonValue::kListValue;
  for (const auto& [name, value] : vars) {
    if (SetsEnv(container, name)) continue;
    if (has_list) {
      *patch->mutable_list_value()->add_values() = PatchOp(base + "/-", EnvVar(name, value));
    } else {
      JsonValue list;
      *list.mutable_list_value()->add_values() = EnvVar(name, value);
      *patch->mutable_list_value()->add_values() = PatchOp(base, std::move(list));
      has_list = true;
    }
  }
}

}  // namespace

std::string EscapeJsonPointer(std::string_view token) {
  std::string out;
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

JsonValue SharePatchForPod(const JsonValue& pod, const AdmissionOptions& options,
                           std::vector<std::string>* warnings) {
  JsonValue patch;
  patch.mutable_list_value();
  const std::map<std::string, std::string> annotations =
      StringMapAt(pod, {"metadata", "annotations"});
  const ParsedAnnotations parsed = ParsePodAnnotations(annotations);
  if (!parsed.has_priority_annotation) return patch;
  for (const AnnotationProblem& p : parsed.problems) warnings->push_back(p.Message());

  std::set<std::string> wanted;  // empty: every container
  if (auto it = annotations.find(std::string(kAnnotationContainers)); it != annotations.end()) {
    for (absl::string_view name : absl::StrSplit(it->second, ',', absl::SkipWhitespace())) {
      std::string n(name.data(), name.size());
      n.erase(0, n.find_first_not_of(' '));
      n.erase(n.find_last_not_of(' ') + 1);
      wanted.insert(n);
    }
  }
  const JsonValue* containers = At(pod, {"spec", "containers"});
  if (containers == nullptr || containers->kind_case() != JsonValue::kListValue) return patch;
  const std::string resource_token = EscapeJsonPointer(options.resource_name);
  const bool best_effort = parsed.settings.priority == PodPriority::kBestEffort;
  const int mps_percentage =
      best_effort ? MpsThreadPercentage(annotations, options, warnings) : 0;
  std::set<std::string> matched;
  int index = -1;
  for (const JsonValue& c : containers->list_value().values()) {
    ++index;
    const std::string name = StringAt(c, {"name"});
    if (!wanted.empty() && wanted.count(name) == 0) continue;
    matched.insert(name);
    const JsonValue* resources = Member(c, "resources");
    const JsonValue* limits = resources ? Member(*resources, "limits") : nullptr;
    const JsonValue* requests = resources ? Member(*resources, "requests") : nullptr;
    if (HasMember(limits, kWholeGpuResource) || HasMember(requests, kWholeGpuResource)) continue;
    if (mps_percentage > 0) {
      AddEnvPatch(c, index,
                  {{contract::kEnvMpsClientPriority, "1"},
                   {contract::kEnvMpsThreadPercentage, absl::StrCat(mps_percentage)}},
                  &patch);
    }
    if (HasMember(limits, options.resource_name)) continue;
    // Extended resources need limits; a request alone is copied into the limit.
    JsonValue amount = JsonString("1");
    if (const JsonValue* r = requests ? Member(*requests, options.resource_name) : nullptr) {
      amount = *r;
    }
    const std::string base = absl::StrCat("/spec/containers/", index, "/resources");
    JsonValue op;
    if (resources == nullptr || resources->kind_case() != JsonValue::kStructValue) {
      op = PatchOp(base, ObjectWith("limits", ObjectWith(options.resource_name, amount)));
    } else if (limits == nullptr || limits->kind_case() != JsonValue::kStructValue) {
      op = PatchOp(base + "/limits", ObjectWith(options.resource_name, amount));
    } else {
      op = PatchOp(absl::StrCat(base, "/limits/", resource_token), amount);
    }
    *patch.mutable_list_value()->add_values() = std::move(op);
  }
  for (const std::string& name : wanted) {
    if (matched.count(name) == 0) {
      warnings->push_back(absl::StrCat("orion/containers names \"", name,
                                       "\", which is not a container of this pod"));
    }
  }
  return patch;
}

AdmissionReply ReviewPodAdmission(std::string_view request_body,
                                  const AdmissionOptions& options) {
  absl::StatusOr<JsonValue> review = ParseJson(request_body);
  if (!review.ok()) return BadRequest("request body is not JSON");
  if (StringAt(*review, {"kind"}) != "AdmissionReview") {
    return BadRequest("request body is not an AdmissionReview");
  }
  const std::string api_version = StringAt(*review, {"apiVersion"});
  if (api_version != "admission.k8s.io/v1") {
    return BadRequest(absl::StrCat("unsupported AdmissionReview apiVersion \"", api_version,
                                   "\" (want admission.k8s.io/v1)"));
  }
  const std::string uid = StringAt(*review, {"request", "uid"});
  if (uid.empty()) return BadRequest("AdmissionReview without request.uid");

  JsonValue response;
  auto& rf = *response.mutable_struct_value()->mutable_fields();
  rf["uid"] = JsonString(uid);
  rf["allowed"] = JsonBool(true);  // never block a pod: at worst it runs without a share
  std::vector<std::string> warnings;

  const JsonValue* object = At(*review, {"request", "object"});
  const std::string kind = StringAt(*review, {"request", "kind", "kind"});
  if (kind == "Pod" && object != nullptr && object->kind_case() == JsonValue::kStructValue) {
    const JsonValue patch = SharePatchForPod(*object, options, &warnings);
    if (patch.list_value().values_size() > 0) {
      rf["patchType"] = JsonString("JSONPatch");
      rf["patch"] = JsonString(absl::Base64Escape(WriteJson(patch)));
    }
  } else if (kind != "Pod") {
    warnings.push_back(absl::StrCat("orion webhook ignores kind \"", kind, "\""));
  } else {
    warnings.push_back("orion webhook: request.object is not a pod object; admitted unchanged");
  }
  if (!warnings.empty()) {
    JsonValue list;
    for (const std::string& w : warnings) *list.mutable_list_value()->add_values() = JsonString(w);
    rf["warnings"] = std::move(list);
  }
  JsonValue out;
  auto& of = *out.mutable_struct_value()->mutable_fields();
  of["apiVersion"] = JsonString("admission.k8s.io/v1");
  of["kind"] = JsonString("AdmissionReview");
  of["response"] = std::move(response);
  return {200, WriteJson(out)};
}

}  // namespace orion::agent
