// A test registrar standing in for orion-server in the interposer's tests: it creates a board, a
// gate area, and a client area and a quota area per registration (memfds, handed over with the reply as the
// server does), answers the Unix-socket registration protocol of contract/orion_contract.h,
// keeps a heartbeat and counts closed connections. Not a scheduler: it assigns slots in order,
// grants the requested priority if told to, and hands every client the same memory limit. It
// does not seal the board (the server's own tests cover that).
//
// Usage:
//   TestRegistrar registrar(dir, /*memory_limit=*/64 << 20, /*honour_priority=*/true);
//   run a program with ORION_SOCKET=registrar.socket_path() and LD_PRELOAD=liborion_interpose.so
//   auto events = registrar.Drain(0);
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
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
    socket_path_ = dir_ + "/orion.sock";
    board_ = static_cast<c::Board*>(MakeArea(sizeof(c::Board), &board_fd_));
    gate_ = static_cast<c::GateArea*>(MakeArea(sizeof(c::GateArea), &gate_fd_));
    gate_->header.version = c::kBoardVersion;
    gate_->header.bytes = sizeof(c::GateArea);
    gate_->header.gpu = 0;
    gate_->header.server_epoch = 77;
    gate_->header.magic = c::kGateMagic;
    c::BoardHeader& h = board_->header;
    h.version = c::kBoardVersion;
    h.header_bytes = sizeof(c::BoardHeader);
    h.gpu_state_bytes = sizeof(c::GpuState);
    h.slot_bytes = sizeof(c::ClientSlot);
    h.num_gpus = 1;
    h.max_slots = c::kMaxSlots;
    h.ring_capacity = c::kRingCapacity;
    h.gate_area_bytes = sizeof(c::GateArea);
    h.client_area_bytes = sizeof(c::ClientArea);
    h.quota_area_bytes = sizeof(c::QuotaArea);
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
    munmap(gate_, sizeof(c::GateArea));
    for (uint32_t i = 0; i < c::kMaxSlots; ++i) {
      if (areas_[i] == nullptr) continue;
      munmap(areas_[i], sizeof(c::ClientArea));
      close(area_fds_[i]);
      munmap(quotas_[i], sizeof(c::QuotaArea));
      close(quota_fds_[i]);
    }
    close(board_fd_);
    close(gate_fd_);
  }

  bool ok() const { return ok_; }  // board created and socket listening
  const std::string& socket_path() const { return socket_path_; }
  c::Board& board() { return *board_; }
  c::GateArea& gate() { return *gate_; }
  // The client area of a slot handed out (null before).
  c::ClientArea* area(uint32_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    return slot < c::kMaxSlots ? areas_[slot] : nullptr;
  }
  // The quota area of a slot handed out (null before).
  c::QuotaArea* quota(uint32_t slot) {
    std::lock_guard<std::mutex> lock(mu_);
    return slot < c::kMaxSlots ? quotas_[slot] : nullptr;
  }
  std::vector<c::RegisterRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int closed_connections() const { return closed_.load(); }

  // Drains every published event of a slot.
  std::vector<c::Event> Drain(uint32_t slot) {
    std::vector<c::Event> events;
    c::Event e;
    c::ClientArea* a = area(slot);
    while (a != nullptr && a->ring.TryPop(&e)) events.push_back(e);
    return events;
  }

 private:
  // A memfd of `bytes`, mapped read-write; aborts the test run on failure (nothing to test).
  static void* MakeArea(size_t bytes, int* fd_out) {
    const int fd = static_cast<int>(syscall(SYS_memfd_create, "orion-test", 1u /*CLOEXEC*/));
    void* addr = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (addr == MAP_FAILED) {
      perror("test registrar: shared memory");
      abort();
    }
    *fd_out = fd;
    return addr;
  }

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
    int area_fd = -1;
    c::ClientArea* area = static_cast<c::ClientArea*>(MakeArea(sizeof(c::ClientArea), &area_fd));
    int quota_fd = -1;
    c::QuotaArea* quota = static_cast<c::QuotaArea*>(MakeArea(sizeof(c::QuotaArea), &quota_fd));
    quota->header.version = c::kBoardVersion;
    quota->header.bytes = sizeof(c::QuotaArea);
    quota->header.magic = c::kQuotaMagic;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(request);
      slot_index = next_slot_++;
      areas_[slot_index] = area;
      area_fds_[slot_index] = area_fd;
      quotas_[slot_index] = quota;
      quota_fds_[slot_index] = quota_fd;
    }
    c::ClientSlot& slot = board_->slots[slot_index];
    slot.gpu.store(0);
    slot.client_id.store(100 + slot_index);
    const uint32_t priority = honour_priority_ && request.requested_priority != c::kNoValue32
                                  ? request.requested_priority
                                  : static_cast<uint32_t>(c::Priority::kBestEffort);
    slot.priority.store(priority);
    slot.memory_limit_bytes.store(memory_limit_);
    slot.generation.fetch_add(1);
    area->header.version = c::kBoardVersion;
    area->header.bytes = sizeof(c::ClientArea);
    area->header.slot = slot_index;
    area->header.generation = slot.generation.load();
    area->header.magic = c::kAreaMagic;
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
    const int fds[c::kRegisterFds] = {board_fd_, gate_fd_, area_fd, quota_fd};
    c::SendWithFds(fd, &reply, sizeof(reply), fds, c::kRegisterFds);
    // Hold the registration until the client goes away.
    char byte;
    while (recv(fd, &byte, 1, 0) > 0) {
    }
    close(fd);
    closed_.fetch_add(1);
  }

  std::string dir_, socket_path_;
  uint64_t memory_limit_;
  bool honour_priority_;
  bool ok_ = true;
  c::Board* board_ = nullptr;
  c::GateArea* gate_ = nullptr;
  int board_fd_ = -1, gate_fd_ = -1;
  c::ClientArea* areas_[c::kMaxSlots] = {};
  int area_fds_[c::kMaxSlots] = {};
  c::QuotaArea* quotas_[c::kMaxSlots] = {};
  int quota_fds_[c::kMaxSlots] = {};
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
