// Server side of the shared memory (contract/orion_contract.h): creates the node's board (a
// sealed memfd that clients can only map read-only), one gate area per GPU and one client area
// per registration, lays out GPUs and slots, assigns and frees slots, publishes policy knobs and
// checks what clients wrote into the gate areas. The server never trusts what clients wrote:
// values read back are clamped by the caller.
//
// Usage:
//   absl::StatusOr<std::unique_ptr<NodeBoard>> board = NodeBoard::Create();
//   int gpu = (*board)->FindOrAddGpu("GPU-...");
//   auto slot = (*board)->AssignSlot(client_id, pid, gpu, Priority::kHigh, limit);
//   hand (*board)->board_fd(), gate_fd(gpu), area_fd(*slot), quota_fd(*slot) to the client
//   (SCM_RIGHTS)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "contract/gate_rules.h"
#include "contract/orion_contract.h"

namespace orion::server {

// The best-effort budget a GPU starts with in each gate mode: policy.be_budget_us when the
// config leaves it out, and what a mode change through the admin API moves a budget to when it
// was never set nor adapted.
//  - priority (time-sliced GPU): the work a high-priority request may wait behind, 500 us.
//  - mps: best-effort work in flight beside high-priority work on SMs that MPS caps, 5 ms (on
//    an H100, ResNet50 training beside ResNet50 inference kept 0.56x of its speed at 500 us and
//    0.70x at 5 ms, the same as with no budget at all).
constexpr uint64_t DefaultBeBudgetUs(contract::GateMode mode) {
  return contract::DefaultBeBudgetNs(mode) / 1000;
}

// A GPU's gate knobs as published on the board; these defaults are the config's (server/config.h).
struct GateKnobs {  // defaults: contract/gate_rules.h
  contract::GateMode mode = contract::kDefaultGateMode;
  uint64_t be_budget_ns = contract::DefaultBeBudgetNs(contract::kDefaultGateMode);
  uint32_t sm_threshold = contract::kDefaultSmThreshold;  // 0: no limit (MPS caps BE SMs)
  uint32_t spin_ns = contract::kDefaultSpinNs;
  uint64_t hp_stale_ns = contract::kDefaultHpStaleNs;
  uint64_t hp_grace_ns = contract::kDefaultHpGraceNs;
  bool gpu_hold = contract::kDefaultGpuHold;  // priority mode: hold best-effort work on the GPU
  uint64_t gpu_hold_max_ns = contract::kDefaultGpuHoldMaxNs;  // its bound per busy period; 0: none
  uint64_t gpu_hold_release_ns = contract::kDefaultGpuHoldReleaseNs;  // a release's least time
};

// What the server found in the gate areas that no honest client writes, and put right.
struct GateRepairs {
  std::vector<uint32_t> claimed_by;  // slots not high priority whose entry claimed work
  uint32_t values_reset = 0;  // impossible values (time in the future, counts out of range)
};

class NodeBoard {
 public:
  // Creates the board (a memfd, sealed against writable mappings where the kernel can seal:
  // F_SEAL_FUTURE_WRITE, Linux 5.1) and maps it.
  static absl::StatusOr<std::unique_ptr<NodeBoard>> Create();
  ~NodeBoard();
  NodeBoard(const NodeBoard&) = delete;
  NodeBoard& operator=(const NodeBoard&) = delete;

  contract::Board& board() { return *board_; }
  uint64_t epoch() const { return epoch_; }
  // False where the kernel could not seal the board: clients could then map it writable, and
  // only Reassert() puts back what they wrote.
  bool sealed() const { return sealed_; }
  // Descriptors to hand to a client (the caller never closes them). -1 when there is none.
  int board_fd() const { return board_fd_; }
  int gate_fd(uint32_t gpu) const { return gpu < contract::kMaxGpus ? gates_[gpu].fd : -1; }
  int area_fd(uint32_t slot) const { return slot < contract::kMaxSlots ? areas_[slot].fd : -1; }
  // The quota area of a slot in use (its pod's, shared by the pod's slots), -1 / null otherwise.
  int quota_fd(uint32_t slot) const;
  contract::QuotaArea* quota(uint32_t slot);
  uint32_t quota_areas() const;  // quota areas alive (one per pod with clients, one per other)
  // The gate area of a GPU of the board, and the client area of a slot in use (null otherwise).
  contract::GateArea* gate(uint32_t gpu);
  contract::ClientArea* area(uint32_t slot);

  // Returns the GPU index of uuid, adding it (and its gate area) if there is room. -1 if the
  // board is full or the area cannot be made. GPUs are looked up in the server's own record.
  int FindOrAddGpu(const std::string& uuid);
  int FindGpu(const std::string& uuid) const;
  uint32_t num_gpus() const;
  const std::string& gpu_uuid(uint32_t gpu) const { return gpu_uuids_.at(gpu); }

