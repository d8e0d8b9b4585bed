// The CDI spec (Container Device Interface, cdiVersion 0.6.0) the DRA plugin writes for each
// prepared claim: one device named by the claim's UID whose containerEdits are what the device
// plugin's Allocate gives a container (share_allocation.h: the claim's GPUs, each once in the
// order given, in NVIDIA_VISIBLE_DEVICES or as their CDI devices; LD_PRELOAD of the
// interposer, ORION_SOCKET, the library and run folder mounts) plus the claim's settings as
// ORION_PRIORITY, ORION_MEMORY_LIMIT and ORION_LATENCY_TARGET_MS. The kubelet passes the CDI
// device ID gpu-share.orion.io/claim=<uid> to the runtime, which applies the edits. (The
// priority a pod runs at is still the one orion-server learns from the agent, never what a
// process says: the env only tells the process and its logs.)
//
// Usage:
//   ClaimCdi cdi = ClaimCdiSpec(claim_uid, {"GPU-8f4c..."}, settings, layout);
//   WriteFileAtomically(cdi_dir + "/" + ClaimCdiFileName(claim_uid), WriteJson(cdi.spec));
//   response.add_cdi_device_ids(...cdi.device_ids...)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "agent/annotations.h"
#include "agent/json.h"
#include "agent/share_allocation.h"

namespace orion::agent {

inline constexpr char kCdiVersion[] = "0.6.0";
inline constexpr char kClaimCdiKind[] = "gpu-share.orion.io/claim";

// True for a claim UID the plugin accepts in file and device names: 1..64 of [0-9a-zA-Z-]
// (a Kubernetes UID is 36).
bool ValidClaimUid(std::string_view uid);
std::string ClaimCdiDeviceId(std::string_view claim_uid);  // gpu-share.orion.io/claim=<uid>
std::string ClaimCdiFileName(std::string_view claim_uid);  // gpu-share.orion.io-claim_<uid>.json

struct ClaimCdi {
  JsonValue spec;
  // For the kubelet: the claim's device, then the GPUs' own CDI devices (nvidia.com/gpu=<uuid>)
  // when the layout hands GPUs out through CDI rather than NVIDIA_VISIBLE_DEVICES.
  std::vector<std::string> device_ids;
};
ClaimCdi ClaimCdiSpec(std::string_view claim_uid, const std::vector<std::string>& gpu_uuids,
                      const PodSettings& settings, ContainerLayout layout);

// Writes `content` to a temporary file beside `path`, syncs it and renames it over `path`, so a
// reader (the runtime) never sees half a spec. The temporary file is always a new one
// (O_CREAT|O_EXCL|O_NOFOLLOW): a symlink or file found at its name is neither followed nor
// reused; another name is tried, and after 16 an error names the last.
absl::Status WriteFileAtomically(const std::string& path, std::string_view content);

}  // namespace orion::agent
