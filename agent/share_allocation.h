// How GPU shares are named, chosen and handed to containers by the device plugin. Pure: no
// gRPC calls, only the v1beta1 message types.
//
// A physical GPU with UUID U is advertised as `shares_per_gpu` devices "U::0" .. "U::n-1" of
// orion.io/gpu (best-effort containers) and `high_per_gpu` devices "U::high-0" .. of
// orion.io/gpu-high (high-priority containers: the slot is the container's place on the GPU, so
// the scheduler's resource fit admits at most high_per_gpu of them per GPU). Kubelet device IDs
// are opaque strings of at most 63 characters; a GPU UUID is 40.
//
// Usage:
//   std::vector<std::string> ids = ShareIds({"GPU-1234..."}, 8);
//   v1beta1::ContainerAllocateResponse r = ContainerAllocation(request_ids, layout);
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

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
std::string HighSlotId(std::string_view gpu_uuid, int index);
// The GPU UUID of a share or high slot ID ("" if the ID is not one of ours).
std::string GpuOfShare(std::string_view share_id);
std::vector<std::string> ShareIds(const std::vector<std::string>& gpu_uuids, int shares_per_gpu);
std::vector<std::string> HighSlotIds(const std::vector<std::string>& gpu_uuids, int high_per_gpu);

// Which devices a resource advertises: shares (orion.io/gpu) or high slots (orion.io/gpu-high).
enum class DeviceKind { kShare, kHighSlot };
// OK if `id` is a device of this kind (index below `per_gpu`) of one of `gpus`; otherwise an
// InvalidArgument naming the device and the resource (not one of ours), or a FailedPrecondition
// when it names a GPU in `departed`: advertised earlier, no longer on the node (the kubelet's
// checkpoint outlived it).
absl::Status CheckDeviceId(std::string_view id, DeviceKind kind, int per_gpu,
                           const std::vector<std::string>& gpus,
                           const std::set<std::string>& departed, std::string_view resource);

// Idle fraction (0..1) of each GPU over the last interval, from orion-server's busy figures;
// a GPU missing from the map is not known to the server (no client ever ran there): idle.
// An empty map means the figures are not available: placement only spreads.
using GpuIdle = std::map<std::string, double>;
// Idle fractions closer than this count as equal (the figures are estimates): then spread.
inline constexpr double kIdleTolerance = 0.05;

// The GPUs a container's devices (shares or high slots) name, each once, in the node's order
// (`node_gpus`: the order the plugin advertises them, by device minor); GPUs the node does not
// list (none, once Allocate has checked the IDs) come after, by UUID. The kubelet hands Allocate
// a container's device IDs in no fixed order (a Go set), so the order must come from here for
// NVIDIA_VISIBLE_DEVICES to be the same for the same devices.
std::vector<std::string> GpusOfDevices(const std::vector<std::string>& device_ids,
                                       const std::vector<std::string>& node_gpus);
// `gpus` without repeats, in the node's order as above.
std::vector<std::string> InNodeOrder(const std::vector<std::string>& gpus,
                                     const std::vector<std::string>& node_gpus);

// Env (the GPUs by `layout.device_list`, LD_PRELOAD, ORION_SOCKET, MPS pipe), CDI devices or
// annotations, and mounts (interposer folder read-only; run folder read-write: clients map the
// board and connect to the socket; MPS shared memory) for one container. Its GPUs are those its
// devices name (GpusOfDevices: each once, in `node_gpus`' order), however many of its devices
// sit on one GPU.
v1beta1::ContainerAllocateResponse ContainerAllocation(const std::vector<std::string>& share_ids,
                                                       const ContainerLayout& layout,
                                                       const std::vector<std::string>& node_gpus = {});
// The same for a container given whole GPUs by UUID (the DRA plugin's claims: agent/cdi_spec.h),
// in the order given; a GPU named twice is listed once.
v1beta1::ContainerAllocateResponse ContainerAllocationForGpus(const std::vector<std::string>& gpus,
                                                              const ContainerLayout& layout);

// Turns orion-server's cumulative busy seconds per GPU into idle fractions over the interval
// between two calls. The first call, a GPU first seen, or a counter that went back (a restarted
// server) give no figure for that GPU: it counts as idle (see GpuIdle).
class GpuIdleEstimator {
 public:
  // busy_seconds: GPU UUID -> kernel seconds since the server started; now_s: monotonic seconds.
  GpuIdle Update(const std::map<std::string, double>& busy_seconds, double now_s);

 private:
  std::map<std::string, double> last_busy_;
  double last_now_s_ = -1;
};

// Picks `size` devices (shares or high slots) for one container: all of must_include first, then
// one device on each GPU the container has none on yet (a container asking for N devices is a
// job of N ranks, one per GPU: torchrun, DDP, FSDP), taking the GPU with the most idle time
// (`idle`, differences under kIdleTolerance ignored), then the one with the most free devices
// (spreads pods over GPUs), then by UUID. Only when fewer GPUs than `size` have a free device
// does a GPU get a second device of the container (then a third, ...), by the same order, so the
// answer is still as spread as the free devices allow and full-sized (the kubelet would
// otherwise fill it with free devices of its own choosing). Returns fewer only if not enough
// are available.
std::vector<std::string> PreferredShares(const std::vector<std::string>& available,
                                         const std::vector<std::string>& must_include, int size,
                                         const GpuIdle& idle = {});

}  // namespace orion::agent
