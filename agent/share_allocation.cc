// Share naming, allocation contents and preferred allocation (see share_allocation.h).
#include "agent/share_allocation.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "contract/orion_contract.h"

namespace orion::agent {
namespace {
constexpr char kSeparator[] = "::";
constexpr std::string_view kHighPrefix = "high-";

// Idle fraction of a GPU by the server's figures; 1 (idle) for a GPU the server does not know.
double IdleOf(const GpuIdle& idle, const std::string& gpu) {
  auto it = idle.find(gpu);
  return it == idle.end() ? 1.0 : it->second;
}
}  // namespace

bool ParseDeviceListStrategy(std::string_view text, DeviceListStrategy* out) {
  if (text == "envvar") {
    *out = DeviceListStrategy::kEnvVar;
  } else if (text == "cdi-cri") {
    *out = DeviceListStrategy::kCdiCri;
  } else if (text == "cdi-annotations") {
    *out = DeviceListStrategy::kCdiAnnotations;
  } else {
    return false;
  }
  return true;
}

std::string ShareId(std::string_view gpu_uuid, int index) {
  return absl::StrCat(std::string(gpu_uuid), kSeparator, index);
}

std::string HighSlotId(std::string_view gpu_uuid, int index) {
  return absl::StrCat(std::string(gpu_uuid), kSeparator, std::string(kHighPrefix), index);
}

std::vector<std::string> HighSlotIds(const std::vector<std::string>& gpu_uuids, int high_per_gpu) {
  std::vector<std::string> ids;
  for (const std::string& uuid : gpu_uuids) {
    for (int i = 0; i < high_per_gpu; ++i) ids.push_back(HighSlotId(uuid, i));
  }
  return ids;
}

absl::Status CheckDeviceId(std::string_view id, DeviceKind kind, int per_gpu,
                           const std::vector<std::string>& gpus,
                           const std::set<std::string>& departed, std::string_view resource) {
  const size_t pos = id.rfind(std::string_view(kSeparator));
  const char* what = kind == DeviceKind::kShare ? "U::<share>" : "U::high-<slot>";
  auto not_ours = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown device \"", std::string(id), "\" for ", std::string(resource), ": ",
        std::string(why), " (its devices are ", what, ", U a GPU of this node: ",
        gpus.empty() ? std::string("none") : absl::StrJoin(gpus, ", "), ")"));
  };
  if (pos == std::string_view::npos || pos == 0) return not_ours("no GPU UUID in it");
  std::string_view index = id.substr(pos + 2);
  if (kind == DeviceKind::kHighSlot) {
    if (index.substr(0, kHighPrefix.size()) != kHighPrefix) return not_ours("not a high slot");
    index.remove_prefix(kHighPrefix.size());
  }
  int n = -1;
  if (index.empty() || index.size() > 4 ||
      index.find_first_not_of("0123456789") != std::string_view::npos ||
      !absl::SimpleAtoi(std::string(index), &n) || n >= per_gpu) {
    return not_ours(absl::StrCat("index \"", std::string(index), "\" is not in 0..",
                                 per_gpu - 1));
  }
  const std::string gpu(id.substr(0, pos));
  if (std::find(gpus.begin(), gpus.end(), gpu) == gpus.end()) {
    if (departed.count(gpu) == 0) return not_ours(absl::StrCat("GPU ", gpu, " is not one of them"));
    return absl::FailedPreconditionError(absl::StrCat(
        "device \"", std::string(id), "\" of ", std::string(resource), " names GPU ", gpu,
        ", which has left this node (GPUs now: ",
        gpus.empty() ? std::string("none") : absl::StrJoin(gpus, ", "),
        "); the container is not started and nothing was handed out"));
  }
  return absl::OkStatus();
}

std::string GpuOfShare(std::string_view share_id) {
  const size_t pos = share_id.rfind(std::string_view(kSeparator));
  return pos == std::string_view::npos ? "" : std::string(share_id.substr(0, pos));
}

std::vector<std::string> ShareIds(const std::vector<std::string>& gpu_uuids, int shares_per_gpu) {
  std::vector<std::string> ids;
  for (const std::string& uuid : gpu_uuids) {
    for (int i = 0; i < shares_per_gpu; ++i) ids.push_back(ShareId(uuid, i));
  }
  return ids;
}

std::vector<std::string> InNodeOrder(const std::vector<std::string>& gpus,
                                     const std::vector<std::string>& node_gpus) {
  std::vector<std::string> out;
  std::set<std::string> wanted(gpus.begin(), gpus.end());
  wanted.erase("");
  for (const std::string& gpu : node_gpus) {
    if (wanted.erase(gpu) > 0) out.push_back(gpu);
  }
  out.insert(out.end(), wanted.begin(), wanted.end());  // not the node's: by UUID (set order)
  return out;
}

std::vector<std::string> GpusOfDevices(const std::vector<std::string>& device_ids,
                                       const std::vector<std::string>& node_gpus) {
  std::vector<std::string> gpus;
  for (const std::string& id : device_ids) gpus.push_back(GpuOfShare(id));
  return InNodeOrder(gpus, node_gpus);
}

v1beta1::ContainerAllocateResponse ContainerAllocation(const std::vector<std::string>& share_ids,
                                                       const ContainerLayout& layout,
                                                       const std::vector<std::string>& node_gpus) {
  return ContainerAllocationForGpus(GpusOfDevices(share_ids, node_gpus), layout);
}

