// A test registrar standing in for orion-server in the interposer's tests: it creates a board
// file, answers the Unix-socket registration protocol of contract/orion_contract.h, keeps a
// heartbeat and counts closed connections. Not a scheduler: it assigns slots in order,
// grants the requested priority if told to, and hands every client the same memory limit.
//
// Usage:
//   TestRegistrar registrar(dir, /*memory_limit=*/64 << 20, /*honour_priority=*/true);
//   run a program with ORION_SOCKET=registrar.socket_path() and LD_PRELOAD=liborion_interpose.so
//   auto events = registrar.Drain(0);
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "contract/orion_contract.h"

namespace orion::interpose::testing {

namespace c = ::orion::contract;

inline uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + ts.tv_nsec;
}

// Stands in for orion-server: creates the board, answers registrations, keeps a heartbeat, and
// counts connections that closed (the real server frees the slot then).
class TestRegistrar {
 public:
  TestRegistrar(const std::string& dir, uint64_t memory_limit, bool honour_priority)
      : dir_(dir), memory_limit_(memory_limit), honour_priority_(honour_priority) {
    board_path_ = dir_ + "/board";
    socket_path_ = dir_ + "/orion.sock";
    const int fd = open(board_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    void* addr = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, c::kBoardBytes) == 0) {
      addr = mmap(nullptr, c::kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (fd >= 0) close(fd);
    if (addr == MAP_FAILED) {
      // Keep going on a private scratch board so callers can report ok() == false cleanly.
      ok_ = false;
      addr =
          mmap(nullptr, c::kBoardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    board_ = static_cast<c::Board*>(addr);
    c::BoardHeader& h = board_->header;
    h.version = c::kBoardVersion;
    h.header_bytes = sizeof(c::BoardHeader);
    h.gpu_state_bytes = sizeof(c::GpuState);
    h.slot_bytes = sizeof(c::ClientSlot);
    h.num_gpus = 1;
    h.max_slots = c::kMaxSlots;
    h.ring_capacity = c::kRingCapacity;
    h.server_epoch.store(77);
    h.server_heartbeat_ns.store(NowNs());
    board_->gpus[0].present.store(1);
    board_->gpus[0].mode.store(static_cast<uint32_t>(c::GateMode::kPassThrough));
    reinterpret_cast<std::atomic<uint32_t>*>(&h.magic)->store(c::kBoardMagic);

    listen_fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr_un{};
    addr_un.sun_family = AF_UNIX;
    snprintf(addr_un.sun_path, sizeof(addr_un.sun_path), "%s", socket_path_.c_str());
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr_un), sizeof(addr_un)) != 0 ||
        listen(listen_fd_, 8) != 0) {
      ok_ = false;
    }
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    heartbeat_thread_ = std::thread([this] {
      while (!stop_) {
        board_->header.server_heartbeat_ns.store(NowNs());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }

  ~TestRegistrar() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    accept_thread_.join();
    heartbeat_thread_.join();
    for (auto& t : connection_threads_) t.join();
    munmap(board_, c::kBoardBytes);
  }

  bool ok() const { return ok_; }  // board created and socket listening
  const std::string& socket_path() const { return socket_path_; }
  c::Board& board() { return *board_; }
  std::vector<c::RegisterRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int closed_connections() const { return closed_.load(); }

  // Drains every published event of a slot.
  std::vector<c::Event> Drain(uint32_t slot) {
    std::vector<c::Event> events;
    c::Event e;
    while (board_->slots[slot].ring.TryPop(&e)) events.push_back(e);
    return events;
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      connection_threads_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  void Serve(int fd) {
    c::RegisterRequest request{};
    if (recv(fd, &request, sizeof(request), MSG_WAITALL) != sizeof(request)) {
      close(fd);
      return;
    }
    uint32_t slot_index;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(request);
      slot_index = next_slot_++;
    }
    c::ClientSlot& slot = board_->slots[slot_index];
    slot.ring.Reset();
    slot.gpu.store(0);
    slot.client_id.store(100 + slot_index);
    const uint32_t priority = honour_priority_ && request.requested_priority != c::kNoValue32
                                  ? request.requested_priority
                                  : static_cast<uint32_t>(c::Priority::kBestEffort);
    slot.priority.store(priority);
    slot.memory_limit_bytes.store(memory_limit_);
    slot.generation.fetch_add(1);
    slot.state.store(static_cast<uint32_t>(c::SlotState::kActive));
    if (priority == static_cast<uint32_t>(c::Priority::kHigh)) {
      board_->gpus[0].hp_slot_mask[slot_index / 64].fetch_or(1ull << (slot_index % 64));
    }

    c::RegisterReply reply{};
    reply.header = c::MakeHeader(c::MessageType::kRegisterReply, sizeof(reply));
    reply.status = static_cast<uint32_t>(c::RegisterStatus::kOk);
    reply.client_id = 100 + slot_index;
    reply.slot = slot_index;
    reply.generation = slot.generation.load();
    reply.gpu = 0;
    reply.priority = priority;
    reply.memory_limit_bytes = memory_limit_;
    reply.server_epoch = 77;
    snprintf(reply.board_path, sizeof(reply.board_path), "%s", board_path_.c_str());
    send(fd, &reply, sizeof(reply), MSG_NOSIGNAL);
    // Hold the registration until the client goes away.
    char byte;
    while (recv(fd, &byte, 1, 0) > 0) {
    }
    close(fd);
    closed_.fetch_add(1);
  }

  std::string dir_, board_path_, socket_path_;
  uint64_t memory_limit_;
  bool honour_priority_;
  bool ok_ = true;
  c::Board* board_ = nullptr;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_{0};
  std::thread accept_thread_, heartbeat_thread_;
  std::vector<std::thread> connection_threads_;
  std::mutex mu_;
  std::vector<c::RegisterRequest> requests_;
  uint32_t next_slot_ = 0;
};

}  // namespace orion::interpose::testing
