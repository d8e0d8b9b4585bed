// Pods as the agent needs them, read from API-server JSON: a pod list, and the lines of a
// watch stream (ADDED / MODIFIED / DELETED / BOOKMARK / ERROR). Pure parsing, no I/O.
//
// Usage:
//   absl::StatusOr<PodList> list = ParsePodList(body);
//   absl::StatusOr<WatchEvent> event = ParseWatchEvent(line);
//   if (event->type == WatchEventType::kError && event->error_code == 410) Relist();
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/json.h"

namespace orion::agent {

struct PodInfo {
  std::string uid;
  std::string namespace_name;
  std::string name;
  std::string node_name;
  std::string phase;  // Pending, Running, Succeeded, Failed, Unknown
  std::string resource_version;
  std::map<std::string, std::string> annotations;
  // Only the labels that name a pod's job (annotations.h kJobLabels): the rest are not kept.
  std::map<std::string, std::string> labels;

  // Succeeded or Failed pods hold no GPU work any more; the server can forget them.
  bool Finished() const { return phase == "Succeeded" || phase == "Failed"; }
};

struct PodList {
  std::string resource_version;
  std::vector<PodInfo> pods;
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };

struct WatchEvent {
  WatchEventType type = WatchEventType::kError;
  PodInfo pod;                   // kAdded, kModified, kDeleted; kBookmark: resource_version only
  int error_code = 0;            // kError: the Status code, 410 when the version is too old
  std::string error_message;
};

absl::StatusOr<PodInfo> PodFromJson(const JsonValue& pod);
absl::StatusOr<PodList> ParsePodList(std::string_view json);
absl::StatusOr<WatchEvent> ParseWatchEvent(std::string_view json_line);

}  // namespace orion::agent
