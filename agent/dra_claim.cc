// Device names, claim configuration and ResourceClaim parsing of the DRA driver (see dra_claim.h).
#include "agent/dra_claim.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace orion::agent {
namespace {

constexpr char kGpuPrefix[] = "gpu-";
constexpr char kShareInfix[] = "-share-";
constexpr char kHighInfix[] = "-high";

// A non-negative decimal of at most 4 digits, no sign or leading zero (except "0").
std::optional<int> SmallIndex(std::string_view s) {
  if (s.empty() || s.size() > 4 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  int n = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size() || n < 0) return std::nullopt;
  return n;
}

std::string ClaimRef(const DraClaim& claim) {
  return absl::StrCat("claim ", claim.namespace_name, "/", claim.name);
}

// Copies a string member of a claim's JSON into *out; errors name the field.
absl::Status ReadString(const JsonValue& object, std::string_view key, std::string_view where,
                        std::string* out, bool required = true) {
  const JsonValue* v = Member(object, key);
  if (v == nullptr) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ".", std::string(key), " is missing"));
  }
  if (!v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ".", std::string(key), " is not a string"));
  }
  *out = v->get<std::string>();
  if (out->size() > 253) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ".", std::string(key), " is longer than 253 bytes"));
  }
  return absl::OkStatus();
}

// Merges `next` into `into`: the fields `next` sets win.
void Merge(const DraClaimConfig& next, DraClaimConfig* into) {
  if (next.priority) into->priority = next.priority;
  if (next.memory_limit_bytes) into->memory_limit_bytes = next.memory_limit_bytes;
  if (next.latency_target_us) into->latency_target_us = next.latency_target_us;
}

}  // namespace

std::string DraShareDeviceName(int gpu_index, int share) {
  return absl::StrCat(kGpuPrefix, gpu_index, kShareInfix, share);
}

std::string DraHighDeviceName(int gpu_index, int slot) {
  return slot == 0 ? absl::StrCat(kGpuPrefix, gpu_index, kHighInfix)
                   : absl::StrCat(kGpuPrefix, gpu_index, kHighInfix, "-", slot);
}

std::optional<DraDeviceName> ParseDraDeviceName(std::string_view name) {
  if (name.substr(0, (sizeof(kGpuPrefix) - 1)) != kGpuPrefix) return std::nullopt;
  name.remove_prefix((sizeof(kGpuPrefix) - 1));
  const size_t dash = name.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const std::optional<int> gpu = SmallIndex(name.substr(0, dash));
  if (!gpu) return std::nullopt;
  std::string_view rest = name.substr(dash);
  DraDeviceName out{.gpu_index = *gpu};
  if (rest.substr(0, (sizeof(kShareInfix) - 1)) == kShareInfix) {
    const std::optional<int> share = SmallIndex(rest.substr((sizeof(kShareInfix) - 1)));
    if (!share) return std::nullopt;
    out.slot = *share;
    return out;
  }
  if (rest.substr(0, (sizeof(kHighInfix) - 1)) != kHighInfix) return std::nullopt;
  rest.remove_prefix((sizeof(kHighInfix) - 1));
  out.high = true;
  if (rest.empty()) return out;
  if (rest[0] != '-') return std::nullopt;
  const std::optional<int> slot = SmallIndex(rest.substr(1));
  if (!slot || *slot == 0) return std::nullopt;  // slot 0 is spelt gpu-<i>-high
  out.slot = *slot;
  return out;
}

absl::StatusOr<DraClaimConfig> ParseDraClaimConfig(const JsonValue& parameters) {
  if (!parameters.is_object()) {
    return absl::InvalidArgumentError("parameters are not a JSON object");
  }
  DraClaimConfig out;
  for (const auto& item : parameters.items()) {
    // Named, not a structured binding: a lambda may not capture one before clang 16.
    const std::string& key = item.key();
    const JsonValue& value = item.value();
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("parameters.", key, ": ", std::string(why)));
    };
    if (key == "apiVersion") {
      if (!value.is_string() || value.get<std::string>() != kDraConfigApiVersion) {
        return bad(absl::StrCat("expected \"", kDraConfigApiVersion, "\""));
      }
    } else if (key == "kind") {
      if (!value.is_string() || value.get<std::string>() != kDraConfigKind) {
        return bad(absl::StrCat("expected \"", kDraConfigKind, "\""));
      }
    } else if (key == "priority") {
      if (!value.is_string()) return bad("expected \"high\" or \"best-effort\"");
      absl::StatusOr<PodPriority> p = ParsePriority(value.get<std::string>());
      if (!p.ok()) return bad(absl::StrCat("\"", value.get<std::string>(), "\": ", std::string(p.status().message())));
      out.priority = *p;
    } else if (key == "memoryLimit") {
      if (!value.is_string()) return bad("expected a quantity string such as \"4Gi\"");
      absl::StatusOr<uint64_t> bytes = ParseMemoryQuantity(value.get<std::string>());
      if (!bytes.ok()) {
        return bad(absl::StrCat("\"", value.get<std::string>(), "\": ", std::string(bytes.status().message())));
      }
      out.memory_limit_bytes = *bytes;
    } else if (key == "latencyTargetMs") {
      std::string text;
      if (value.is_string()) {
        text = value.get<std::string>();
      } else if (value.is_number() && std::isfinite(value.get<double>())) {
        text = value.dump();
      } else {
        return bad("expected milliseconds, a number such as 5 or 2.5");
      }
      absl::StatusOr<uint64_t> us = ParseLatencyTargetMs(text);
      if (!us.ok()) return bad(absl::StrCat(text, ": ", std::string(us.status().message())));
      out.latency_target_us = *us;
    } else {
      return bad("unknown field (known: apiVersion, kind, priority, memoryLimit, "
                 "latencyTargetMs)");
    }
  }
  return out;
}

