// GPU discovery from /proc/driver/nvidia, MIG mode from NVML or the MIG capabilities
// (see gpu_discovery.h).
#include "agent/gpu_discovery.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace orion::agent {
namespace fs = std::filesystem;

namespace {

// The few NVML entry points used, with NVML's C types spelled as plain ones (nvml.h is not a
// build dependency): nvmlReturn_t is int, nvmlDevice_t a pointer, MIG modes unsigned ints.
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlHandleByUuid = int (*)(const char*, void**);
using NvmlGetMigMode = int (*)(void*, unsigned int*, unsigned int*);
struct NvmlMemory {  // nvmlMemory_t: total, free, used
  unsigned long long total, free, used;
};
using NvmlGetMemoryInfo = int (*)(void*, NvmlMemory*);
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlErrorNotSupported = 3;

// Number of GPU instances the kernel module lists for a GPU (-1: no MIG capabilities at all).
int MigInstancesInProc(const fs::path& capabilities_dir, int minor) {
  const fs::path mig = capabilities_dir / absl::StrCat("gpu", minor) / "mig";
  std::error_code ec;
  if (!fs::is_directory(mig, ec)) return -1;
  int instances = 0;
  for (const auto& e : fs::directory_iterator(mig, ec)) {
    if (e.path().filename().string().rfind("gi", 0) == 0) ++instances;
  }
  return instances;
}

}  // namespace

NvmlMigProbe::NvmlMigProbe() {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) return;
  auto init = reinterpret_cast<NvmlInit>(dlsym(lib_, "nvmlInit_v2"));
  initialised_ = init != nullptr && init() == kNvmlSuccess;
  if (!initialised_) {
    dlclose(lib_);
    lib_ = nullptr;
  }
}

NvmlMigProbe::~NvmlMigProbe() {
  if (lib_ == nullptr) return;
  if (auto shutdown = reinterpret_cast<NvmlShutdown>(dlsym(lib_, "nvmlShutdown"))) shutdown();
  dlclose(lib_);
}

int NvmlMigProbe::MigMode(const std::string& uuid) {
  if (lib_ == nullptr) return -1;
  auto by_uuid = reinterpret_cast<NvmlHandleByUuid>(dlsym(lib_, "nvmlDeviceGetHandleByUUID"));
  auto get_mode = reinterpret_cast<NvmlGetMigMode>(dlsym(lib_, "nvmlDeviceGetMigMode"));
  if (by_uuid == nullptr || get_mode == nullptr) return -1;
  void* device = nullptr;
  if (by_uuid(uuid.c_str(), &device) != kNvmlSuccess) return -1;
  unsigned int current = 0, pending = 0;
  const int rc = get_mode(device, &current, &pending);
  if (rc == kNvmlErrorNotSupported) return 0;  // not MIG-capable
  if (rc != kNvmlSuccess) return -1;
  return current != 0 ? 1 : 0;
}

uint64_t NvmlMigProbe::MemoryBytes(const std::string& uuid) {
  if (lib_ == nullptr) return 0;
  auto by_uuid = reinterpret_cast<NvmlHandleByUuid>(dlsym(lib_, "nvmlDeviceGetHandleByUUID"));
  auto get_memory = reinterpret_cast<NvmlGetMemoryInfo>(dlsym(lib_, "nvmlDeviceGetMemoryInfo"));
  if (by_uuid == nullptr || get_memory == nullptr) return 0;
  void* device = nullptr;
  if (by_uuid(uuid.c_str(), &device) != kNvmlSuccess) return 0;
  NvmlMemory memory{};
  return get_memory(device, &memory) == kNvmlSuccess ? memory.total : 0;
}

std::vector<Gpu> DiscoverGpus(const std::string& proc_gpus_dir, MigProbe* nvml) {
  std::vector<Gpu> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(proc_gpus_dir, ec)) {
    std::ifstream in(e.path() / "information");
    Gpu gpu;
    for (std::string line; std::getline(in, line);) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, colon);
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      value.erase(value.find_last_not_of(" \t\r") + 1);
      if (key == "GPU UUID") gpu.uuid = value;
      if (key == "Device Minor") gpu.minor = std::atoi(value.c_str());
      if (key == "Bus Location") gpu.bus_location = value;
      if (key == "Model") gpu.model = value;
    }
    if (gpu.uuid.rfind("GPU-", 0) == 0) found.push_back(std::move(gpu));
  }
  std::sort(found.begin(), found.end(), [](const Gpu& a, const Gpu& b) {
    return a.minor != b.minor ? a.minor < b.minor : a.uuid < b.uuid;
  });
  const fs::path capabilities = fs::path(proc_gpus_dir).parent_path() / "capabilities";
  for (Gpu& gpu : found) {
    const int from_nvml = nvml != nullptr ? nvml->MigMode(gpu.uuid) : -1;
    if (nvml != nullptr) gpu.memory_bytes = nvml->MemoryBytes(gpu.uuid);
    const int instances = gpu.minor >= 0 ? MigInstancesInProc(capabilities, gpu.minor) : -1;
    if (from_nvml == 1) {
      gpu.mig_enabled = true;
      gpu.refusal = "MIG mode is enabled (NVML); orion shares whole GPUs only";
    } else if (from_nvml == -1 && instances > 0) {
      gpu.mig_enabled = true;
      gpu.refusal = absl::StrCat("MIG mode is enabled (", instances,
                                 " GPU instances in /proc/driver/nvidia/capabilities); orion "
                                 "shares whole GPUs only");
    }
  }
  return found;
}

std::vector<std::string> ShareableGpus(const std::vector<Gpu>& gpus) {
  std::vector<std::string> out;
  for (const Gpu& g : gpus) {
    if (g.Shareable()) out.push_back(g.uuid);
  }
  return out;
}

std::string DescribeGpus(const std::vector<Gpu>& gpus) {
  std::string out;
  for (const Gpu& g : gpus) {
    absl::StrAppend(&out, g.uuid, " minor ", g.minor, " ",
                    g.bus_location.empty() ? "-" : g.bus_location, " ",
                    g.Shareable() ? "shared" : absl::StrCat("refused: ", g.refusal), "\n");
  }
  return out;
}

}  // namespace orion::agent
