// Finds the node's NVIDIA GPUs without the driver library: the kernel module lists each GPU in
// /proc/driver/nvidia/gpus/<pci>/information ("GPU UUID:", "Device Minor:"), which is visible
// in containers too. It also tells which GPUs are in MIG mode, which orion does not share (it
// schedules whole GPUs; a MIG GPU runs CUDA only inside its instances):
//   - NVML (libnvidia-ml.so.1, loaded at run time when present): nvmlDeviceGetMigMode;
//   - otherwise the kernel module's MIG capabilities: /proc/driver/nvidia/capabilities/
//     gpu<minor>/mig/gi<N> exists for each GPU instance created on a MIG GPU.
//
// Usage:
//   std::vector<Gpu> gpus = DiscoverGpus("/proc/driver/nvidia/gpus");
//   for (const Gpu& g : gpus) if (!g.Shareable()) LOG(g.uuid, g.refusal);
//   std::vector<std::string> uuids = ShareableGpus(gpus);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace orion::agent {

struct Gpu {
  std::string uuid;
  int minor = -1;
  std::string bus_location;  // PCI address, e.g. 0000:3b:00.0
  std::string model;         // "NVIDIA H100 80GB HBM3" (the information file's Model)
  uint64_t memory_bytes = 0; // total memory by NVML; 0: unknown
  bool mig_enabled = false;
  std::string refusal;  // why the GPU is not shared; empty: shared
  bool Shareable() const { return refusal.empty(); }
};

// Answers "is this GPU in MIG mode?" for the discovery; nullopt-like -1: cannot tell.
class MigProbe {
 public:
  virtual ~MigProbe() = default;
  // 1: MIG enabled, 0: disabled or not MIG-capable, -1: unknown.
  virtual int MigMode(const std::string& uuid) = 0;
  // The GPU's total memory in bytes (the DRA plugin publishes it); 0: unknown.
  virtual uint64_t MemoryBytes(const std::string& /*uuid*/) { return 0; }
};

// NVML through dlopen; -1 for every GPU when the library or the call is unavailable.
class NvmlMigProbe : public MigProbe {
 public:
  NvmlMigProbe();
  ~NvmlMigProbe() override;
  int MigMode(const std::string& uuid) override;
  uint64_t MemoryBytes(const std::string& uuid) override;
  bool Loaded() const { return lib_ != nullptr; }

 private:
  void* lib_ = nullptr;
  bool initialised_ = false;
};

// GPUs ordered by device minor number; empty when there is no NVIDIA driver. `nvml` may be
// null (then only the /proc capabilities tell MIG mode).
std::vector<Gpu> DiscoverGpus(const std::string& proc_gpus_dir, MigProbe* nvml = nullptr);

std::vector<std::string> ShareableGpus(const std::vector<Gpu>& gpus);

// One line per GPU: "GPU-... minor 0 0000:3b:00.0 shared" or "... refused: <why>".
std::string DescribeGpus(const std::vector<Gpu>& gpus);

}  // namespace orion::agent
