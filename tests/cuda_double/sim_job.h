// Simulated multi-GPU job of the CUDA driver test double: where the ranks of a job meet for
// their collectives.
//
// A process joins a job with ORION_SIM_JOB=<name> (and ORION_SIM_RANK=0|1; without it, the rank
// is its GPU's physical index modulo 2). Its communication kernels (a name as NCCL's, ending in
// orion_spin) are numbered in launch order, as NCCL numbers the operations of a communicator on
// every rank alike, and the n-th of one rank pairs with the n-th of the other. A collective
// spins on its GPU from its start until its peer's has started, then runs its duration: the
// ranks publish their starts here, in a small file under the double's state folder
// (job-<name>, beside the gpu<N> files) mapped by both.
//
// Usage:
//   SimJob* job = SimJob::Get();            // nullptr outside a job
//   job->PublishStart(seq, start_ns);
//   uint64_t peer_start;  if (job->PeerStart(seq, &peer_start)) end = max(start, peer) + d;
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace orion::cuda_double {

struct SimJobFile {
  static constexpr uint32_t kMagic = 0x424F4A53u;  // "SJOB"
  static constexpr uint32_t kVersion = 1;
  // Ranks never drift further apart than one unresolved collective each (a collective's GPU is
  // held until its peer starts), so a small ring of sequence numbers is enough.
  static constexpr uint32_t kSlots = 256;
  static constexpr int kRanks = 2;

  struct Slot {
    // Written by the rank itself only: its start, then its sequence number + 1 (0 = none yet).
    std::atomic<uint64_t> seq_plus_one[kRanks];
    std::atomic<uint64_t> start_ns[kRanks];
  };

  std::atomic<uint32_t> magic;
  uint32_t version;
  Slot slots[kSlots];
};

class SimJob {
 public:
  // This process's job (ORION_SIM_JOB), mapped on first use; nullptr when not in a job or the
  // file cannot be mapped (then collectives run as plain kernels, as before).
  static SimJob* Get();

  int rank() const { return rank_; }
  // Rank `rank_` started its collective `seq` at start_ns (simulated time, maybe ahead of now).
  void PublishStart(uint64_t seq, uint64_t start_ns);
  // The peer's start of collective `seq`, if it has started it.
  bool PeerStart(uint64_t seq, uint64_t* start_ns) const;
  // How long a collective waits for its peer before it gives up, as NCCL's watchdog aborts a
  // hung communicator (env ORION_SIM_COLLECTIVE_TIMEOUT_MS, default 10000): the device is never
  // held for ever.
  static uint64_t TimeoutNs();
  const std::string& name() const { return name_; }

 private:
  SimJob(std::string name, int rank, SimJobFile* file)
      : name_(std::move(name)), rank_(rank), file_(file) {}
  std::string name_;
  int rank_;
  SimJobFile* file_;
};

// The rank of a process of a job without ORION_SIM_RANK, from the physical GPU it launches on.
void SetDefaultJobRank(int physical_gpu);

}  // namespace orion::cuda_double
