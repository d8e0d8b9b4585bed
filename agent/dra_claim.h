// The DRA driver's API as users and the scheduler see it, parsed without any I/O: the names of
// the devices orion-agent publishes in its ResourceSlice, the claim configuration a user writes
// (opaque parameters of driver gpu-share.orion.io), and a ResourceClaim as the API server
// returns it, reduced to what NodePrepareResources needs. Everything arrives from outside, so
// every field is checked once here and every error names the claim and the field.
//
// Devices, per GPU of the node (index = the GPU's device minor, or its place in --gpus):
//   gpu-<i>-share-<k>   k in 0..shares_per_gpu-1, best-effort claims;
//   gpu-<i>-high        (gpu-<i>-high-<k> for k >= 1 with high_per_gpu > 1), high-priority
//                       claims: each device goes to one claim, so the scheduler's own allocator
//                       keeps at most high_per_gpu high-priority claims per GPU.
// Claim configuration (status.allocation.devices.config[].opaque.parameters):
//   {"apiVersion": "gpu-share.orion.io/v1alpha1", "kind": "GpuShareConfig",
//    "priority": "high", "memoryLimit": "4Gi", "latencyTargetMs": 5}
//
// Usage:
//   absl::StatusOr<DraClaim> claim = ParseResourceClaim(body, "4a5b...");
//   absl::StatusOr<std::vector<DraClaimGpu>> gpus = ResolveClaimDevices(*claim, inventory);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/annotations.h"
#include "agent/json.h"

namespace orion::agent {

inline constexpr char kDraDriverName[] = "gpu-share.orion.io";
inline constexpr char kDraConfigApiVersion[] = "gpu-share.orion.io/v1alpha1";
inline constexpr char kDraConfigKind[] = "GpuShareConfig";

// A ResourceClaim is a few KB; 256 KiB and 20,000 values bound a hostile or broken answer.
inline JsonLimits ResourceClaimLimits() { return {.max_bytes = 256 << 10, .max_values = 20'000}; }
// Devices of one claim that the plugin accepts (a pod rarely wants more than the node's GPUs).
inline constexpr size_t kMaxDevicesPerClaim = 64;

// One GPU as the DRA driver publishes it.
struct DraGpu {
  int index = 0;             // device minor (or place in --gpus): names the devices
  std::string uuid;          // GPU-...
  std::string product;       // "NVIDIA H100 80GB HBM3"; empty: unknown
  uint64_t memory_bytes = 0; // 0: unknown
};

// What the plugin serves now: the node, its GPUs, and the devices per GPU.
struct DraInventory {
  std::string node_name;  // the pool's name
  std::vector<DraGpu> gpus;
  std::map<int, std::string> departed;  // index -> UUID of GPUs published once, gone now
  int shares_per_gpu = 8;
  int high_per_gpu = 1;
};

std::string DraShareDeviceName(int gpu_index, int share);
std::string DraHighDeviceName(int gpu_index, int slot);

// A device name taken apart; nullopt when it is not one of the names above.
struct DraDeviceName {
  int gpu_index = 0;
  bool high = false;
  int slot = 0;  // share or high slot number
};
std::optional<DraDeviceName> ParseDraDeviceName(std::string_view name);

// The claim's settings from its opaque configuration; unset fields keep their defaults.
struct DraClaimConfig {
  std::optional<PodPriority> priority;
  uint64_t memory_limit_bytes = 0;  // 0: none
  uint64_t latency_target_us = 0;   // 0: the server's default
};
// `parameters`: one opaque parameters object. Unknown fields, a wrong apiVersion or kind, and
// malformed values are errors naming the field.
absl::StatusOr<DraClaimConfig> ParseDraClaimConfig(const JsonValue& parameters);

// One allocation result of driver gpu-share.orion.io.
struct DraAllocatedDevice {
  std::string request;
  std::string pool;
  std::string device;
};

struct DraClaim {
  std::string uid;
  std::string namespace_name;
  std::string name;
  std::vector<DraAllocatedDevice> devices;  // our driver's results only
  DraClaimConfig config;                    // our driver's configs merged, later ones win
  std::vector<std::string> pod_uids;        // status.reservedFor entries of resource "pods"
};

// A ResourceClaim (resource.k8s.io/v1) from the API server. Fails when it is not one, its UID is
// not `expect_uid` (the claim was deleted and created again), it is not allocated, or a config of
// our driver is malformed.
absl::StatusOr<DraClaim> ParseResourceClaim(std::string_view body, std::string_view expect_uid);

// A claim's device on a GPU of the node.
struct DraClaimGpu {
  DraAllocatedDevice device;
  DraGpu gpu;
  bool high = false;
};
// Maps each device of the claim to its GPU. Errors: a device of another pool (node), a name that
// is none of ours or names no GPU of the node (InvalidArgument), a GPU that has left the node
// (FailedPrecondition), a priority that contradicts the device (high needs a high device and a
// high device is for high-priority claims only), high devices beside shares in one claim (a pod
// is high only on the GPUs where it holds a high device; the message names the devices).
absl::StatusOr<std::vector<DraClaimGpu>> ResolveClaimDevices(const DraClaim& claim,
                                                             const DraInventory& inventory);

// The pod settings a prepared claim gives its pods: the priority from the devices (high devices
// mean high; none of ours, best-effort), memory and latency from the configuration.
PodSettings ClaimSettings(const DraClaim& claim, const std::vector<DraClaimGpu>& gpus);

}  // namespace orion::agent
