// Which claims the DRA plugin has prepared, kept in a checkpoint file in the plugin's folder so
// that a restarted orion-agent still knows them: the kubelet does not prepare a claim twice, but
// it unprepares it later, and the pods running on it keep their priority and limits (the agent
// tells orion-server again). Written whole to a temporary file and renamed after every change.
//
// Usage:
//   absl::StatusOr<PreparedClaims> claims = LoadClaimCheckpoint(dir + "/checkpoint.json");
//   claims->emplace(uid, claim);  SaveClaimCheckpoint(path, *claims);
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/annotations.h"

namespace orion::agent {

// A prepared claim: what NodePrepareResources answered and what the claim's pods get.
struct PreparedClaim {
  std::string uid;
  std::string namespace_name;
  std::string name;
  struct Device {
    std::string request;
    std::string pool;
    std::string device;
    std::vector<std::string> cdi_device_ids;
  };
  std::vector<Device> devices;
  std::vector<std::string> gpu_uuids;  // distinct, in the node's order (GPU index)
  std::vector<std::string> pod_uids;   // the claim's reservedFor pods when it was prepared
  PodSettings settings;
};
using PreparedClaims = std::map<std::string, PreparedClaim>;  // by claim UID

// A missing file is no claims. A file that is not a checkpoint is an error (the caller moves it
// aside and says so rather than losing it).
absl::StatusOr<PreparedClaims> LoadClaimCheckpoint(const std::string& path);
absl::Status SaveClaimCheckpoint(const std::string& path, const PreparedClaims& claims);

}  // namespace orion::agent
