// The node's ResourceSlices (resource.k8s.io/v1): the devices the DRA driver
// gpu-share.orion.io offers on this node, one pool named after the node. Per GPU:
// shares_per_gpu share devices and high_per_gpu high devices (dra_claim.h has the names), each
// with attributes the claims' CEL selectors can use:
//   uuid (string), product (string, when known), index (int), high (bool),
//   mode (string: "time-sliced", or "mps" when the node runs the MPS daemon),
// and capacity memory (the GPU's memory, when known). A slice holds at most 128 devices (the
// API's limit); larger pools are split, all with the pool's generation.
//
// ResourceSlicePublisher writes them: creates missing slices, replaces changed ones (PUT with
// the resourceVersion it read) and deletes this node's slices of the driver that are no longer
// wanted (fewer GPUs). Call Publish again when the GPUs change; a failed Publish leaves what
// was there and says why. The slices are owned by the Node object (ownerReferences), so the
// API server's garbage collector removes them with a deleted node; when the node cannot be read
// (no RBAC for it) they are published without an owner and owner_problem() says why.
//
// Usage:
//   ResourceSlicePublisher slices(&api, "node-a");
//   absl::Status s = slices.Publish(inventory, "time-sliced");
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agent/dra_claim.h"
#include "agent/json.h"
#include "kube/kube_api.h"

namespace orion::agent {

inline constexpr size_t kMaxDevicesPerSlice = 128;
inline constexpr char kResourceSlicesPath[] = "/apis/resource.k8s.io/v1/resourceslices";

// "<node>-gpu-share.orion.io-<i>".
std::string ResourceSliceName(const std::string& node_name, size_t index);

// The slices for `inventory`, in order, without metadata.resourceVersion; owned by the Node
// of UID `node_uid` unless it is empty.
std::vector<JsonValue> NodeResourceSlices(const DraInventory& inventory, const std::string& mode,
                                          int64_t generation, const std::string& node_uid = "");

class ResourceSlicePublisher {
 public:
  ResourceSlicePublisher(kube::KubeApi* api, std::string node_name)
      : api_(api), node_name_(std::move(node_name)) {}

  absl::Status Publish(const DraInventory& inventory, const std::string& mode);
  // Deletes every slice of this node and driver (the plugin stops for good).
  absl::Status Withdraw();
  int64_t generation() const { return generation_; }
  // Why the last Publish wrote slices without an owner ("" when they have one).
  const std::string& owner_problem() const { return owner_problem_; }
  // Tries to read the Node again after a Publish without an owner; true once its UID is known
  // (then Publish again to give the slices their owner).
  bool LearnOwner() { return NodeUid().ok(); }

 private:
  struct Existing {
    std::string name;
    std::string resource_version;
    int64_t generation = 0;
  };
  absl::StatusOr<std::vector<Existing>> ListOwn();
  // The Node's UID, read once it is known.
  absl::StatusOr<std::string> NodeUid();

  kube::KubeApi* const api_;
  const std::string node_name_;
  int64_t generation_ = 0;
  std::string node_uid_;
  std::string owner_problem_;
};

}  // namespace orion::agent
