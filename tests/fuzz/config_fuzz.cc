// Fuzz target: orion-server's YAML config (orion::server::ParseServerConfig). Any text must give a
// config or an error naming the file, never a crash, an uncaught exception or undefined behaviour;
// a config that parses must hold what the validation promises.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/config.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<orion::server::ServerConfig> cfg =
      orion::server::ParseServerConfig(text, "fuzz.yaml");
  if (!cfg.ok()) {
    // Every error names the file it is about.
    Check(cfg.status().message().rfind("fuzz.yaml", 0) == 0);
    return 0;
  }
  const orion::server::ServerConfig& c = *cfg;
  for (const std::string* path : {&c.socket_path, &c.agent_socket}) {
    Check(!path->empty() && (*path)[0] == '/' && path->size() < 108);
  }
  Check(c.admin_address.find(':') != std::string::npos);
  Check(c.metrics_address.find(':') != std::string::npos);
  Check(c.gpus.size() <= orion::contract::kMaxGpus);
  for (const std::string& g : c.gpus) {
    Check(g.rfind("GPU-", 0) == 0 && g.size() < orion::contract::kGpuUuidBytes);
  }
  Check(c.policy.be_budget_us <= 1000000);
  Check(c.policy.spin_us <= 10000);
  Check(c.policy.hp_stale_ms >= 10 && c.policy.hp_stale_ms <= 600000);
  Check(c.policy.hp_grace_us <= 100000);
  Check(c.policy.gpu_hold_max_ms <= 60000);
  Check(c.policy.gpu_hold_release_ms <= 600000);
  Check(c.timeline_spans_per_gpu >= 1000);
  Check(c.hp_latency_window >= 100);
  return 0;
}