  // Slot life cycle. AssignSlot makes the slot's client area (empty ring, zero counters) and
  // clears its gate entry before publishing kActive; nullopt if no slot is free or the area
  // cannot be made. FreeSlot releases the area. Slots of one `quota_key` (a pod) share one quota
  // area; an empty key gives the slot a quota area of its own. FreeSlot gives back to the quota
  // area what the client's area says it still held, and drops the quota area with its last slot.
  std::optional<uint32_t> AssignSlot(uint32_t client_id, uint32_t pid, uint32_t gpu,
                                     contract::Priority priority, uint64_t memory_limit,
                                     const std::string& quota_key = "");
  void FreeSlot(uint32_t slot);
  void SetPriority(uint32_t slot, contract::Priority priority);
  void SetPaused(uint32_t slot, bool paused);
  void SetMemoryLimit(uint32_t slot, uint64_t bytes);
  void SetProfile(uint32_t slot, bool on);

  void PublishKnobs(uint32_t gpu, const GateKnobs& knobs);
  GateKnobs ReadKnobs(uint32_t gpu) const;
  // Wakes every thread blocked on the GPU's gate word (knobs or priorities changed).
  void WakeGate(uint32_t gpu);
  void Heartbeat(uint64_t now_ns);
  // Writes back every server-owned field of the board (header, GPU knobs and priority masks,
  // slot identity, priority, pause, profile, memory limit) that differs from the server's own
  // record. Returns how many fields were put back: 0 unless the board could not be sealed and
  // a tenant wrote into it (or the server has a bug). A few microseconds for 256 slots.
  uint32_t Reassert();
  // Checks each GPU's gate area against the server's records at `now_ns` (CLOCK_MONOTONIC):
  // an entry of a slot that is not high priority claiming work in flight is cleared (the gates
  // never read it: claims ignored); progress stamps in the future, in-flight counts above the
  // ring's capacity and best-effort time in flight above 64 budgets are reset. Wakes the GPU's
  // waiters when it changed anything.
  GateRepairs CheckGates(uint64_t now_ns);

 private:
  NodeBoard(contract::Board* board, int fd, bool sealed, uint64_t epoch)
      : board_(board), board_fd_(fd), sealed_(sealed), epoch_(epoch) {}
  // hp_slot_mask and be_clients of a GPU as the server's records say (never the board's copies).
  struct PriorityView {
    uint64_t hp_mask[contract::kMaxSlots / 64] = {};
    uint32_t best_effort = 0;
  };
  PriorityView PrioritiesFromRecords(uint32_t gpu) const;
  // Publishes them to the board.
  void RecomputePriorities(uint32_t gpu);

  // One memfd and its mapping.
  struct Area {
    int fd = -1;
    void* mem = nullptr;
    size_t bytes = 0;
  };
  // Seals size changes, and with `seal_now` further seals too.
  static absl::StatusOr<Area> MakeArea(const char* name, size_t bytes, bool seal_now);
  static void DropArea(Area& area);
  // A pod's memory quota area and how many slots use it.
  struct QuotaRecord {
    Area area;
    uint32_t users = 0;
  };
  absl::StatusOr<QuotaRecord*> JoinQuota(const std::string& key);
  void LeaveQuota(const std::string& key, uint64_t held_bytes);

  contract::Board* board_;
  int board_fd_;
  bool sealed_;
  uint64_t epoch_;
  Area gates_[contract::kMaxGpus];
  Area areas_[contract::kMaxSlots];
  bool slot_used_[contract::kMaxSlots] = {};
  std::map<std::string, QuotaRecord> quotas_;  // by key: "pod <uid>", or "client <id>"
  std::string slot_quota_[contract::kMaxSlots];
  // The server's own record of each slot's GPU and priority: the board's copies are for the
  // clients, and a tenant can write them (it must not put itself into hp_slot_mask).
  uint32_t slot_gpu_[contract::kMaxSlots] = {};
  contract::Priority slot_priority_[contract::kMaxSlots] = {};
  struct SlotRecord {
    uint32_t client_id = 0, host_pid = 0, generation = 0;
    uint32_t paused = 0, profile = 0;
    uint64_t memory_limit = 0;
  };
  SlotRecord slot_record_[contract::kMaxSlots];
  GateKnobs knobs_[contract::kMaxGpus];
  std::vector<std::string> gpu_uuids_;  // board order; header.num_gpus and GpuState::uuid are
                                        // copies for the clients
};

// Wakes futex waiters on a shared-memory word (FUTEX_WAKE, not private: other processes wait).
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace orion::server
