// The kubelet device plugin for orion.io/gpu (v1beta1): serves DevicePlugin on a Unix socket in
// the kubelet's device-plugins folder, registers with kubelet.sock, and starts over (new socket,
// new registration) when the kubelet restarts, which it notices by kubelet.sock being replaced
// or its own socket being removed (a restarting kubelet deletes every socket in the folder).
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
    std::vector<std::string> unhealthy ABSL_GUARDED_BY(mu);
    ContainerLayout layout ABSL_GUARDED_BY(mu);
  };

 private:
  class Service;

  void Run();
  absl::Status ServeAndRegister();
  void StopServing();
  uint64_t KubeletSocketInode() const;
  bool OwnSocketExists() const;

  const DevicePluginConfig config_;
  Inventory inventory_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  uint64_t registered_kubelet_inode_ = 0;
  std::atomic<bool> registered_{false};
  std::atomic<int> registrations_{0};
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::thread thread_;
};

}  // namespace orion::agent