absl::StatusOr<DraClaim> ParseResourceClaim(std::string_view body, std::string_view expect_uid) {
  absl::StatusOr<JsonValue> doc = ParseJson(body, ResourceClaimLimits());
  if (!doc.ok()) return doc.status();
  if (StringAt(*doc, {"kind"}) != "ResourceClaim") {
    return absl::InvalidArgumentError("the API server's answer is not a ResourceClaim");
  }
  DraClaim claim;
  claim.uid = StringAt(*doc, {"metadata", "uid"});
  claim.namespace_name = StringAt(*doc, {"metadata", "namespace"});
  claim.name = StringAt(*doc, {"metadata", "name"});
  if (claim.uid != expect_uid) {
    return absl::FailedPreconditionError(absl::StrCat(
        ClaimRef(claim), " has UID ", claim.uid, " on the API server, not ", std::string(expect_uid),
        " (deleted and created again?)"));
  }
  const JsonValue* allocation = At(*doc, {"status", "allocation"});
  if (allocation == nullptr || !allocation->is_object()) {
    return absl::FailedPreconditionError(absl::StrCat(ClaimRef(claim), " is not allocated"));
  }
  const JsonValue* results = At(*allocation, {"devices", "results"});
  if (results != nullptr && !results->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ClaimRef(claim), ": status.allocation.devices.results is not a list"));
  }
  if (results != nullptr) {
    for (size_t i = 0; i < results->size(); ++i) {
      const JsonValue& r = (*results)[i];
      const std::string where = absl::StrCat("status.allocation.devices.results[", i, "]");
      if (!r.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(ClaimRef(claim), ": ", where,
                                                       " is not an object"));
      }
      std::string driver;
      if (absl::Status s = ReadString(r, "driver", where, &driver); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(ClaimRef(claim), ": ", std::string(s.message())));
      }
      if (driver != kDraDriverName) continue;  // another driver's device: not ours to prepare
      DraAllocatedDevice d;
      for (auto [key, out] : {std::pair{"request", &d.request}, std::pair{"pool", &d.pool},
                              std::pair{"device", &d.device}}) {
        if (absl::Status s = ReadString(r, key, where, out); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(ClaimRef(claim), ": ", std::string(s.message())));
        }
      }
      if (claim.devices.size() == kMaxDevicesPerClaim) {
        return absl::InvalidArgumentError(absl::StrCat(
            ClaimRef(claim), ": more than ", kMaxDevicesPerClaim, " devices of ", kDraDriverName));
      }
      claim.devices.push_back(std::move(d));
    }
  }
  // Configs apply in order (the class's first, then the claim's); a config limited to requests
  // none of whose devices are ours does not apply.
  const JsonValue* configs = At(*allocation, {"devices", "config"});
  if (configs != nullptr && !configs->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ClaimRef(claim), ": status.allocation.devices.config is not a list"));
  }
  if (configs != nullptr) {
    for (size_t i = 0; i < configs->size(); ++i) {
      const JsonValue& c = (*configs)[i];
      const std::string where = absl::StrCat("status.allocation.devices.config[", i, "]");
      const JsonValue* opaque = Member(c, "opaque");
      if (opaque == nullptr || StringAt(*opaque, {"driver"}) != kDraDriverName) continue;
      const JsonValue* requests = Member(c, "requests");
      if (requests != nullptr && requests->is_array() && !requests->empty()) {
        const bool applies = std::any_of(claim.devices.begin(), claim.devices.end(), [&](auto& d) {
          return std::find(requests->begin(), requests->end(), JsonValue(d.request)) !=
                 requests->end();
        });
        if (!applies) continue;
      }
      const JsonValue* parameters = Member(*opaque, "parameters");
      if (parameters == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(ClaimRef(claim), ": ", where,
                                                       ".opaque.parameters is missing"));
      }
      absl::StatusOr<DraClaimConfig> config = ParseDraClaimConfig(*parameters);
      if (!config.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(ClaimRef(claim), ": ", where, ".opaque.",
                                                       std::string(config.status().message())));
      }
      Merge(*config, &claim.config);
    }
  }
  const JsonValue* reserved = At(*doc, {"status", "reservedFor"});
  if (reserved != nullptr && reserved->is_array()) {
    for (const JsonValue& consumer : *reserved) {
      // At most 256 consumers (the API's limit); a pod UID is 36 characters.
      if (claim.pod_uids.size() >= 256) break;
      const std::string uid = StringAt(consumer, {"uid"});
      if (StringAt(consumer, {"resource"}) == "pods" && !uid.empty() && uid.size() <= 64) {
        claim.pod_uids.push_back(uid);
      }
    }
  }
  return claim;
}

