// Admission rules: request checks and the policy decision (admission.h).
#include "server/admission.h"

#include <fnmatch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/utf8.h"

namespace orion::server {

using contract::Priority;

absl::Status ValidateRegisterRequest(const contract::RegisterRequest& r, size_t bytes_read) {
  if (bytes_read != sizeof(contract::RegisterRequest)) {
    return absl::InvalidArgumentError(absl::StrCat("register request has ", bytes_read,
                                                   " bytes, expected ",
                                                   sizeof(contract::RegisterRequest)));
  }
  if (r.header.magic != contract::kWireMagic) {
    return absl::InvalidArgumentError(absl::StrCat("bad magic 0x", absl::Hex(r.header.magic),
                                                   " (not an orion client?)"));
  }
  if (r.header.version != contract::kWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat("protocol version ", r.header.version,
                                                   " not supported (server speaks ",
                                                   contract::kWireVersion, ")"));
  }
  if (r.header.type != static_cast<uint32_t>(contract::MessageType::kRegister) ||
      r.header.bytes != sizeof(contract::RegisterRequest)) {
    return absl::InvalidArgumentError(absl::StrCat("message type ", r.header.type, " with ",
                                                   r.header.bytes,
                                                   " bytes is not a register request"));
  }
  if (r.requested_priority != contract::kNoValue32 && r.requested_priority > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("requested_priority ", r.requested_priority, " is not 0, 1 or unset"));
  }
  if (r.device_ordinal > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_ordinal ", r.device_ordinal, " is out of range"));
  }
  return absl::OkStatus();
}

namespace {

bool Matches(const std::string& glob, const std::string& text) {
  return !text.empty() && fnmatch(glob.c_str(), text.c_str(), 0) == 0;
}

// Whether a standalone rule names this peer: by what the kernel says of it only.
bool RuleMatches(const PriorityRule& rule, const PeerIdentity& peer) {
  if (rule.uid && *rule.uid != peer.uid) return false;
  if (!rule.exe_glob.empty() && !Matches(rule.exe_glob, peer.exe)) return false;
  if (!rule.process_glob.empty()) {
    const size_t slash = peer.exe.rfind('/');
    const std::string exe_name = slash == std::string::npos ? peer.exe : peer.exe.substr(slash + 1);
    if (!Matches(rule.process_glob, peer.process_name) &&
        !Matches(rule.process_glob, exe_name)) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string AdmitPodPolicy(const PolicyConfig& policy, PodPolicy* pod) {
  std::string why;
  pod->high_refused = false;
  pod->latency_raised_from_us = 0;
  const auto& allowed = policy.high_priority_namespaces;
  if (pod->priority == Priority::kHigh && !allowed.empty() &&
      std::find(allowed.begin(), allowed.end(), pod->ns) == allowed.end()) {
    pod->priority = Priority::kBestEffort;
    pod->high_refused = true;
    why = absl::StrCat("orion/priority: high refused, namespace ", pod->ns,
                       " is not in policy.high_priority_namespaces (", absl::StrJoin(allowed, ", "),
                       "): best-effort");
  }
  if (pod->latency_target_us != 0 && pod->latency_target_us < policy.min_latency_target_us) {
    pod->latency_raised_from_us = pod->latency_target_us;
    pod->latency_target_us = policy.min_latency_target_us;
    absl::StrAppend(&why, why.empty() ? "" : "; ", "orion/latency-target-ms ",
                    pod->latency_raised_from_us / 1000.0, " raised to the floor ",
                    policy.min_latency_target_us / 1000.0, " (policy.min_latency_target_ms)");
  }
  return why;
}

Priority PriorityOnGpu(const PodPolicy& pod, const std::string& gpu_uuid, std::string* source) {
  *source = pod.high_refused ? "namespace-not-allowed" : "pod-annotation";
  if (pod.priority != Priority::kHigh || pod.gpu_uuids.empty() ||
      std::find(pod.high_gpu_uuids.begin(), pod.high_gpu_uuids.end(), gpu_uuid) !=
          pod.high_gpu_uuids.end()) {
    return pod.priority;
  }
  *source = "no-high-device-on-gpu";
  return Priority::kBestEffort;
}

ClientPolicy DecidePolicy(const PeerIdentity& peer, const contract::RegisterRequest& request,
                          const ServerConfig& config, const PodPolicy* pod,
                          const Priority* pod_override) {
  ClientPolicy p;
  p.latency_target_us = config.policy.default_latency_target_us;
  const bool in_pod = !peer.cgroup.pod_uid.empty();
  if (in_pod) {
    if (pod) {
      p.priority = PriorityOnGpu(*pod, SanitizeUtf8(FixedString(request.gpu_uuid)), &p.source);
      p.memory_limit_bytes = pod->memory_limit_bytes;
      if (pod->latency_target_us) p.latency_target_us = pod->latency_target_us;
    }
  } else {
    bool matched = false;
    for (const PriorityRule& rule : config.rules) {
      if (!RuleMatches(rule, peer)) continue;
      p.priority = rule.priority;
      p.memory_limit_bytes = rule.memory_limit_bytes;
      if (rule.latency_target_us) p.latency_target_us = rule.latency_target_us;
      p.source = "config-rule";
      matched = true;
      break;
    }
    if (!matched && config.trust_client_requests) {
      if (request.requested_priority != contract::kNoValue32) {
        p.priority = static_cast<Priority>(request.requested_priority);
        p.source = "orion-run";
      }
      if (request.requested_memory_limit) {
        p.memory_limit_bytes = request.requested_memory_limit;
        p.source = "orion-run";
      }
      if (request.requested_latency_target_us) {
        p.latency_target_us =
            std::max(request.requested_latency_target_us, config.policy.min_latency_target_us);
      }
    }
  }
  if (pod_override) {
    p.priority = *pod_override;
    p.source = "admin";
  }
  return p;
}

}  // namespace orion::server
