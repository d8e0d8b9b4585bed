// Parsing of pods, pod lists and watch events (see pod.h).
#include "agent/pod.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/annotations.h"

namespace orion::agent {

absl::StatusOr<PodInfo> PodFromJson(const JsonValue& pod) {
  PodInfo info;
  info.uid = StringAt(pod, {"metadata", "uid"});
  info.namespace_name = StringAt(pod, {"metadata", "namespace"});
  info.name = StringAt(pod, {"metadata", "name"});
  info.resource_version = StringAt(pod, {"metadata", "resourceVersion"});
  info.node_name = StringAt(pod, {"spec", "nodeName"});
  info.phase = StringAt(pod, {"status", "phase"});
  info.annotations = StringMapAt(pod, {"metadata", "annotations"});
  const std::map<std::string, std::string> labels = StringMapAt(pod, {"metadata", "labels"});
  for (std::string_view key : kJobLabels) {
    if (auto it = labels.find(std::string(key)); it != labels.end()) info.labels.insert(*it);
  }
  if (info.uid.empty()) return absl::InvalidArgumentError("pod without metadata.uid");
  return info;
}

absl::StatusOr<PodList> ParsePodList(std::string_view json) {
  absl::StatusOr<JsonValue> doc = ParseJson(json, JsonLimits::PodList());
  if (!doc.ok()) return doc.status();
  if (StringAt(*doc, {"kind"}) != "PodList") {
    return absl::InvalidArgumentError(
        absl::StrCat("expected kind PodList, got \"", StringAt(*doc, {"kind"}), "\""));
  }
  PodList list;
  list.resource_version = StringAt(*doc, {"metadata", "resourceVersion"});
  if (const JsonValue* items = Member(*doc, "items"); items != nullptr && items->is_array()) {
    for (const JsonValue& item : *items) {
      absl::StatusOr<PodInfo> pod = PodFromJson(item);
      if (pod.ok()) list.pods.push_back(*std::move(pod));
    }
  }
  return list;
}

absl::StatusOr<WatchEvent> ParseWatchEvent(std::string_view json_line) {
  absl::StatusOr<JsonValue> doc = ParseJson(json_line, JsonLimits::WatchEvent());
  if (!doc.ok()) return doc.status();
  const std::string type = StringAt(*doc, {"type"});
  const JsonValue* object = Member(*doc, "object");
  if (object == nullptr) return absl::InvalidArgumentError("watch event without object");
  WatchEvent event;
  if (type == "ERROR") {
    event.type = WatchEventType::kError;
    const JsonValue* code = Member(*object, "code");
    if (code != nullptr && code->is_number()) {
      event.error_code = static_cast<int>(std::clamp(code->get<double>(), -1e9, 1e9));
    }
    event.error_message = StringAt(*object, {"message"});
    return event;
  }
  if (type == "BOOKMARK") {
    event.type = WatchEventType::kBookmark;
    event.pod.resource_version = StringAt(*object, {"metadata", "resourceVersion"});
    return event;
  }
  if (type == "ADDED") {
    event.type = WatchEventType::kAdded;
  } else if (type == "MODIFIED") {
    event.type = WatchEventType::kModified;
  } else if (type == "DELETED") {
    event.type = WatchEventType::kDeleted;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown watch event type \"", type, "\""));
  }
  absl::StatusOr<PodInfo> pod = PodFromJson(*object);
  if (!pod.ok()) return pod.status();
  event.pod = *std::move(pod);
  return event;
}

}  // namespace orion::agent
