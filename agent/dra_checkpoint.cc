// The DRA plugin's checkpoint file (see dra_checkpoint.h).
#include "agent/dra_checkpoint.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/cdi_spec.h"
#include "agent/json.h"

namespace orion::agent {
namespace {

constexpr char kCheckpointKind[] = "orion-dra-checkpoint/v1";
// One entry is well under 4 KB; a node prepares at most a few hundred claims.
JsonLimits CheckpointLimits() { return {.max_bytes = 16 << 20, .max_values = 1'000'000}; }

std::vector<std::string> Strings(const JsonValue& v, std::string_view key) {
  std::vector<std::string> out;
  const JsonValue* list = Member(v, key);
  if (list == nullptr || !list->is_array()) return out;
  for (const JsonValue& s : *list) {
    if (s.is_string()) out.push_back(s.get<std::string>());
  }
  return out;
}

uint64_t Unsigned(const JsonValue& v, std::string_view key) {
  const JsonValue* n = Member(v, key);
  return n != nullptr && n->is_number_unsigned() ? n->get<uint64_t>() : 0;
}

}  // namespace

absl::StatusOr<PreparedClaims> LoadClaimCheckpoint(const std::string& path) {
  std::ifstream in(path);
  if (!in) return PreparedClaims{};
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<JsonValue> doc = ParseJson(text.str(), CheckpointLimits());
  if (!doc.ok()) return absl::DataLossError(absl::StrCat(path, ": ", doc.status().message()));
  if (StringAt(*doc, {"kind"}) != kCheckpointKind) {
    return absl::DataLossError(absl::StrCat(path, ": not a ", kCheckpointKind, " file"));
  }
  PreparedClaims claims;
  const JsonValue* list = Member(*doc, "claims");
  if (list == nullptr || !list->is_array()) return claims;
  for (const JsonValue& c : *list) {
    PreparedClaim claim;
    claim.uid = StringAt(c, {"uid"});
    if (!ValidClaimUid(claim.uid)) {
      return absl::DataLossError(absl::StrCat(path, ": a claim with UID \"", claim.uid, "\""));
    }
    claim.namespace_name = StringAt(c, {"namespace"});
    claim.name = StringAt(c, {"name"});
    const JsonValue* devices = Member(c, "devices");
    if (devices != nullptr && devices->is_array()) {
      for (const JsonValue& d : *devices) {
        claim.devices.push_back({.request = StringAt(d, {"request"}),
                                 .pool = StringAt(d, {"pool"}),
                                 .device = StringAt(d, {"device"}),
                                 .cdi_device_ids = Strings(d, "cdiDeviceIds")});
      }
    }
    claim.gpu_uuids = Strings(c, "gpus");
    claim.pod_uids = Strings(c, "pods");
    claim.settings.priority =
        StringAt(c, {"priority"}) == "high" ? PodPriority::kHigh : PodPriority::kBestEffort;
    claim.settings.memory_limit_bytes = Unsigned(c, "memoryLimitBytes");
    claim.settings.latency_target_us = Unsigned(c, "latencyTargetUs");
    claims[claim.uid] = std::move(claim);
  }
  return claims;
}

absl::Status SaveClaimCheckpoint(const std::string& path, const PreparedClaims& claims) {
  JsonValue list = JsonValue::array();
  for (const auto& [uid, c] : claims) {
    JsonValue devices = JsonValue::array();
    for (const PreparedClaim::Device& d : c.devices) {
      devices.push_back({{"request", d.request},
                         {"pool", d.pool},
                         {"device", d.device},
                         {"cdiDeviceIds", d.cdi_device_ids}});
    }
    list.push_back({{"uid", c.uid},
                    {"namespace", c.namespace_name},
                    {"name", c.name},
                    {"devices", std::move(devices)},
                    {"gpus", c.gpu_uuids},
                    {"pods", c.pod_uids},
                    {"priority", std::string(PriorityName(c.settings.priority))},
                    {"memoryLimitBytes", c.settings.memory_limit_bytes},
                    {"latencyTargetUs", c.settings.latency_target_us}});
  }
  const JsonValue doc = {{"kind", kCheckpointKind}, {"claims", std::move(list)}};
  return WriteFileAtomically(path, WriteJson(doc));
}

}  // namespace orion::agent