v1beta1::ContainerAllocateResponse ContainerAllocationForGpus(const std::vector<std::string>& given,
                                                              const ContainerLayout& layout) {
  // Each GPU once: a container sees a GPU once however many of its devices sit there.
  std::vector<std::string> gpus;
  for (const std::string& gpu : given) {
    if (std::find(gpus.begin(), gpus.end(), gpu) == gpus.end()) gpus.push_back(gpu);
  }
  v1beta1::ContainerAllocateResponse r;
  auto& envs = *r.mutable_envs();
  std::vector<std::string> cdi_names;
  for (const std::string& gpu : gpus) cdi_names.push_back(absl::StrCat(layout.cdi_kind, "=", gpu));
  switch (layout.device_list) {
    case DeviceListStrategy::kEnvVar:
      envs["NVIDIA_VISIBLE_DEVICES"] = absl::StrJoin(gpus, ",");
      break;
    case DeviceListStrategy::kCdiCri:
      envs["NVIDIA_VISIBLE_DEVICES"] = "void";
      for (const std::string& name : cdi_names) r.add_cdi_devices()->set_name(name);
      break;
    case DeviceListStrategy::kCdiAnnotations:
      envs["NVIDIA_VISIBLE_DEVICES"] = "void";
      (*r.mutable_annotations())[kCdiAnnotationKey] = absl::StrJoin(cdi_names, ",");
      break;
  }
  envs["LD_PRELOAD"] = absl::StrCat(layout.container_lib_dir, "/", std::string(kInterposerFileName));
  // The interposer is also the pod's NVTX tool (steps and requests on the timeline); a pod that
  // sets the variable itself (a profiler) keeps its own: the container's env wins over these.
  envs[contract::kEnvNvtxInjection] = envs["LD_PRELOAD"];
  envs[contract::kEnvSocket] = absl::StrCat(layout.run_dir, "/", layout.socket_name);
  v1beta1::Mount* lib = r.add_mounts();
  lib->set_container_path(layout.container_lib_dir);
  lib->set_host_path(layout.host_lib_dir);
  lib->set_read_only(true);
  // Read-only: a process only connects to the socket there (which a read-only mount allows);
  // the board and its own areas come over the socket, so a tenant can write nothing in it.
  v1beta1::Mount* run = r.add_mounts();
  run->set_container_path(layout.run_dir);
  run->set_host_path(layout.run_dir);
  run->set_read_only(true);
  if (!layout.mps_pipe_dir.empty()) {
    envs["CUDA_MPS_PIPE_DIRECTORY"] = layout.mps_pipe_dir;
    // The MPS client side writes to its control pipe: its folder stays writable.
    v1beta1::Mount* pipe = r.add_mounts();
    pipe->set_container_path(layout.mps_pipe_dir);
    pipe->set_host_path(layout.mps_pipe_dir);
    pipe->set_read_only(false);
  }
  if (!layout.mps_shm_dir.empty()) {
    v1beta1::Mount* shm = r.add_mounts();
    shm->set_container_path("/dev/shm");
    shm->set_host_path(layout.mps_shm_dir);
    shm->set_read_only(false);
  }
  return r;
}

GpuIdle GpuIdleEstimator::Update(const std::map<std::string, double>& busy_seconds,
                                 double now_s) {
  GpuIdle idle;
  const double interval = now_s - last_now_s_;
  if (last_now_s_ >= 0 && interval > 0) {
    for (const auto& [gpu, busy] : busy_seconds) {
      auto it = last_busy_.find(gpu);
      if (it == last_busy_.end() || busy < it->second) continue;
      idle[gpu] = std::clamp(1.0 - (busy - it->second) / interval, 0.0, 1.0);
    }
  }
  last_busy_ = busy_seconds;
  last_now_s_ = now_s;
  return idle;
}

std::vector<std::string> PreferredShares(const std::vector<std::string>& available,
                                         const std::vector<std::string>& must_include, int size,
                                         const GpuIdle& idle) {
  std::vector<std::string> chosen;
  std::set<std::string> taken;
  std::map<std::string, int> mine;  // GPU -> devices of this container on it
  for (const std::string& id : must_include) {
    if (static_cast<int>(chosen.size()) >= size) break;
    if (taken.insert(id).second) {
      chosen.push_back(id);
      ++mine[GpuOfShare(id)];
    }
  }
  // Free devices by GPU, each GPU's in the order given (the map's order, UUID, breaks ties).
  std::map<std::string, std::vector<std::string>> free_by_gpu;
  for (const std::string& id : available) {
    if (taken.count(id) == 0) free_by_gpu[GpuOfShare(id)].push_back(id);
  }
  std::map<std::string, size_t> next;  // GPU -> its first free device not chosen yet
  auto left = [&](const auto& gpu) { return gpu.second.size() - next[gpu.first]; };
  while (static_cast<int>(chosen.size()) < size) {
    // One device at a time: the GPU where the container has the fewest devices (none first:
    // one rank per GPU), then the idlest, then the one with the most free devices.
    auto better = [&](const auto& a, const auto& b) {
      const int ma = mine[a.first], mb = mine[b.first];
      if (ma != mb) return ma < mb;
      if (!idle.empty()) {
        const double ia = IdleOf(idle, a.first), ib = IdleOf(idle, b.first);
        if (ia > ib + kIdleTolerance) return true;
        if (ib > ia + kIdleTolerance) return false;
      }
      return left(a) > left(b);
    };
    auto best = free_by_gpu.end();
    for (auto it = free_by_gpu.begin(); it != free_by_gpu.end(); ++it) {
      if (left(*it) == 0) continue;
      if (best == free_by_gpu.end() || better(*it, *best)) best = it;
    }
    if (best == free_by_gpu.end()) break;  // nothing free is left
    chosen.push_back(best->second[next[best->first]++]);
    ++mine[best->first];
  }
  return chosen;
}

}  // namespace orion::agent
