// Test support: a minimal client of orion-server's registration socket that speaks the
// contract's protocol (standing in for the interposer, which has its own tests), and maps what
// the server hands over as the interposer does: the board read-only, the GPU's gate area, the
// client's own area and its pod's quota area read-write.
//
// Usage:
//   ClientMaps maps;
//   const int sock = RegisterClient(socket_path, request, &reply, &maps);  // -1 on failure
//   maps.area->ring.TryPush(event);  maps.board->slots[reply.slot].priority.load();
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "contract/orion_contract.h"

namespace orion::testing {

// What a registered client maps; the descriptors stay open (a test may try more with them).
struct ClientMaps {
  int fds[contract::kRegisterFds] = {-1, -1, -1, -1};
  const contract::Board* board = nullptr;
  contract::GateArea* gate = nullptr;
  contract::ClientArea* area = nullptr;
  contract::QuotaArea* quota = nullptr;
};

// Maps sizeof(T) of a descriptor the server handed over (or a test took from the board); null
// on failure.
template <typename T>
T* MapAs(int fd, int prot) {
  if (fd < 0) return nullptr;
  void* m = mmap(nullptr, sizeof(T), prot, MAP_SHARED, fd, 0);
  return m == MAP_FAILED ? nullptr : static_cast<T*>(m);
}

// Connects and registers; returns the socket (kept open = registered) and fills *reply. With
// `maps`, a kOk reply's descriptors are kept and mapped there.
inline int RegisterClient(const std::string& socket_path, const contract::RegisterRequest& req,
                          contract::RegisterReply* reply, ClientMaps* maps = nullptr) {
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
  int fds[contract::kRegisterFds];
  int nfds = 0;
  if (!contract::ReceiveWithFds(fd, reply, sizeof(*reply), fds, &nfds)) {
    close(fd);
    return -1;
  }
  if (maps == nullptr) {
    for (int f : fds) {
      if (f >= 0) close(f);
    }
    return fd;
  }
  for (int i = 0; i < contract::kRegisterFds; ++i) maps->fds[i] = fds[i];
  maps->board = MapAs<const contract::Board>(fds[contract::kBoardFd], PROT_READ);
  maps->gate = MapAs<contract::GateArea>(fds[contract::kGateFd], PROT_READ | PROT_WRITE);
  maps->area = MapAs<contract::ClientArea>(fds[contract::kAreaFd], PROT_READ | PROT_WRITE);
  maps->quota = MapAs<contract::QuotaArea>(fds[contract::kQuotaFd], PROT_READ | PROT_WRITE);
  return fd;
}

}  // namespace orion::testing
