// Finds the node's NVIDIA GPUs without the driver library: the kernel module lists each GPU in
// /proc/driver/nvidia/gpus/<pci>/information ("GPU UUID:", "Device Minor:"), which is visible
// in containers too.
//
// Usage:
//   std::vector<std::string> uuids = DiscoverGpus("/proc/driver/nvidia/gpus");
#pragma once

#include <string>
#include <vector>

namespace orion::agent {

// GPU UUIDs ordered by device minor number; empty when there is no NVIDIA driver.
std::vector<std::string> DiscoverGpus(const std::string& proc_gpus_dir);

}  // namespace orion::agent
