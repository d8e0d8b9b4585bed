// Server side of the shared-memory board: creates the board file, lays out GPUs and slots,
// assigns and frees client slots, and publishes policy knobs. The server never trusts what clients
// wrote: values read back are clamped by the caller.
//
// Usage:
//   absl::StatusOr<std::unique_ptr<BoardFile>> board = BoardFile::Create("/run/orion/board");
//   int gpu = (*board)->AddGpu("GPU-...");
//   auto slot = (*board)->AssignSlot(client_id, pid, gpu, Priority::kHigh, limit);
#pragma once

#include <cstdint>
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
};

class BoardFile {
 public:
  // Creates (or truncates and re-initialises) the board file and maps it. The file is
  // world-readable/writable (0666) because clients in pods run as arbitrary users.
  static absl::StatusOr<std::unique_ptr<BoardFile>> Create(const std::string& path);
  ~BoardFile();
  BoardFile(const BoardFile&) = delete;
  BoardFile& operator=(const BoardFile&) = delete;

  contract::Board& board() { return *board_; }
  const std::string& path() const { return path_; }
  uint64_t epoch() const { return epoch_; }

  // Returns the GPU index of uuid, adding it if there is room. -1 if the board is full.
  // GPUs are looked up in the server's own record, never in the board (tenants can write it).
  int FindOrAddGpu(const std::string& uuid);
  int FindGpu(const std::string& uuid) const;
  uint32_t num_gpus() const;
  const std::string& gpu_uuid(uint32_t gpu) const { return gpu_uuids_.at(gpu); }

  // Slot life cycle. AssignSlot resets the ring and all counters before publishing kActive.
  std::optional<uint32_t> AssignSlot(uint32_t client_id, uint32_t pid, uint32_t gpu,
                                     contract::Priority priority, uint64_t memory_limit);
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
  // record: tenants map the board writable, and one may have written over them. Returns how
  // many fields were put back (0 when nobody touched them). A few microseconds for 256 slots.
  uint32_t Reassert();

 private:
  BoardFile(std::string path, contract::Board* board, size_t bytes, uint64_t epoch)
      : path_(std::move(path)), board_(board), bytes_(bytes), epoch_(epoch) {}
  // hp_slot_mask and be_clients of a GPU as the server's records say (never the board's copies).
  struct PriorityView {
    uint64_t hp_mask[contract::kMaxSlots / 64] = {};
    uint32_t best_effort = 0;
  };
  PriorityView PrioritiesFromRecords(uint32_t gpu) const;
  // Publishes them to the board.
  void RecomputePriorities(uint32_t gpu);

  std::string path_;
  contract::Board* board_;
  size_t bytes_;
  uint64_t epoch_;
  bool slot_used_[contract::kMaxSlots] = {};
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
