// The kubelet device plugin (v1beta1) for two resources, each its own DevicePlugin service on a
// Unix socket in the kubelet's device-plugins folder, registered with kubelet.sock:
//   orion.io/gpu       shares_per_gpu shares per GPU, for best-effort containers;
//   orion.io/gpu-high  high_per_gpu slots per GPU, for high-priority containers (the webhook
//                      gives a high-priority pod's containers a slot instead of a share), so the
//                      kube-scheduler's resource fit admits at most high_per_gpu of them per GPU.
// A container holds one resource or the other, never both: the kubelet allocates a container's
// resources one at a time in no fixed order (its limits are a Go map) and tells a plugin nothing
// about the pod, so a plugin cannot pair two resources of one container reliably. A high slot
// names its GPU, so the container's place is the slot's.
// Shares go to the GPU with the most idle time by orion-server's busy figures (SetGpuIdle),
// else they spread; high slots likewise (see PreferredShares). A container asking for N of a
// resource is a job of N ranks: its N devices are preferred on N distinct GPUs, and Allocate
// gives it the GPUs its devices name, each once, in the node's order (GpusOfDevices), whatever
// devices the kubelet chose.
// It starts over (new sockets, new registrations) when the kubelet restarts, which it notices by
// kubelet.sock being replaced or one of its own sockets being removed (a restarting kubelet
// deletes every socket in the folder).
//
// Usage:
//   DevicePlugin plugin(config);
//   plugin.SetGpus({"GPU-8f4c..."});
//   plugin.Start();            // background thread: serve, register, watch the kubelet
//   ... plugin.Registered() ...
//   plugin.Stop();
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "agent/share_allocation.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"

namespace orion::agent {

struct DevicePluginConfig {
  std::string resource_name = "orion.io/gpu";
  std::string plugin_dir = "/var/lib/kubelet/device-plugins";
  std::string endpoint = "orion-gpu.sock";  // our socket's file name inside plugin_dir
  int shares_per_gpu = 8;
  // High-priority slots: high_per_gpu per GPU (0: the resource is not served).
  std::string high_resource_name = "orion.io/gpu-high";
  std::string high_endpoint = "orion-gpu-high.sock";
  int high_per_gpu = 1;
  ContainerLayout layout;
  std::chrono::milliseconds poll_interval{1000};  // kubelet restart detection
};

class DevicePlugin {
 public:
  explicit DevicePlugin(DevicePluginConfig config);
  ~DevicePlugin();
  DevicePlugin(const DevicePlugin&) = delete;
  DevicePlugin& operator=(const DevicePlugin&) = delete;

  // GPUs to advertise; ListAndWatch streams send the new list.
  void SetGpus(const std::vector<std::string>& gpu_uuids);
  // A GPU marked unhealthy keeps its shares listed as "Unhealthy": the kubelet stops placing
  // new pods on them.
  void SetGpuHealthy(const std::string& gpu_uuid, bool healthy);
  // Interposer folder handed out by Allocate (it changes when a new version is installed).
  void SetHostLibDir(const std::string& dir);
  // Idle fraction per GPU UUID over the last interval, from orion-server (see GpuIdle).
  void SetGpuIdle(GpuIdle idle);

  void Start();
  void Stop();
  bool Registered() const { return registered_.load(); }
  // How many times the plugin registered with a kubelet (1 + kubelet restarts seen).
  int Registrations() const { return registrations_.load(); }

  // Internal state shared with the gRPC service (public for the service class only).
  struct Inventory {
    std::mutex mu;
    std::condition_variable changed;
    uint64_t generation ABSL_GUARDED_BY(mu) = 1;
    std::vector<std::string> gpus ABSL_GUARDED_BY(mu);
    std::set<std::string> departed ABSL_GUARDED_BY(mu);  // advertised once, gone now
    std::vector<std::string> unhealthy ABSL_GUARDED_BY(mu);
    ContainerLayout layout ABSL_GUARDED_BY(mu);
    GpuIdle idle ABSL_GUARDED_BY(mu);
  };

 private:
  class Service;

  void Run();
  absl::Status ServeAndRegister();
  void StopServing();
  uint64_t KubeletSocketInode() const;
  bool OwnSocketExists() const;

  // One served resource: its service and gRPC server of the current serving period.
  struct Endpoint {
    std::string resource, socket;
    DeviceKind kind = DeviceKind::kShare;
    int per_gpu = 0;
    std::unique_ptr<Service> service;
    std::unique_ptr<grpc::Server> server;
  };

  const DevicePluginConfig config_;
  Inventory inventory_;
  std::vector<Endpoint> endpoints_;
  uint64_t registered_kubelet_inode_ = 0;
  std::atomic<bool> registered_{false};
  std::atomic<int> registrations_{0};
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::thread thread_;
};

}  // namespace orion::agent
