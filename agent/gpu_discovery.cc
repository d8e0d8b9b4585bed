// GPU discovery from /proc/driver/nvidia (see gpu_discovery.h).
#include "agent/gpu_discovery.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

namespace orion::agent {

std::vector<std::string> DiscoverGpus(const std::string& proc_gpus_dir) {
  std::vector<std::pair<int, std::string>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(proc_gpus_dir, ec)) {
    std::ifstream in(e.path() / "information");
    std::string uuid;
    int minor = 1 << 20;
    for (std::string line; std::getline(in, line);) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, colon);
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      value.erase(value.find_last_not_of(" \t\r") + 1);
      if (key == "GPU UUID") uuid = value;
      if (key == "Device Minor") minor = std::atoi(value.c_str());
    }
    if (uuid.rfind("GPU-", 0) == 0) found.emplace_back(minor, uuid);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [minor, uuid] : found) out.push_back(std::move(uuid));
  return out;
}

}  // namespace orion::agent
