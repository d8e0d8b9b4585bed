// Test support for the tests that run orion-server on the CUDA driver test double: the board a
// server made, mapped read-only (as a test looks at it), and the slot of a process on any board.
//
// Usage:
//   BoardView board(dir + "/board");
//   const contract::ClientSlot* s = board.SlotOf(pid);   // null until pid is registered
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

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

// The board a server made, read-only; unmapped on destruction.
class BoardView {
 public:
  explicit BoardView(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void* mem = mmap(nullptr, contract::kBoardBytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (mem != MAP_FAILED) board_ = static_cast<const contract::Board*>(mem);
  }
  ~BoardView() {
    if (board_ != nullptr) munmap(const_cast<contract::Board*>(board_), contract::kBoardBytes);
  }
  BoardView(const BoardView&) = delete;
  BoardView& operator=(const BoardView&) = delete;

  const contract::ClientSlot* SlotOf(pid_t pid) const {
    return board_ != nullptr ? FindSlot(*board_, pid) : nullptr;
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
  uint32_t Waiters(uint32_t gpu) const {
    return board_ && gpu < contract::kMaxGpus ? board_->gpus[gpu].gate_waiters.load() : 0;
  }

 private:
  const contract::Board* board_ = nullptr;
};

}  // namespace orion::testing
