// Simulated GPU timeline and memory capacity, shared by every process on the machine.
//
// Part of the CUDA driver test double (libcuda.so.1 stand-in for machines without a GPU). Each
// simulated device is a small file (ORION_SIM_DIR, default /dev/shm/orion-sim-<uid>/gpu<N>)
// mapped MAP_SHARED into every process that uses the double, so kernels of different processes
// queue behind each other exactly like time-sliced contexts on one real GPU, and allocations of
// all processes count against one capacity.
//
// Usage:
//   SimGpu* gpu = SimGpu::Get(0);
//   uint64_t end_ns = gpu->ScheduleKernel(stream_ready_ns, 10'000);
//   SleepUntilNs(end_ns);  // what a stream synchronize does
//
// A collective of a simulated job (sim_job.h) spins on its device until its peer's matching
// kernel has started, an end nobody knows at its start: it holds the device open-ended
// (TryOpen ... Close), and every other process's kernel waits until it is closed.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace orion::cuda_double {

inline constexpr int kMaxSimDevices = 16;
inline constexpr uint32_t kMaxSimProcesses = 128;

// The folder of the shared state files: ORION_SIM_DIR, default /dev/shm/orion-sim-<uid>.
std::string SimStateFolder();

// CLOCK_MONOTONIC in nanoseconds: the one clock of the simulated GPU, shared by all processes.
uint64_t NowNs();
// Really sleeps (the caller's thread) until NowNs() >= deadline_ns.
void SleepUntilNs(uint64_t deadline_ns);

// Number of simulated devices a process sees: env ORION_SIM_DEVICES (default 1, at most
// kMaxSimDevices), or, when NVIDIA_VISIBLE_DEVICES lists only this double's GPU UUIDs
// (GPU-6f72696f-6e2d-7369-6d00-0000000000NN, "orion-sim" + NN), those GPUs in that order, as the
// NVIDIA container runtime shows a container only the GPUs its device plugin handed it.
int SimDeviceCount();
// The simulated GPU (its UUID's last byte, its state file gpu<N>) behind a visible ordinal.
int SimPhysicalDevice(int ordinal);

// Simulated capacity of every device in bytes (env ORION_SIM_MEMORY, e.g. "16Gi", "512Mi",
// "1000000"; default 16 GiB).
uint64_t SimMemoryCapacity();

// Multiplier applied to every kernel duration (env ORION_SIM_SCALE, default 1.0).
double SimDurationScale();

// Parses "256Mi", "16Gi", "4Ki", "1G", "100" into bytes; false on junk.
bool ParseByteSize(const char* text, uint64_t* bytes);

// Layout of the per-device state file. Versioned so that a stale file from an older build is
// re-initialised instead of misread.
struct SimGpuFile {
  static constexpr uint32_t kMagic = 0x4D495344u;  // "DSIM"
  static constexpr uint32_t kVersion = 2;  // 2: open-ended holds of collectives

  struct ProcessMemory {
    std::atomic<int32_t> pid;  // owner; 0 = free; reclaimed when the owner is dead
    uint32_t reserved;
    std::atomic<uint64_t> bytes;  // simulated device memory the owner holds now
  };

  std::atomic<uint32_t> magic;
  uint32_t version;
  uint32_t ordinal;
  uint32_t reserved0;
  // End of the last kernel queued on the device by any process. The device runs kernels one at
  // a time in launch order (time-slicing without preemption), so a new kernel starts no earlier.
  std::atomic<uint64_t> busy_until_ns;
  std::atomic<uint64_t> kernels_launched;
  std::atomic<uint64_t> busy_ns_total;  // sum of kernel durations, for utilisation checks
  std::atomic<uint64_t> orphan_bytes;   // memory of processes that found no free slot
  // The process whose spinning collective holds the device open-ended (busy_until_ns is
  // kOpenEnded meanwhile), and since when: a dead holder's device is taken back by the others.
  std::atomic<int32_t> open_pid;
  uint32_t reserved2;
  std::atomic<uint64_t> open_since_ns;
  uint8_t reserved1[48];
  ProcessMemory processes[kMaxSimProcesses];
};

class SimGpu {
 public:
  // The device of this ordinal, opened (and created if needed) on first use; nullptr if the
  // ordinal is out of range. Never fails otherwise: without a usable state folder it falls
  // back to process-private state and says so once on stderr.
  static SimGpu* Get(int ordinal);

  // busy_until_ns while a collective holds the device with no known end.
  static constexpr uint64_t kOpenEnded = UINT64_MAX;

  // Queues a kernel of duration_ns that may start at earliest_start_ns (its stream's previous
  // end) and returns its end time. Lock-free: advances busy_until_ns with compare-and-swap.
  // Only for devices nobody holds open-ended (a device of one process's use); else TrySchedule.
  uint64_t ScheduleKernel(uint64_t earliest_start_ns, uint64_t duration_ns);
  // The same, or false (nothing queued) while a collective holds the device open-ended.
  bool TrySchedule(uint64_t earliest_start_ns, uint64_t duration_ns, uint64_t* end_ns);
  // A collective starts: holds the device open-ended from *start_ns (after everything queued and
  // earliest_start_ns) for this process; *busy_before_ns is the device's end before it. False
  // while somebody else's collective holds it.
  bool TryOpen(uint64_t earliest_start_ns, uint64_t* start_ns, uint64_t* busy_before_ns);
  // This process's open-ended hold ends: the device is busy until end_ns.
  void Close(uint64_t end_ns);
  // Whether this process holds the device open-ended.
  bool OpenedByMe() const;

  // Counts bytes against the shared capacity; false (nothing counted) if it would not fit.
  bool TryReserveMemory(uint64_t bytes);
  void ReleaseMemory(uint64_t bytes);
  // Bytes held by all live processes on this device.
  uint64_t MemoryInUse();
  uint64_t capacity() const { return capacity_; }
  int ordinal() const { return ordinal_; }
  SimGpuFile* state() { return state_; }

 private:
  SimGpu(int ordinal, SimGpuFile* state, uint64_t capacity)
      : ordinal_(ordinal), state_(state), capacity_(capacity) {}
  // This process's accounting slot (claimed lazily, re-claimed after fork).
  std::atomic<uint64_t>* OwnBytes();

  int ordinal_;
  SimGpuFile* state_;
  uint64_t capacity_;
  std::atomic<int32_t> slot_pid_{0};
  std::atomic<int32_t> slot_index_{-1};
};

}  // namespace orion::cuda_double
