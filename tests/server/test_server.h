// Test support: starts a real OrionServer on loopback port 0 with its sockets in a fresh
// temporary folder; clients register with tests/registered_client.h.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "contract/orion_contract.h"
#include "server/orion_server.h"
#include "tests/registered_client.h"

namespace orion::server::testing {

inline std::string MakeTempDir() {
  char tmpl[] = "/tmp/orion-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d ? d : "/tmp";
}

inline ServerConfig TestConfig(const std::string& dir) {
  auto c = ParseServerConfig("", "<test>");
  ServerConfig cfg = *c;
  cfg.node_name = "test-node";
  cfg.socket_path = dir + "/orion.sock";
  cfg.agent_socket = dir + "/agent/agent.sock";  // out of socket_path's folder
  cfg.admin_address = "127.0.0.1:0";
  cfg.metrics_address = "127.0.0.1:0";
  cfg.gpus = {"GPU-00000000-1111-2222-3333-444444444444",
              "GPU-00000001-1111-2222-3333-444444444444"};
  return cfg;
}

inline std::unique_ptr<OrionServer> StartServer(const ServerConfig& cfg) {
  ServerOptions opts;
  opts.discover_gpus = false;
  auto s = OrionServer::Start(cfg, opts);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

inline contract::RegisterRequest MakeRequest(const char* uuid, contract::Priority priority,
                                             uint64_t memory_limit = 0) {
  contract::RegisterRequest r{};
  r.header = contract::MakeHeader(contract::MessageType::kRegister, sizeof(r));
  r.claimed_pid = static_cast<uint32_t>(getpid());
  std::snprintf(r.gpu_uuid, sizeof(r.gpu_uuid), "%s", uuid);
  r.requested_priority = static_cast<uint32_t>(priority);
  r.requested_memory_limit = memory_limit;
  std::snprintf(r.process_name, sizeof(r.process_name), "test-client");
  return r;
}

using orion::testing::ClientMaps;
using orion::testing::RegisterClient;

// Polls cond every 10 ms for up to timeout_ms.
template <typename F>
bool WaitFor(F cond, int timeout_ms = 5000) {
  for (int i = 0; i < timeout_ms / 10; ++i) {
    if (cond()) return true;
    usleep(10000);
  }
  return cond();
}

}  // namespace orion::server::testing
