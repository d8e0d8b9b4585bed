// How GPU shares are named, chosen and handed to containers by the device plugin. Pure: no
// gRPC calls, only the v1beta1 message types.
//
// A physical GPU with UUID U is advertised as `shares_per_gpu` devices "U::0" .. "U::n-1"
// (kubelet device IDs are opaque strings of at most 63 characters).
//
// Usage:
//   std::vector<std::string> ids = ShareIds({"GPU-1234..."}, 8);
//   v1beta1::ContainerAllocateResponse r = ContainerAllocation(request_ids, layout);
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"

namespace orion::agent {

inline constexpr std::string_view kInterposerFileName = "liborion_interpose.so";
// Annotation carrying CDI device names (cdi.k8s.io/<plugin>_<device>, as the CDI spec names
// them); one per container, listing all its GPUs.
inline constexpr char kCdiAnnotationKey[] = "cdi.k8s.io/orion-gpu-share_gpus";

// How a container is given its GPUs, as NVIDIA's device plugin names the choices:
//   kEnvVar: NVIDIA_VISIBLE_DEVICES=<uuids>, read by the NVIDIA container runtime (legacy mode);
//   kCdiCri: CDI device names in the Allocate response's cdi_devices (kubelet >= 1.28 passes
//            them to the runtime through the CRI), for a CDI-only container toolkit;
//   kCdiAnnotations: the same names in a cdi.k8s.io/ annotation, for runtimes that read CDI
//            annotations (containerd >= 1.7, CRI-O).
// In both CDI modes NVIDIA_VISIBLE_DEVICES is "void", so an image that sets it to "all" (CUDA
// base images do) cannot widen the container's GPUs through a legacy-mode runtime.
enum class DeviceListStrategy { kEnvVar, kCdiCri, kCdiAnnotations };
// Parses "envvar", "cdi-cri", "cdi-annotations"; false otherwise.
bool ParseDeviceListStrategy(std::string_view text, DeviceListStrategy* out);

// Where things are on the host and in the container; Allocate hands out these paths.
struct ContainerLayout {
  std::string host_lib_dir;                           // versioned folder of the interposer
  std::string container_lib_dir = "/usr/local/orion/lib";
  std::string run_dir = "/run/orion";                 // socket + board, same path both sides
  std::string socket_name = "orion.sock";
  DeviceListStrategy device_list = DeviceListStrategy::kEnvVar;
  std::string cdi_kind = "nvidia.com/gpu";  // CDI names are <kind>=<GPU UUID>
  // MPS control daemon run by the chart (empty: none). Containers get CUDA_MPS_PIPE_DIRECTORY
  // (the pipe folder sits in run_dir, mounted already) and the daemon's shared-memory folder as
  // their /dev/shm, which MPS clients and server must share.
  std::string mps_pipe_dir;
  std::string mps_shm_dir;
};

std::string ShareId(std::string_view gpu_uuid, int index);
// The GPU UUID of a share ID ("" if the ID is not one of ours).
std::string GpuOfShare(std::string_view share_id);
std::vector<std::string> ShareIds(const std::vector<std::string>& gpu_uuids, int shares_per_gpu);

// Env (the GPUs by `layout.device_list`, LD_PRELOAD, ORION_SOCKET, MPS pipe), CDI devices or
// annotations, and mounts (interposer folder read-only; run folder read-write: clients map the
// board and connect to the socket; MPS shared memory) for one container.
v1beta1::ContainerAllocateResponse ContainerAllocation(const std::vector<std::string>& share_ids,
                                                       const ContainerLayout& layout);

// Picks `size` shares: all of must_include first, then shares of the GPUs already chosen
// (a container asking for several shares wants them on one GPU), then of the GPU with the most
// free shares (spreads pods over GPUs). Returns fewer only if not enough are available.
std::vector<std::string> PreferredShares(const std::vector<std::string>& available,
                                         const std::vector<std::string>& must_include, int size);

}  // namespace orion::agent