absl::StatusOr<std::vector<DraClaimGpu>> ResolveClaimDevices(const DraClaim& claim,
                                                             const DraInventory& inventory) {
  std::vector<DraClaimGpu> out;
  auto gpus_now = [&] {
    std::vector<std::string> names;
    for (const DraGpu& g : inventory.gpus) names.push_back(absl::StrCat(g.index, " (", g.uuid, ")"));
    return names.empty() ? std::string("none") : absl::StrJoin(names, ", ");
  };
  for (const DraAllocatedDevice& d : claim.devices) {
    const std::string what = absl::StrCat(ClaimRef(claim), ": device \"", d.device, "\" (request \"",
                                          d.request, "\", pool \"", d.pool, "\")");
    if (d.pool != inventory.node_name) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is not in this node's pool \"", inventory.node_name, "\""));
    }
    const std::optional<DraDeviceName> name = ParseDraDeviceName(d.device);
    const int per_gpu = name && name->high ? inventory.high_per_gpu : inventory.shares_per_gpu;
    if (!name || name->slot >= per_gpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is unknown: devices are gpu-<i>-share-<0..", inventory.shares_per_gpu - 1,
          "> and gpu-<i>-high for the GPUs ", gpus_now()));
    }
    auto gpu = std::find_if(inventory.gpus.begin(), inventory.gpus.end(),
                            [&](const DraGpu& g) { return g.index == name->gpu_index; });
    if (gpu == inventory.gpus.end()) {
      auto gone = inventory.departed.find(name->gpu_index);
      if (gone != inventory.departed.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " is on GPU ", gone->first, " (", gone->second,
            "), which has left this node; GPUs now: ", gpus_now()));
      }
      return absl::InvalidArgumentError(absl::StrCat(what, " names GPU ", name->gpu_index,
                                                     ", not one of this node's: ", gpus_now()));
    }
    if (claim.config.priority && (*claim.config.priority == PodPriority::kHigh) != name->high) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the claim's config says priority ", std::string(PriorityName(*claim.config.priority)),
          name->high ? ", but a gpu-<i>-high device is for high-priority claims only"
                     : ", which needs a gpu-<i>-high device (device class gpu-high.orion.io)"));
    }
    out.push_back({.device = d, .gpu = *gpu, .high = name->high});
  }
  // Priority is per GPU: a pod is high only where it holds a high device. A claim of high
  // devices and shares would make its pods high on the GPUs of the shares too (the pod has one
  // priority at orion-server), so it is refused, naming the devices of each kind.
  std::vector<std::string> high, shares;
  for (const DraClaimGpu& g : out) {
    (g.high ? high : shares).push_back(absl::StrCat(g.device.device, " (GPU ", g.gpu.index, ")"));
  }
  if (!high.empty() && !shares.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ClaimRef(claim), " mixes high devices (", absl::StrJoin(high, ", "), ") with shares (",
        absl::StrJoin(shares, ", "), "): a pod is high priority only on the GPUs of its high "
        "devices, so a claim holds either high devices (device class gpu-high.orion.io) or "
        "shares (gpu-share.orion.io), never both"));
  }
  return out;
}

PodSettings ClaimSettings(const DraClaim& claim, const std::vector<DraClaimGpu>& gpus) {
  PodSettings s;
  // High only with high devices (all of them, as ResolveClaimDevices refuses a mix): a config
  // saying high without one is refused there, and a claim without devices of ours stays
  // best-effort whatever its config says.
  const bool high = !gpus.empty() &&
                    std::all_of(gpus.begin(), gpus.end(), [](auto& g) { return g.high; });
  s.priority = high ? PodPriority::kHigh : PodPriority::kBestEffort;
  s.memory_limit_bytes = claim.config.memory_limit_bytes;
  s.latency_target_us = claim.config.latency_target_us;
  return s;
}

}  // namespace orion::agent
