// AdmissionReview v1 handling of the orion webhook (see admission.h).
#include "agent/admission.h"

#include <algorithm>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/annotations.h"

namespace orion::agent {
namespace {

constexpr std::string_view kWholeGpuResource = "nvidia.com/gpu";

JsonValue PatchOp(std::string path, JsonValue value) {
  return {{"op", "add"}, {"path", std::move(path)}, {"value", std::move(value)}};
}

JsonValue ObjectWith(std::string_view key, JsonValue value) {
  JsonValue obj = JsonValue::object();
  obj[std::string(key)] = std::move(value);
  return obj;
}

bool HasMember(const JsonValue* obj, std::string_view key) {
  return obj != nullptr && Member(*obj, key) != nullptr;
}

bool SetsEnv(const JsonValue& container, std::string_view name) {
  const JsonValue* env = Member(container, "env");
  if (env == nullptr || !env->is_array()) return false;
  for (const JsonValue& e : *env) {
    if (StringAt(e, {"name"}) == name) return true;
  }
  return false;
}

JsonValue EnvVar(std::string_view name, std::string value) {
  return {{"name", std::string(name)}, {"value", std::move(value)}};
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

AdmissionReply BadRequest(std::string_view why, int http_status = 400) {
  JsonValue err = ObjectWith("error", absl::StrCat("orion webhook: ", std::string(why)));
  return {http_status, WriteJson(err)};
}

// Appends "add" operations that give the container each variable it does not set itself.
void AddEnvPatch(const JsonValue& container, int index,
                 const std::vector<std::pair<std::string_view, std::string>>& vars,
                 JsonValue* patch) {
  const std::string base = absl::StrCat("/spec/containers/", index, "/env");
  const JsonValue* env = Member(container, "env");
  bool has_list = env != nullptr && env->is_array();
  for (const auto& [name, value] : vars) {
    if (SetsEnv(container, name)) continue;
    if (has_list) {
      patch->push_back(PatchOp(base + "/-", EnvVar(name, value)));
    } else {
      patch->push_back(PatchOp(base, JsonValue::array({EnvVar(name, value)})));
      has_list = true;
    }
  }
}

// Whether the pod's namespace may hold high-priority slots (options.high_priority_namespaces;
// empty: every namespace).
bool HighAllowedIn(const std::string& ns, const AdmissionOptions& options) {
  const auto& allowed = options.high_priority_namespaces;
  return allowed.empty() || std::find(allowed.begin(), allowed.end(), ns) != allowed.end();
}

bool AsksFor(const JsonValue& container, const std::string& resource) {
  const JsonValue* resources = Member(container, "resources");
  if (resources == nullptr) return false;
  return HasMember(Member(*resources, "limits"), resource) ||
         HasMember(Member(*resources, "requests"), resource);
}


// Outside the namespaces allowed high priority, a container's own ask for the high-priority
// slot (`high_resource_name`) becomes a share: the slot is the GPU's only place for a
// high-priority pod, and a pod the server runs best-effort would hold it for nothing. The
// slot's entry moves to the share's (or goes, where the container asks for a share too) in
// limits and requests; a request alone gets its limit. `list`: "containers" or "initContainers"
// (an init container's devices are the pod's too, a sidecar's for the pod's life).
void ShareInsteadOfHighSlot(const JsonValue& pod, std::string_view list,
                            const AdmissionOptions& options, const std::string& ns,
                            JsonValue* patch, std::vector<std::string>* warnings) {
  const JsonValue* containers = At(pod, {"spec", std::string(list)});
  if (containers == nullptr || !containers->is_array()) return;
  const std::string& high = options.high_resource_name;
  const std::string& share = options.resource_name;
  const std::string high_token = EscapeJsonPointer(high);
  const std::string share_token = EscapeJsonPointer(share);
  int index = -1;
  for (const JsonValue& c : *containers) {
    ++index;
    if (!AsksFor(c, high)) continue;
    const JsonValue* resources = Member(c, "resources");
    const std::string base = absl::StrCat("/spec/", std::string(list), "/", index, "/resources");
    const JsonValue* limits = Member(*resources, "limits");
    const JsonValue* requests = Member(*resources, "requests");
    for (const char* part : {"limits", "requests"}) {
      const JsonValue* m = std::string_view(part) == "limits" ? limits : requests;
      if (!HasMember(m, high)) continue;
      const std::string from = absl::StrCat(base, "/", part, "/", high_token);
      if (HasMember(m, share)) {
        patch->push_back({{"op", "remove"}, {"path", from}});
      } else {
        patch->push_back(
            {{"op", "move"}, {"from", from}, {"path", absl::StrCat(base, "/", part, "/", share_token)}});
      }
    }
    if (!HasMember(limits, share) && !HasMember(limits, high)) {
      // The ask was a request alone: extended resources need the limit too.
      const JsonValue& amount = *Member(*requests, HasMember(requests, share) ? share : high);
      patch->push_back(limits == nullptr || !limits->is_object()
                           ? PatchOp(base + "/limits", ObjectWith(share, amount))
                           : PatchOp(absl::StrCat(base, "/limits/", share_token), amount));
    }
    warnings->push_back(absl::StrCat(
        list == "containers" ? "container \"" : "init container \"", StringAt(c, {"name"}),
        "\" asks for ", high, ", which only pods in namespaces ",
        absl::StrJoin(options.high_priority_namespaces, ", "), " may hold (not \"", ns,
        "\"): it gets ", share, " instead and runs best-effort"));
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
                           std::vector<std::string>* warnings, const std::string& ns) {
  JsonValue patch = JsonValue::array();
  // Whatever the annotations say: the high-priority slot only in the allowed namespaces.
  const bool high_allowed = HighAllowedIn(ns, options);
  if (!high_allowed && !options.high_resource_name.empty()) {
    for (std::string_view list : {"containers", "initContainers"}) {
      ShareInsteadOfHighSlot(pod, list, options, ns, &patch, warnings);
    }
  }
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
  if (containers == nullptr || !containers->is_array()) return patch;
  bool best_effort = parsed.settings.priority == PodPriority::kBestEffort;
  const auto& allowed = options.high_priority_namespaces;
  if (!best_effort && !high_allowed) {
    // The server runs it best-effort: it takes a share, not a GPU's high-priority slot.
    warnings->push_back(absl::StrCat(
        "orion/priority: high is not honoured in namespace \"", ns,
        "\" (allowed: ", absl::StrJoin(allowed, ", "),
        "); the pod gets a best-effort share and runs best-effort"));
    best_effort = true;
  }
  const bool high = !best_effort && !options.high_resource_name.empty();
  // What this pod's containers get: a share, or the high-priority slot of a GPU.
  const std::string& resource = high ? options.high_resource_name : options.resource_name;
  const std::string resource_token = EscapeJsonPointer(resource);
  const int mps_percentage =
      best_effort ? MpsThreadPercentage(annotations, options, warnings) : 0;
  std::set<std::string> matched;
  int index = -1;
  for (const JsonValue& c : *containers) {
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
    if (HasMember(limits, resource)) continue;
    if (!high && !options.high_resource_name.empty() && AsksFor(c, options.high_resource_name)) {
      // Its ask for the high-priority slot was made a share above (a namespace not allowed
      // high priority), or it is left as asked: a share beside it would give the container
      // two devices.
      if (high_allowed) {
        warnings->push_back(absl::StrCat(
            "container \"", name, "\" asks for ", options.high_resource_name,
            " though the pod is best-effort: left as asked, no ", options.resource_name,
            " added; it holds its GPU's high-priority slot while it runs best-effort"));
      }
      continue;
    }
    const std::string base = absl::StrCat("/spec/containers/", index, "/resources");
    if (high && (HasMember(limits, options.resource_name) ||
                 HasMember(requests, options.resource_name))) {
      // A high-priority container that asked for a share itself: one share becomes its slot
      // (the slot is its place on the GPU); more than one is left as asked, with a warning.
      const JsonValue* asked = HasMember(limits, options.resource_name)
                                   ? Member(*limits, options.resource_name)
                                   : Member(*requests, options.resource_name);
      const bool one = (asked->is_string() && asked->get<std::string>() == "1") ||
                       (asked->is_number_integer() && asked->get<int64_t>() == 1);
      if (!one) {
        warnings->push_back(absl::StrCat(
            "container \"", name, "\" asks for ", WriteJson(*asked), " ", options.resource_name,
            ", left as asked: a high-priority container takes one ", resource,
            " instead, which keeps it the only high-priority one on its GPU"));
        continue;
      }
      const std::string from_token = EscapeJsonPointer(options.resource_name);
      for (const char* part : {"limits", "requests"}) {
        const JsonValue* m = std::string_view(part) == "limits" ? limits : requests;
        if (!HasMember(m, options.resource_name)) continue;
        patch.push_back({{"op", "move"},
                         {"from", absl::StrCat(base, "/", part, "/", from_token)},
                         {"path", absl::StrCat(base, "/", part, "/", resource_token)}});
      }
      if (!HasMember(limits, options.resource_name)) {  // a request alone: add the limit
        patch.push_back(limits == nullptr || !limits->is_object()
                            ? PatchOp(base + "/limits", ObjectWith(resource, "1"))
                            : PatchOp(absl::StrCat(base, "/limits/", resource_token), "1"));
      }
      continue;
    }
    // Extended resources need limits; a request alone is copied into the limit.
    JsonValue amount = "1";
    if (const JsonValue* r = requests ? Member(*requests, resource) : nullptr) {
      amount = *r;
    }
    JsonValue op;
    if (resources == nullptr || !resources->is_object()) {
      op = PatchOp(base, ObjectWith("limits", ObjectWith(resource, amount)));
    } else if (limits == nullptr || !limits->is_object()) {
      op = PatchOp(base + "/limits", ObjectWith(resource, amount));
    } else {
      op = PatchOp(absl::StrCat(base, "/limits/", resource_token), amount);
    }
    patch.push_back(std::move(op));
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
  absl::StatusOr<JsonValue> review = ParseJson(request_body, JsonLimits::AdmissionReview());
  if (!review.ok()) {
    if (review.status().code() == absl::StatusCode::kResourceExhausted) {
      return BadRequest(absl::StrCat("request body refused: ", review.status().message()),
                        request_body.size() > JsonLimits::AdmissionReview().max_bytes ? 413 : 400);
    }
    return BadRequest(absl::StrCat("request body is not JSON (", review.status().message(), ")"));
  }
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

  // Never block a pod: at worst it runs without a share.
  JsonValue response = {{"uid", uid}, {"allowed", true}};
  std::vector<std::string> warnings;

  const JsonValue* object = At(*review, {"request", "object"});
  const std::string kind = StringAt(*review, {"request", "kind", "kind"});
  if (kind == "Pod" && object != nullptr && object->is_object()) {
    std::string ns = StringAt(*review, {"request", "namespace"});
    if (ns.empty()) ns = StringAt(*object, {"metadata", "namespace"});
    const JsonValue patch = SharePatchForPod(*object, options, &warnings, ns);
    if (!patch.empty()) {
      response["patchType"] = "JSONPatch";
      response["patch"] = absl::Base64Escape(WriteJson(patch));
    }
  } else if (kind != "Pod") {
    warnings.push_back(absl::StrCat("orion webhook ignores kind \"", kind, "\""));
  } else {
    warnings.push_back("orion webhook: request.object is not a pod object; admitted unchanged");
  }
  if (!warnings.empty()) response["warnings"] = warnings;
  const JsonValue out = {{"apiVersion", "admission.k8s.io/v1"},
                         {"kind", "AdmissionReview"},
                         {"response", std::move(response)}};
  return {200, WriteJson(out)};
}

}  // namespace orion::agent
