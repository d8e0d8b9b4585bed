// The DRA kubelet plugin of driver gpu-share.orion.io (resource.k8s.io/v1, Kubernetes 1.34):
//   - a Registration service (pluginregistration v1) on a socket in the kubelet's
//     plugins_registry folder: type "DRAPlugin", the driver's name, the plugin socket, and the
//     gRPC services it serves ("v1.DRAPlugin", "v1beta1.DRAPlugin");
//   - the DRAPlugin service (v1 and v1beta1, one implementation) on the plugin socket:
//     NodePrepareResources reads each claim from the API server, maps its devices of this driver
//     to the node's GPUs (dra_claim.h), writes the claim's CDI spec (cdi_spec.h: the claim's
//     GPUs each once, in the node's order, so a claim of N shares on N GPUs, one per rank of a
//     job, gives its containers the N GPUs) and answers the CDI device IDs; NodeUnprepareResources removes the spec. Both are idempotent and every
//     claim succeeds or fails on its own (a per-claim error names what and where);
//   - the node's ResourceSlices (resource_slice.h), published at start and again when the GPUs
//     change, retried until the API server takes them;
//   - prepared claims in a checkpoint (dra_checkpoint.h) that a restarted agent reads back.
// Pods of a prepared claim get the claim's priority and limits at orion-server through
// ClaimPolicySink (claim_policy_sink.h), which asks PodPolicies().
//
// Usage:
//   DraPlugin dra(config, &api);
//   dra.SetGpus({{.index = 0, .uuid = "GPU-8f4c..."}});
//   absl::Status s = dra.Start();   // serve, register, publish
//   ... dra.Registered() ...
//   dra.Stop();
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "agent/dra_checkpoint.h"
#include "agent/dra_claim.h"
#include "agent/resource_slice.h"
#include "agent/share_allocation.h"
#include "dra/v1/api.pb.h"
#include "kube/kube_api.h"

namespace grpc {
class Server;
}

namespace orion::agent {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;

struct DraPluginConfig {
  std::string node_name;
  std::string plugin_dir = "/var/lib/kubelet/plugins/gpu-share.orion.io";
  std::string registry_dir = "/var/lib/kubelet/plugins_registry";
  std::string cdi_dir = "/var/run/cdi";
  int shares_per_gpu = 8;
  int high_per_gpu = 1;
  // orion-server's policy.min_latency_target_ms, in microseconds: a claim asking for a lower
  // latency target is refused at prepare (the server would raise it anyway). 0: no floor.
  uint64_t min_latency_target_us = 5000;
  ContainerLayout layout;
  std::chrono::milliseconds retry_interval{5000};  // ResourceSlice publication, socket checks
};

// What a prepared claim gives each of its pods.
struct ClaimPodPolicy {
  PodSettings settings;
  std::vector<std::string> gpu_uuids;
  std::vector<std::string> claims;  // "namespace/name" of the claims behind it
};

class DraPlugin {
 public:
  DraPlugin(DraPluginConfig config, kube::KubeApi* api);
  ~DraPlugin();
  DraPlugin(const DraPlugin&) = delete;
  DraPlugin& operator=(const DraPlugin&) = delete;

  // The node's GPUs; a change is published in the ResourceSlices.
  void SetGpus(std::vector<DraGpu> gpus);
  // Interposer folder handed to claims prepared from now on.
  void SetHostLibDir(const std::string& dir);
  // Called (outside the plugin's locks) after a claim is prepared or unprepared.
  void OnClaimsChanged(std::function<void()> listener);

  // Reads the checkpoint, serves the plugin and registration sockets, starts publishing.
  absl::Status Start();
  void Stop();
  // The kubelet told NotifyRegistrationStatus that the plugin is registered.
  bool Registered() const { return registered_.load(); }
  // The ResourceSlices of the current GPUs are on the API server.
  bool Published() const { return published_.load(); }
  std::string plugin_socket() const { return config_.plugin_dir + "/dra.sock"; }
  std::string registration_socket() const;

  // The DRAPlugin calls; the gRPC services are thin adapters over these.
  drav1::NodePrepareResourcesResponse Prepare(const drav1::NodePrepareResourcesRequest& request);
  drav1::NodeUnprepareResourcesResponse Unprepare(
      const drav1::NodeUnprepareResourcesRequest& request);

  // Pod UID -> what its prepared claims give it.
  std::map<std::string, ClaimPodPolicy> PodPolicies() const;
  PreparedClaims Claims() const;

  // gRPC service classes (defined in dra_plugin.cc).
  class Registration;
  class ServiceV1;
  class ServiceV1beta1;

 private:
  absl::StatusOr<PreparedClaim> PrepareClaim(const drav1::Claim& claim);
  // A pod is high priority only on the GPUs of its high devices: refuses a claim of high devices
  // for a pod that has a prepared claim of shares (or the other way round), and a claim of high
  // devices reserved for more than one pod. Errors name the claims and their devices.
  absl::Status CheckPodClaimsAgree(const DraClaim& claim,
                                   const std::vector<DraClaimGpu>& gpus) const;
  absl::Status UnprepareClaim(const drav1::Claim& claim);
  absl::Status ServeRegistration();
  void PublishLoop();
  std::string CheckpointPath() const { return config_.plugin_dir + "/checkpoint.json"; }
  void NotifyChanged();

  const DraPluginConfig config_;
  kube::KubeApi* const api_;
  ResourceSlicePublisher publisher_;

  mutable std::mutex mu_;
  DraInventory inventory_ ABSL_GUARDED_BY(mu_);
  ContainerLayout layout_ ABSL_GUARDED_BY(mu_);
  uint64_t inventory_generation_ ABSL_GUARDED_BY(mu_) = 1;
  PreparedClaims claims_ ABSL_GUARDED_BY(mu_);
  std::function<void()> listener_ ABSL_GUARDED_BY(mu_);
  // One prepare or unprepare at a time: the checkpoint is written whole after each.
  std::mutex prepare_mu_;

  std::unique_ptr<ServiceV1> service_v1_;
  std::unique_ptr<ServiceV1beta1> service_v1beta1_;
  std::unique_ptr<Registration> registration_;
  std::unique_ptr<grpc::Server> plugin_server_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::atomic<bool> registered_{false};
  std::atomic<bool> published_{false};

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread publish_thread_;
};

}  // namespace orion::agent
