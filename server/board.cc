// Board file creation, slot assignment and knob publication (see board.h).
#include "server/board.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace orion::server {

using contract::Board;
using contract::ClientSlot;
using contract::GpuState;

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

absl::StatusOr<std::unique_ptr<BoardFile>> BoardFile::Create(const std::string& path) {
  // Unlink first: clients still mapping an old board keep their (now orphaned) copy and will see
  // their socket close, instead of reading a half-initialised new board.
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot create board file: ", std::strerror(errno)));
  }
  ::fchmod(fd, 0666);
  const size_t bytes = sizeof(Board);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": cannot size board to ", bytes, " bytes: ", std::strerror(err)));
  }
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mem == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  }
  auto* board = static_cast<Board*>(mem);  // zero-filled by ftruncate
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const uint64_t epoch = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
  board->header.version = contract::kBoardVersion;
  board->header.header_bytes = sizeof(contract::BoardHeader);
  board->header.gpu_state_bytes = sizeof(GpuState);
  board->header.slot_bytes = sizeof(ClientSlot);
  board->header.num_gpus = 0;
  board->header.max_slots = contract::kMaxSlots;
  board->header.ring_capacity = contract::kRingCapacity;
  board->header.server_epoch.store(epoch, std::memory_order_relaxed);
  // Magic last: a client that sees it sees a complete header.
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint32_t>*>(&board->header.magic)
      ->store(contract::kBoardMagic, std::memory_order_release);
  return std::unique_ptr<BoardFile>(new BoardFile(path, board, bytes, epoch));
}

BoardFile::~BoardFile() {
  if (board_) ::munmap(board_, bytes_);
  ::unlink(path_.c_str());
}

int BoardFile::FindGpu(const std::string& uuid) const {
  for (size_t i = 0; i < gpu_uuids_.size(); ++i) {
    if (uuid == gpu_uuids_[i]) return static_cast<int>(i);
  }
  return -1;
}

uint32_t BoardFile::num_gpus() const { return static_cast<uint32_t>(gpu_uuids_.size()); }

int BoardFile::FindOrAddGpu(const std::string& uuid) {
  if (int i = FindGpu(uuid); i >= 0) return i;
  const uint32_t n = num_gpus();
  if (n >= contract::kMaxGpus || uuid.size() >= contract::kGpuUuidBytes) return -1;
  GpuState& g = board_->gpus[n];
  std::memset(g.uuid, 0, sizeof(g.uuid));
  std::memcpy(g.uuid, uuid.data(), uuid.size());
  PublishKnobs(n, GateKnobs{});
  g.present.store(1, std::memory_order_release);
  gpu_uuids_.push_back(uuid);
  board_->header.num_gpus = n + 1;
  return static_cast<int>(n);
}

std::optional<uint32_t> BoardFile::AssignSlot(uint32_t client_id, uint32_t pid, uint32_t gpu,
                                              contract::Priority priority,
                                              uint64_t memory_limit) {
  for (uint32_t i = 0; i < contract::kMaxSlots; ++i) {
    if (slot_used_[i]) continue;
    slot_used_[i] = true;
    slot_gpu_[i] = gpu;
    slot_priority_[i] = priority;
    ClientSlot& s = board_->slots[i];
    s.state.store(static_cast<uint32_t>(contract::SlotState::kFree), std::memory_order_release);
    s.ring.Reset();
    s.client_id.store(client_id, std::memory_order_relaxed);
    s.host_pid.store(pid, std::memory_order_relaxed);
    s.gpu.store(gpu, std::memory_order_relaxed);
    s.priority.store(static_cast<uint32_t>(priority), std::memory_order_relaxed);
    s.paused.store(0, std::memory_order_relaxed);
    s.profile.store(0, std::memory_order_relaxed);
    s.memory_limit_bytes.store(memory_limit, std::memory_order_relaxed);
    s.memory_used_bytes.store(0, std::memory_order_relaxed);
    s.memory_peak_bytes.store(0, std::memory_order_relaxed);
    s.launches.store(0, std::memory_order_relaxed);
    s.throttled_ns.store(0, std::memory_order_relaxed);
    s.last_progress_ns.store(0, std::memory_order_relaxed);
    s.inflight.store(0, std::memory_order_relaxed);
    const uint32_t generation = s.generation.fetch_add(1, std::memory_order_relaxed) + 1;
    slot_record_[i] = SlotRecord{client_id, pid, generation, 0, 0, memory_limit};
    s.state.store(static_cast<uint32_t>(contract::SlotState::kActive), std::memory_order_release);
    RecomputePriorities(gpu);
    return i;
  }
  return std::nullopt;
}

