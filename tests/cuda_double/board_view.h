// Test support for the tests that run orion-server on the CUDA driver test double: what a running
// server shares with its clients, mapped read-only as a test looks at it. The server makes no
// files for it (memfds handed over the registration socket), so the view opens them through
// /proc/<server pid>/fd, which a test may do for its own child processes.
//
// Usage:
//   BoardView board(server_pid);
//   const contract::ClientSlot* s = board.SlotOf(pid);                 // null until registered
//   const contract::ClientArea::Counters* n = board.CountersOf(pid);   // the client's own area
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "contract/orion_contract.h"

namespace orion::testing {

// The active slot of `pid` on `board`, or null.
inline const contract::ClientSlot* FindSlot(const contract::Board& board, pid_t pid) {
  for (const contract::ClientSlot& s : board.slots) {
    if (s.state.load() == static_cast<uint32_t>(contract::SlotState::kActive) &&
        s.host_pid.load() == static_cast<uint32_t>(pid)) {
      return &s;
    }
  }
  return nullptr;
}

// Maps every memfd the server `pid` holds whose name starts with `prefix` (read-only).
inline std::vector<std::pair<void*, size_t>> MapServerMemfds(pid_t pid, const char* prefix) {
  std::vector<std::pair<void*, size_t>> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  const std::string want = std::string("/memfd:") + prefix;
  while (dirent* e = readdir(d)) {
    const std::string path = dir + "/" + e->d_name;
    char target[256] = {};
    const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
    if (n <= 0 || std::strncmp(target, want.c_str(), want.size()) != 0) continue;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const off_t size = lseek(fd, 0, SEEK_END);
    void* mem = size > 0 ? mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (mem != MAP_FAILED) out.emplace_back(mem, static_cast<size_t>(size));
  }
  closedir(d);
  return out;
}

// The board, gate areas and client areas of a running server, read-only; unmapped on
// destruction.
class BoardView {
 public:
  explicit BoardView(pid_t server) {
    for (auto& m : MapServerMemfds(server, "orion-board")) {
      if (board_ == nullptr && m.second >= sizeof(contract::Board)) {
        board_ = static_cast<const contract::Board*>(m.first);
      }
      maps_.push_back(m);
    }
    for (auto& m : MapServerMemfds(server, "orion-gate")) {
      const auto* g = static_cast<const contract::GateArea*>(m.first);
      if (m.second >= sizeof(contract::GateArea) && g->header.gpu < contract::kMaxGpus) {
        gates_[g->header.gpu] = g;
      }
      maps_.push_back(m);
    }
    for (auto& m : MapServerMemfds(server, "orion-client")) {
      if (m.second >= sizeof(contract::ClientArea)) {
        areas_.push_back(static_cast<const contract::ClientArea*>(m.first));
      }
      maps_.push_back(m);
    }
  }
  ~BoardView() {
    for (auto& m : maps_) munmap(m.first, m.second);
  }
  BoardView(const BoardView&) = delete;
  BoardView& operator=(const BoardView&) = delete;

  bool ok() const { return board_ != nullptr; }
  const contract::Board* board() const { return board_; }
  const contract::ClientSlot* SlotOf(pid_t pid) const {
    return board_ != nullptr ? FindSlot(*board_, pid) : nullptr;
  }
  // The counters `pid` writes into its own client area, or null.
  const contract::ClientArea::Counters* CountersOf(pid_t pid) const {
    const contract::ClientSlot* s = SlotOf(pid);
    if (s == nullptr) return nullptr;
    const uint32_t index = static_cast<uint32_t>(s - board_->slots);
    for (const contract::ClientArea* a : areas_) {
      if (a->header.slot == index && a->header.generation == s->generation.load()) {
        return &a->counters;
      }
    }
    return nullptr;
  }
  // Slots not free (-1 if the board could not be mapped).
  int SlotsInUse() const {
    if (board_ == nullptr) return -1;
    int n = 0;
    for (const contract::ClientSlot& s : board_->slots) {
      n += s.state.load() != static_cast<uint32_t>(contract::SlotState::kFree);
    }
    return n;
  }
  uint64_t Epoch() const { return board_ ? board_->header.server_epoch.load() : 0; }
  // The GPU's hold word (0: open; interpose/gpu_hold.h).
  uint32_t Hold(uint32_t gpu) const {
    return gpu < contract::kMaxGpus && gates_[gpu] != nullptr
               ? gates_[gpu]->words.gpu_hold.load()
               : 0;
  }
  uint32_t Waiters(uint32_t gpu) const {
    return gpu < contract::kMaxGpus && gates_[gpu] != nullptr
               ? gates_[gpu]->words.gate_waiters.load()
               : 0;
  }

 private:
  const contract::Board* board_ = nullptr;
  const contract::GateArea* gates_[contract::kMaxGpus] = {};
  std::vector<const contract::ClientArea*> areas_;
  std::vector<std::pair<void*, size_t>> maps_;
};

}  // namespace orion::testing
