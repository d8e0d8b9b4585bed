// Test support: starts a real OrionServer on loopback port 0 with its socket and board in a fresh
// temporary folder, and a minimal registering client that speaks the contract's socket protocol
// (standing in for the interposer, which has its own tests).
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
  cfg.board_path = dir + "/board";
  cfg.agent_socket = dir + "/agent.sock";
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

// Connects and registers; returns the fd (kept open = registered) and fills *reply.
inline int RegisterClient(const std::string& socket_path, const contract::RegisterRequest& req,
                          contract::RegisterReply* reply) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  if (send(fd, &req, sizeof(req), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(req))) {
    close(fd);
    return -1;
  }
  size_t have = 0;
  while (have < sizeof(*reply)) {
    const ssize_t n = recv(fd, reinterpret_cast<char*>(reply) + have, sizeof(*reply) - have, 0);
    if (n <= 0) {
      close(fd);
      return -1;
    }
    have += static_cast<size_t>(n);
  }
  return fd;
}

inline contract::Board* MapBoard(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* m = mmap(nullptr, sizeof(contract::Board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return m == MAP_FAILED ? nullptr : static_cast<contract::Board*>(m);
}

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