void BoardFile::FreeSlot(uint32_t slot) {
  if (slot >= contract::kMaxSlots || !slot_used_[slot]) return;
  ClientSlot& s = board_->slots[slot];
  const uint32_t gpu = slot_gpu_[slot];
  s.state.store(static_cast<uint32_t>(contract::SlotState::kFree), std::memory_order_release);
  s.inflight.store(0, std::memory_order_relaxed);
  slot_used_[slot] = false;
  if (gpu < contract::kMaxGpus) {
    RecomputePriorities(gpu);
    WakeGate(gpu);  // a dead high-priority client must not keep anyone waiting
  }
}

BoardFile::PriorityView BoardFile::PrioritiesFromRecords(uint32_t gpu) const {
  PriorityView v;
  for (uint32_t i = 0; i < contract::kMaxSlots; ++i) {
    if (!slot_used_[i] || slot_gpu_[i] != gpu) continue;
    if (slot_priority_[i] == contract::Priority::kHigh) {
      v.hp_mask[i / 64] |= 1ull << (i % 64);
    } else {
      ++v.best_effort;
    }
  }
  return v;
}

void BoardFile::RecomputePriorities(uint32_t gpu) {
  if (gpu >= contract::kMaxGpus) return;
  const PriorityView v = PrioritiesFromRecords(gpu);
  GpuState& g = board_->gpus[gpu];
  for (size_t w = 0; w < contract::kMaxSlots / 64; ++w) {
    g.hp_slot_mask[w].store(v.hp_mask[w], std::memory_order_release);
  }
  g.be_clients.store(v.best_effort, std::memory_order_release);
}

void BoardFile::SetPriority(uint32_t slot, contract::Priority priority) {
  if (slot >= contract::kMaxSlots) return;
  ClientSlot& s = board_->slots[slot];
  s.priority.store(static_cast<uint32_t>(priority), std::memory_order_release);
  slot_priority_[slot] = priority;
  const uint32_t gpu = slot_gpu_[slot];
  RecomputePriorities(gpu);
  if (gpu < contract::kMaxGpus) WakeGate(gpu);
}

void BoardFile::SetPaused(uint32_t slot, bool paused) {
  if (slot >= contract::kMaxSlots) return;
  ClientSlot& s = board_->slots[slot];
  s.paused.store(paused ? 1 : 0, std::memory_order_release);
  slot_record_[slot].paused = paused ? 1 : 0;
  s.wake_seq.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&s.wake_seq);
}

void BoardFile::SetMemoryLimit(uint32_t slot, uint64_t bytes) {
  if (slot < contract::kMaxSlots) {
    board_->slots[slot].memory_limit_bytes.store(bytes, std::memory_order_release);
    slot_record_[slot].memory_limit = bytes;
  }
}

void BoardFile::SetProfile(uint32_t slot, bool on) {
  if (slot < contract::kMaxSlots) {
    board_->slots[slot].profile.store(on ? 1 : 0, std::memory_order_release);
    slot_record_[slot].profile = on ? 1 : 0;
  }
}

void BoardFile::PublishKnobs(uint32_t gpu, const GateKnobs& k) {
  if (gpu >= contract::kMaxGpus) return;
  GpuState& g = board_->gpus[gpu];
  knobs_[gpu] = k;
  g.be_budget_ns.store(k.be_budget_ns, std::memory_order_relaxed);
  g.sm_threshold.store(k.sm_threshold, std::memory_order_relaxed);
  g.spin_ns.store(k.spin_ns, std::memory_order_relaxed);
  g.hp_stale_ns.store(k.hp_stale_ns, std::memory_order_relaxed);
  g.hp_grace_ns.store(k.hp_grace_ns, std::memory_order_relaxed);
  g.mode.store(static_cast<uint32_t>(k.mode), std::memory_order_release);
  WakeGate(gpu);
}

GateKnobs BoardFile::ReadKnobs(uint32_t gpu) const {
  GateKnobs k;
  if (gpu >= contract::kMaxGpus) return k;
  const GpuState& g = board_->gpus[gpu];
  k.mode = static_cast<contract::GateMode>(g.mode.load(std::memory_order_relaxed));
  k.be_budget_ns = g.be_budget_ns.load(std::memory_order_relaxed);
  k.sm_threshold = g.sm_threshold.load(std::memory_order_relaxed);
  k.spin_ns = g.spin_ns.load(std::memory_order_relaxed);
  k.hp_stale_ns = g.hp_stale_ns.load(std::memory_order_relaxed);
  k.hp_grace_ns = g.hp_grace_ns.load(std::memory_order_relaxed);
  return k;
}

