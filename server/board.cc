// The node's board and its gate and client areas: creation, slot assignment, knob
// publication and checks (see board.h).
#include "server/board.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

// Linux 5.1 (older headers lack it; older kernels refuse it, see NodeBoard::sealed()).
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace orion::server {

using contract::Board;
using contract::ClientSlot;
using contract::GpuState;

namespace {

// Written last, after the rest of a header: a client that sees the magic sees all of it.
void PublishMagic(uint32_t& magic, uint32_t value) {
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint32_t>*>(&magic)->store(value, std::memory_order_release);
}

}  // namespace

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

absl::StatusOr<NodeBoard::Area> NodeBoard::MakeArea(const char* name, size_t bytes,
                                                    bool seal_now) {
  Area a;
  a.fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (a.fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create shared memory '", name, "': ", std::strerror(errno)));
  }
  if (::ftruncate(a.fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(a.fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size '", name, "' to ", bytes, " bytes: ", std::strerror(err)));
  }
  a.mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
  if (a.mem == MAP_FAILED) {
    const int err = errno;
    ::close(a.fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map '", name, "': ", std::strerror(err)));
  }
  a.bytes = bytes;
  // A client must not shrink what the server reads (a read past the end would be SIGBUS), nor
  // add seals of its own (a write seal would keep later clients from mapping a gate area).
  ::fcntl(a.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | (seal_now ? F_SEAL_SEAL : 0));
  return a;
}

void NodeBoard::DropArea(Area& area) {
  if (area.mem != nullptr) ::munmap(area.mem, area.bytes);
  if (area.fd >= 0) ::close(area.fd);
  area = Area{};
}

absl::StatusOr<std::unique_ptr<NodeBoard>> NodeBoard::Create() {
  absl::StatusOr<Area> made = MakeArea("orion-board", sizeof(Board), /*seal_now=*/false);
  if (!made.ok()) return made.status();
  auto* board = static_cast<Board*>(made->mem);  // zero-filled by ftruncate
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
  board->header.gate_area_bytes = sizeof(contract::GateArea);
  board->header.client_area_bytes = sizeof(contract::ClientArea);
  board->header.quota_area_bytes = sizeof(contract::QuotaArea);
  board->header.server_epoch.store(epoch, std::memory_order_relaxed);
  PublishMagic(board->header.magic, contract::kBoardMagic);
  // From here on nobody can make a writable mapping of the board or write(2) to it; the
  // server's own mapping, made before, stays writable.
  const bool sealed = ::fcntl(made->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0;
  ::fcntl(made->fd, F_ADD_SEALS, F_SEAL_SEAL);
  return std::unique_ptr<NodeBoard>(new NodeBoard(board, made->fd, sealed, epoch));
}

NodeBoard::~NodeBoard() {
  for (Area& a : areas_) DropArea(a);
  for (Area& g : gates_) DropArea(g);
  for (auto& [key, q] : quotas_) DropArea(q.area);
  if (board_) ::munmap(board_, sizeof(Board));
  if (board_fd_ >= 0) ::close(board_fd_);
}

contract::GateArea* NodeBoard::gate(uint32_t gpu) {
  return gpu < contract::kMaxGpus ? static_cast<contract::GateArea*>(gates_[gpu].mem) : nullptr;
}

contract::ClientArea* NodeBoard::area(uint32_t slot) {
  return slot < contract::kMaxSlots ? static_cast<contract::ClientArea*>(areas_[slot].mem)
                                    : nullptr;
}

int NodeBoard::FindGpu(const std::string& uuid) const {
  for (size_t i = 0; i < gpu_uuids_.size(); ++i) {
    if (uuid == gpu_uuids_[i]) return static_cast<int>(i);
  }
  return -1;
}

uint32_t NodeBoard::num_gpus() const { return static_cast<uint32_t>(gpu_uuids_.size()); }

int NodeBoard::FindOrAddGpu(const std::string& uuid) {
  if (int i = FindGpu(uuid); i >= 0) return i;
  const uint32_t n = num_gpus();
  if (n >= contract::kMaxGpus || uuid.size() >= contract::kGpuUuidBytes) return -1;
  absl::StatusOr<Area> made = MakeArea("orion-gate", sizeof(contract::GateArea), true);
  if (!made.ok()) {
    std::fprintf(stderr, "orion-server: GPU %s not added: %s\n", uuid.c_str(),
                 std::string(made.status().message()).c_str());
    return -1;
  }
  gates_[n] = *made;
  auto* area = static_cast<contract::GateArea*>(made->mem);
  area->header.version = contract::kBoardVersion;
  area->header.bytes = sizeof(contract::GateArea);
  area->header.gpu = n;
  area->header.server_epoch = epoch_;
  PublishMagic(area->header.magic, contract::kGateMagic);
  GpuState& g = board_->gpus[n];
  std::memset(g.uuid, 0, sizeof(g.uuid));
  std::memcpy(g.uuid, uuid.data(), uuid.size());
  PublishKnobs(n, GateKnobs{});
  g.present.store(1, std::memory_order_release);
  gpu_uuids_.push_back(uuid);
  board_->header.num_gpus = n + 1;
  return static_cast<int>(n);
}

contract::QuotaArea* NodeBoard::quota(uint32_t slot) {
  if (slot >= contract::kMaxSlots || !slot_used_[slot]) return nullptr;
  auto it = quotas_.find(slot_quota_[slot]);
  return it == quotas_.end() ? nullptr : static_cast<contract::QuotaArea*>(it->second.area.mem);
}

int NodeBoard::quota_fd(uint32_t slot) const {
  if (slot >= contract::kMaxSlots || !slot_used_[slot]) return -1;
  auto it = quotas_.find(slot_quota_[slot]);
  return it == quotas_.end() ? -1 : it->second.area.fd;
}

uint32_t NodeBoard::quota_areas() const { return static_cast<uint32_t>(quotas_.size()); }

absl::StatusOr<NodeBoard::QuotaRecord*> NodeBoard::JoinQuota(const std::string& key) {
  auto it = quotas_.find(key);
  if (it == quotas_.end()) {
    absl::StatusOr<Area> made = MakeArea("orion-quota", sizeof(contract::QuotaArea), true);
    if (!made.ok()) return made.status();
    auto* q = static_cast<contract::QuotaArea*>(made->mem);  // zero counters (ftruncate)
    q->header.version = contract::kBoardVersion;
    q->header.bytes = sizeof(contract::QuotaArea);
    q->header.server_epoch = epoch_;
    PublishMagic(q->header.magic, contract::kQuotaMagic);
    it = quotas_.emplace(key, QuotaRecord{*made, 0}).first;
  }
  ++it->second.users;
  return &it->second;
}

void NodeBoard::LeaveQuota(const std::string& key, uint64_t held_bytes) {
  auto it = quotas_.find(key);
  if (it == quotas_.end()) return;
  if (--it->second.users == 0) {
    DropArea(it->second.area);
    quotas_.erase(it);
    return;
  }
  // What the departing client still held goes back to its pod: the driver freed it with the
  // process. The figure is the client's own (its area), so a liar moves only its pod's count,
  // and the count never goes below zero.
  auto* q = static_cast<contract::QuotaArea*>(it->second.area.mem);
  std::atomic<uint64_t>& used = q->counters.used_bytes;
  uint64_t seen = used.load(std::memory_order_relaxed);
  while (!used.compare_exchange_weak(seen, seen > held_bytes ? seen - held_bytes : 0,
                                     std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
}

std::optional<uint32_t> NodeBoard::AssignSlot(uint32_t client_id, uint32_t pid, uint32_t gpu,
                                              contract::Priority priority,
                                              uint64_t memory_limit,
                                              const std::string& quota_key) {
  contract::GateArea* gate_area = gate(gpu);
  if (gate_area == nullptr) return std::nullopt;
  for (uint32_t i = 0; i < contract::kMaxSlots; ++i) {
    if (slot_used_[i]) continue;
    absl::StatusOr<Area> made = MakeArea("orion-client", sizeof(contract::ClientArea), true);
    if (!made.ok()) {
      std::fprintf(stderr, "orion-server: client %u not registered: %s\n", client_id,
                   std::string(made.status().message()).c_str());
      return std::nullopt;
    }
    // The pod's quota area, or one of the registration's own (a key no pod can have).
    const std::string key =
        quota_key.empty() ? absl::StrCat("client ", client_id) : quota_key;
    absl::StatusOr<QuotaRecord*> joined = JoinQuota(key);
    if (!joined.ok()) {
      std::fprintf(stderr, "orion-server: client %u not registered: %s\n", client_id,
                   std::string(joined.status().message()).c_str());
      DropArea(*made);
      return std::nullopt;
    }
    slot_quota_[i] = key;
    slot_used_[i] = true;
    slot_gpu_[i] = gpu;
    slot_priority_[i] = priority;
    ClientSlot& s = board_->slots[i];
    s.state.store(static_cast<uint32_t>(contract::SlotState::kFree), std::memory_order_release);
    contract::SlotGate& entry = gate_area->slots[i];
    entry.inflight.store(0, std::memory_order_relaxed);
    entry.hp_kernel_class.store(0, std::memory_order_relaxed);
    entry.busy_seq.store(0, std::memory_order_relaxed);
    entry.launches_graphs.store(0, std::memory_order_relaxed);
    entry.busy_start_ns.store(0, std::memory_order_relaxed);
    entry.last_progress_ns.store(0, std::memory_order_relaxed);
    s.client_id.store(client_id, std::memory_order_relaxed);
    s.host_pid.store(pid, std::memory_order_relaxed);
    s.gpu.store(gpu, std::memory_order_relaxed);
    s.priority.store(static_cast<uint32_t>(priority), std::memory_order_relaxed);
    s.paused.store(0, std::memory_order_relaxed);
    s.profile.store(0, std::memory_order_relaxed);
    s.memory_limit_bytes.store(memory_limit, std::memory_order_relaxed);
    const uint32_t generation = s.generation.fetch_add(1, std::memory_order_relaxed) + 1;
    slot_record_[i] = SlotRecord{client_id, pid, generation, 0, 0, memory_limit};
    // A fresh area: zero counters, empty ring (ftruncate zero-fills).
    areas_[i] = *made;
    auto* client = static_cast<contract::ClientArea*>(made->mem);
    client->header.version = contract::kBoardVersion;
    client->header.bytes = sizeof(contract::ClientArea);
    client->header.slot = i;
    client->header.generation = generation;
    client->header.client_id = client_id;
    PublishMagic(client->header.magic, contract::kAreaMagic);
    s.state.store(static_cast<uint32_t>(contract::SlotState::kActive), std::memory_order_release);
    RecomputePriorities(gpu);
    return i;
  }
  return std::nullopt;
}

void NodeBoard::FreeSlot(uint32_t slot) {
  if (slot >= contract::kMaxSlots || !slot_used_[slot]) return;
  ClientSlot& s = board_->slots[slot];
  const uint32_t gpu = slot_gpu_[slot];
  s.state.store(static_cast<uint32_t>(contract::SlotState::kFree), std::memory_order_release);
  if (contract::GateArea* g = gate(gpu); g != nullptr) {
    g->slots[slot].inflight.store(0, std::memory_order_relaxed);
  }
  const auto* client = static_cast<const contract::ClientArea*>(areas_[slot].mem);
  LeaveQuota(slot_quota_[slot],
             client != nullptr ? client->counters.memory_used_bytes.load(std::memory_order_relaxed)
                               : 0);
  slot_quota_[slot].clear();
  DropArea(areas_[slot]);
  slot_used_[slot] = false;
  if (gpu < contract::kMaxGpus) {
    RecomputePriorities(gpu);
    WakeGate(gpu);  // a dead high-priority client must not keep anyone waiting
  }
}

NodeBoard::PriorityView NodeBoard::PrioritiesFromRecords(uint32_t gpu) const {
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

void NodeBoard::RecomputePriorities(uint32_t gpu) {
  if (gpu >= contract::kMaxGpus) return;
  const PriorityView v = PrioritiesFromRecords(gpu);
  GpuState& g = board_->gpus[gpu];
  for (size_t w = 0; w < contract::kMaxSlots / 64; ++w) {
    g.hp_slot_mask[w].store(v.hp_mask[w], std::memory_order_release);
  }
  g.be_clients.store(v.best_effort, std::memory_order_release);
}

void NodeBoard::SetPriority(uint32_t slot, contract::Priority priority) {
  if (slot >= contract::kMaxSlots) return;
  ClientSlot& s = board_->slots[slot];
  s.priority.store(static_cast<uint32_t>(priority), std::memory_order_release);
  slot_priority_[slot] = priority;
  const uint32_t gpu = slot_gpu_[slot];
  RecomputePriorities(gpu);
  if (gpu < contract::kMaxGpus) WakeGate(gpu);
}

void NodeBoard::SetPaused(uint32_t slot, bool paused) {
  if (slot >= contract::kMaxSlots) return;
  ClientSlot& s = board_->slots[slot];
  s.paused.store(paused ? 1 : 0, std::memory_order_release);
  slot_record_[slot].paused = paused ? 1 : 0;
  s.wake_seq.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&s.wake_seq);
}

void NodeBoard::SetMemoryLimit(uint32_t slot, uint64_t bytes) {
  if (slot < contract::kMaxSlots) {
    board_->slots[slot].memory_limit_bytes.store(bytes, std::memory_order_release);
    slot_record_[slot].memory_limit = bytes;
  }
}

void NodeBoard::SetProfile(uint32_t slot, bool on) {
  if (slot < contract::kMaxSlots) {
    board_->slots[slot].profile.store(on ? 1 : 0, std::memory_order_release);
    slot_record_[slot].profile = on ? 1 : 0;
  }
}

void NodeBoard::PublishKnobs(uint32_t gpu, const GateKnobs& k) {
  if (gpu >= contract::kMaxGpus) return;
  GpuState& g = board_->gpus[gpu];
  knobs_[gpu] = k;
  g.be_budget_ns.store(k.be_budget_ns, std::memory_order_relaxed);
  g.sm_threshold.store(k.sm_threshold, std::memory_order_relaxed);
  g.spin_ns.store(k.spin_ns, std::memory_order_relaxed);
  g.hp_stale_ns.store(k.hp_stale_ns, std::memory_order_relaxed);
  g.hp_grace_ns.store(k.hp_grace_ns, std::memory_order_relaxed);
  g.gpu_hold.store(k.gpu_hold ? 1 : 0, std::memory_order_relaxed);
  g.gpu_hold_max_ns.store(k.gpu_hold_max_ns, std::memory_order_relaxed);
  g.gpu_hold_release_ns.store(k.gpu_hold_release_ns, std::memory_order_relaxed);
  g.mode.store(static_cast<uint32_t>(k.mode), std::memory_order_release);
  WakeGate(gpu);
}

GateKnobs NodeBoard::ReadKnobs(uint32_t gpu) const {
  GateKnobs k;
  if (gpu >= contract::kMaxGpus) return k;
  const GpuState& g = board_->gpus[gpu];
  k.mode = static_cast<contract::GateMode>(g.mode.load(std::memory_order_relaxed));
  k.be_budget_ns = g.be_budget_ns.load(std::memory_order_relaxed);
  k.sm_threshold = g.sm_threshold.load(std::memory_order_relaxed);
  k.spin_ns = g.spin_ns.load(std::memory_order_relaxed);
  k.hp_stale_ns = g.hp_stale_ns.load(std::memory_order_relaxed);
  k.hp_grace_ns = g.hp_grace_ns.load(std::memory_order_relaxed);
  k.gpu_hold = g.gpu_hold.load(std::memory_order_relaxed) != 0;
  k.gpu_hold_max_ns = g.gpu_hold_max_ns.load(std::memory_order_relaxed);
  k.gpu_hold_release_ns = g.gpu_hold_release_ns.load(std::memory_order_relaxed);
  return k;
}

void NodeBoard::WakeGate(uint32_t gpu) {
  contract::GateArea* g = gate(gpu);
  if (g == nullptr) return;
  g->words.gate_seq.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&g->words.gate_seq);
}

GateRepairs NodeBoard::CheckGates(uint64_t now_ns) {
  GateRepairs r;
  // Anything a real client could have in flight fits in its ring many times over.
  constexpr uint32_t kMaxInflight = contract::kRingCapacity * 16;
  constexpr uint64_t kFutureSlackNs = 1'000'000'000;  // clocks of one host: generous
  for (uint32_t gi = 0; gi < num_gpus(); ++gi) {
    contract::GateArea* g = gate(gi);
    if (g == nullptr) continue;
    const size_t before = r.claimed_by.size() + r.values_reset;
    const uint64_t outstanding = g->words.be_outstanding_ns.load(std::memory_order_relaxed);
    const uint64_t budget = knobs_[gi].be_budget_ns;
    if (budget > 0 && outstanding / 64 > budget) {
      g->words.be_outstanding_ns.store(0, std::memory_order_relaxed);
      ++r.values_reset;
    }
    for (uint32_t i = 0; i < contract::kMaxSlots; ++i) {
      contract::SlotGate& e = g->slots[i];
      const uint32_t inflight = e.inflight.load(std::memory_order_relaxed);
      const bool high = slot_used_[i] && slot_gpu_[i] == gi &&
                        slot_priority_[i] == contract::Priority::kHigh;
      if (!high) {
        // A slot that is not high priority on this GPU: the gates never read its entry. A
        // best-effort client of this GPU that fills it claims work it may not claim. (A client
        // lowered from high priority at run time may still count kernels it launched before;
        // clearing them is harmless, as nobody reads them, but it is reported as a claim too.)
        if (inflight != 0) {
          e.inflight.store(0, std::memory_order_relaxed);
          if (slot_used_[i] && slot_gpu_[i] == gi) r.claimed_by.push_back(i);
        }
        continue;
      }
      const uint64_t progress = e.last_progress_ns.load(std::memory_order_relaxed);
      if (inflight > kMaxInflight || progress > now_ns + kFutureSlackNs) {
        e.inflight.store(0, std::memory_order_relaxed);
        e.last_progress_ns.store(std::min(progress, now_ns), std::memory_order_relaxed);
        ++r.values_reset;
      }
    }
    if (r.claimed_by.size() + r.values_reset != before) WakeGate(gi);
  }
  return r;
}

uint32_t NodeBoard::Reassert() {
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
  put_plain(h.gate_area_bytes, static_cast<uint32_t>(sizeof(contract::GateArea)));
  put_plain(h.client_area_bytes, static_cast<uint32_t>(sizeof(contract::ClientArea)));
  put_plain(h.quota_area_bytes, static_cast<uint32_t>(sizeof(contract::QuotaArea)));
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
    put(g.gpu_hold, k.gpu_hold ? 1u : 0u);
    put(g.gpu_hold_max_ns, k.gpu_hold_max_ns);
    put(g.gpu_hold_release_ns, k.gpu_hold_release_ns);
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

void NodeBoard::Heartbeat(uint64_t now_ns) {
  board_->header.server_heartbeat_ns.store(now_ns, std::memory_order_relaxed);
}

}  // namespace orion::server