void BoardFile::WakeGate(uint32_t gpu) {
  if (gpu >= contract::kMaxGpus) return;
  GpuState& g = board_->gpus[gpu];
  g.gate_seq.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&g.gate_seq);
}

uint32_t BoardFile::Reassert() {
  uint32_t fixed = 0;
  auto put = [&fixed](auto& field, auto want) {
    using T = std::remove_reference_t<decltype(field.load())>;
    if (field.load(std::memory_order_relaxed) != static_cast<T>(want)) {
      field.store(static_cast<T>(want), std::memory_order_release);
      ++fixed;
    }
  };
  auto put_plain = [&fixed](auto& field, auto want) {
    if (field != want) {
      field = want;
      ++fixed;
    }
  };
  contract::BoardHeader& h = board_->header;
  put_plain(h.version, contract::kBoardVersion);
  put_plain(h.header_bytes, static_cast<uint32_t>(sizeof(contract::BoardHeader)));
  put_plain(h.gpu_state_bytes, static_cast<uint32_t>(sizeof(GpuState)));
  put_plain(h.slot_bytes, static_cast<uint32_t>(sizeof(ClientSlot)));
  put_plain(h.num_gpus, num_gpus());
  put_plain(h.max_slots, contract::kMaxSlots);
  put_plain(h.ring_capacity, contract::kRingCapacity);
  put(h.server_epoch, epoch_);
  put(*reinterpret_cast<std::atomic<uint32_t>*>(&h.magic), contract::kBoardMagic);

  for (uint32_t gi = 0; gi < contract::kMaxGpus; ++gi) {
    GpuState& g = board_->gpus[gi];
    const bool present = gi < num_gpus();
    put(g.present, present ? 1u : 0u);
    if (!present) continue;
    const uint32_t before = fixed;
    const GateKnobs& k = knobs_[gi];
    put(g.be_budget_ns, k.be_budget_ns);
    put(g.sm_threshold, k.sm_threshold);
    put(g.spin_ns, k.spin_ns);
    put(g.hp_stale_ns, k.hp_stale_ns);
    put(g.hp_grace_ns, k.hp_grace_ns);
    put(g.mode, static_cast<uint32_t>(k.mode));
    char uuid[contract::kGpuUuidBytes] = {};
    std::memcpy(uuid, gpu_uuids_[gi].data(), gpu_uuids_[gi].size());
    if (std::memcmp(g.uuid, uuid, sizeof(uuid)) != 0) {
      std::memcpy(g.uuid, uuid, sizeof(uuid));
      ++fixed;
    }
    const PriorityView v = PrioritiesFromRecords(gi);
    for (size_t w = 0; w < contract::kMaxSlots / 64; ++w) put(g.hp_slot_mask[w], v.hp_mask[w]);
    put(g.be_clients, v.best_effort);
    if (fixed != before) WakeGate(gi);  // whoever waits re-decides on the true state
  }

  for (uint32_t i = 0; i < contract::kMaxSlots; ++i) {
    ClientSlot& s = board_->slots[i];
    if (!slot_used_[i]) {
      put(s.state, static_cast<uint32_t>(contract::SlotState::kFree));
      continue;
    }
    const SlotRecord& r = slot_record_[i];
    const uint32_t before = fixed;
    put(s.state, static_cast<uint32_t>(contract::SlotState::kActive));
    put(s.client_id, r.client_id);
    put(s.host_pid, r.host_pid);
    put(s.generation, r.generation);
    put(s.gpu, slot_gpu_[i]);
    put(s.priority, static_cast<uint32_t>(slot_priority_[i]));
    put(s.profile, r.profile);
    put(s.memory_limit_bytes, r.memory_limit);
    put(s.paused, r.paused);
    if (fixed != before) {
      s.wake_seq.fetch_add(1, std::memory_order_acq_rel);  // a thread held by a forged pause
      FutexWakeAll(&s.wake_seq);
    }
  }
  return fixed;
}

void BoardFile::Heartbeat(uint64_t now_ns) {
  board_->header.server_heartbeat_ns.store(now_ns, std::memory_order_relaxed);
}

}  // namespace orion::server
