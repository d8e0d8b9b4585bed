// Process-wide client state of the interposer: configuration from the environment, one
// registration with orion-server per CUDA device the process uses, and the shared-memory slot
// each registration owns. Everything fails open: any problem turns the process into a plain
// pass-through and says so once on stderr.
//
// Usage (in a hook):
//   CUcontext ctx;
//   Registration* reg = CurrentRegistration(&ctx);
//   if (reg == nullptr) return real(...);  // pass-through
//   PushEvent(reg, event);                   // into the registration's event ring
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <atomic>

#include "contract/orion_contract.h"
#include "interpose/cuda_abi.h"
#include "interpose/env_config.h"
#include "interpose/real_driver.h"
#include "interpose/thread_launch.h"

namespace orion::interpose {

inline constexpr int kMaxDevices = 64;

// Whether `now_ns` is within `least_ns` of a release at `since_ns`; a release stamped after
// `now_ns` was read (the keeper released again meanwhile) is within it.
inline bool WithinRelease(uint64_t now_ns, uint64_t since_ns, uint64_t least_ns) {
  return now_ns < since_ns || now_ns - since_ns < least_ns;
}

// What a launch reads of it comes first, on one 64-byte line.
struct alignas(64) Registration {
  // What the server decides, mapped read-only: the node's board, our slot on it, our GPU's knobs.
  const contract::Board* board = nullptr;
  const contract::ClientSlot* slot = nullptr;
  const contract::GpuState* gpu = nullptr;
  // Shared with the other clients of our GPU: gate words and each HP client's busy state.
  contract::GateArea* gate = nullptr;
  contract::SlotGate* own_gate = nullptr;  // our entry in it
  // Ours alone: counters and event ring.
  contract::ClientArea* area = nullptr;
  int device = -1;
  uint32_t slot_index = 0;
  uint32_t generation = 0;
  // 1 since the process's hold keeper for this GPU found the hold held past its bound
  // (GpuState::gpu_hold_max_ns, gpu_hold.h "A hold that lasts"), until its first verdict that
  // is not once GpuState::gpu_hold_release_ns has gone: best-effort launches wait at the gate on
  // the CPU instead of behind the word while the high-priority clients stay busy, and for that
  // long in any case. Written by the keeper, read by launches (HoldReleased;
  // plain, so that a renewal resets it).
  uint32_t hold_released = 0;
  // When the keeper last set hold_released (MonotonicNs): a release lasts at least
  // GpuState::gpu_hold_release_ns from it. Read by a launch only while released.
  uint64_t hold_released_ns = 0;
  // Not read by a launch.
  int socket_fd = -1;  // kept open: the server frees the slot when it closes
  // Our pod's memory quota (shared by the registrations of the pod's processes; ours alone
  // outside pods): the bytes held, checked against slot->memory_limit_bytes.
  contract::QuotaArea* quota = nullptr;
  uint32_t client_id = 0;
  uint64_t server_epoch = 0;  // of the board this registration's slot is on

  // False once the server reassigned the slot (server restart): stop writing into it.
  bool StillOwned() const { return slot->generation.load(std::memory_order_relaxed) == generation; }
  bool HoldReleased() const { return __atomic_load_n(&hold_released, __ATOMIC_RELAXED) != 0; }
  // Released at `now_ns`: the time first, then the flag (a launch that sees the flag set by
  // StillReleased's acquire sees that time).
  void NoteReleased(uint64_t now_ns) {
    __atomic_store_n(&hold_released_ns, now_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&hold_released, 1u, __ATOMIC_RELEASE);
  }
  void ClearReleased() { __atomic_store_n(&hold_released, 0u, __ATOMIC_RELAXED); }
  uint64_t HoldReleasedNs() const { return __atomic_load_n(&hold_released_ns, __ATOMIC_RELAXED); }
  // A released process's launches still wait at the gate on the CPU at `now_ns`: within
  // `least_ns` of the release whatever the high-priority clients do, after it while `busy()`.
  template <typename Busy>
  bool StillReleased(uint64_t now_ns, uint64_t least_ns, Busy busy) const {
    if (__atomic_load_n(&hold_released, __ATOMIC_ACQUIRE) == 0) return false;
    return WithinRelease(now_ns, HoldReleasedNs(), least_ns) || busy();
  }
};

static_assert(offsetof(Registration, hold_released) + sizeof(uint32_t) <= 64,
              "a launch's fields on one line");

// The process-wide words every launch reads, on one 64-byte line with the configuration's
// launch-path fields (EnvConfig's first ones); a steady launch found them on five lines before.
// Hidden and declared here: the launch path reads them inline.
struct alignas(64) ProcessState {
  // Set once the process's initialisation has returned, and whether it found the driver: every
  // hook asks (EnsureProcessInit), twice on a launch.
  std::atomic<bool> ready{false};
  bool driver_ok = false;
  // Whether the ring's next entry is prefetched for writing (x86: where CPUID has PRFCHW;
  // elsewhere always, the compiler's store prefetch being only a hint), set once at start.
  bool prefetch_ring = false;
  // Set once the process launched a collective (a kernel named like NCCL's, or a graph holding
  // one): it is a rank of a multi-GPU job, and its best-effort work is held at the gate on the
  // CPU, never on the GPU (gpu_hold.h, RunsCollectives).
  std::atomic<bool> runs_collectives{false};
  // Set once the process ran a GEMM in pieces (hooks_blas.cc): its best-effort work is held at
  // the gate on the CPU too (gpu_hold.h, "GEMMs in pieces").
  std::atomic<bool> splits_gemms{false};
  // Set once any registration failed: the whole process passes through from then on.
  std::atomic<uint32_t> pass_through{0};
  // Bumped in a fork child and at a renewal: every thread's cached registration is looked up
  // again (ThreadLaunch).
  std::atomic<uint32_t> epoch{1};
  // Stream captures begun and not yet ended in this process (hooks_launch.cc, Capturing).
  std::atomic<int32_t> open_captures{0};
  // ORION_BENCH_SWITCH's word (contract::BenchSwitch), mapped read-only at start (null without
  // it): the launch path asks it on every launch.
  const std::atomic<uint32_t>* bench_switch = nullptr;
  // The launch path's two calls out, read from this line: the clock (not through the PLT and
  // its GOT line) and the driver's cuCtxGetCurrent (set with the driver, at start).
  int (*clock_gettime)(clockid_t, timespec*) = ::clock_gettime;
  DriverFn_cuCtxGetCurrent ctx_get_current = nullptr;
  // Parsed once, on the first hooked call.
  EnvConfig config;
  // When the process first ran a GEMM in pieces (MonotonicNs; splits_gemms): its keeper drains
  // the waits it queued on gpu_hold before (gpu_hold.h, KeeperMayOpen). Off the launch path.
  std::atomic<uint64_t> first_cut_ns{0};
};
static_assert(offsetof(ProcessState, config) + offsetof(EnvConfig, sample_every_high) +
                      sizeof(uint32_t) <= 64,
              "the launch path's words on one line");
__attribute__((visibility("hidden"))) extern ProcessState g_process;
inline const EnvConfig& Config() { return g_process.config; }

// Writes one line to stderr, printf-style, cut at 511 bytes (a failed write loses the line;
// callers check ORION_QUIET).
__attribute__((format(printf, 1, 2))) void WriteStderrLine(const char* format, ...);

// Starts one of the interposer's own background threads, detached and with every signal blocked
// (the application's signals must never land on it); false if it could not be created.
bool StartQuietThread(void* (*main)(void*), void* arg);

bool EnsureProcessInitSlow();

// Resolves the driver and the configuration (pthread_once, the first time). False: pass
// through. Once done, one acquire load.
inline bool EnsureProcessInit() {
  if (g_process.ready.load(std::memory_order_acquire)) [[likely]] return g_process.driver_ok;
  return EnsureProcessInitSlow();
}

// ORION_BENCH_SWITCH's word now (kInterposed without the variable): benchmarks only.
inline contract::BenchSwitch CurrentBenchSwitch() {
  const std::atomic<uint32_t>* word = g_process.bench_switch;
  return word == nullptr ? contract::BenchSwitch::kInterposed
                         : static_cast<contract::BenchSwitch>(
                               word->load(std::memory_order_relaxed));
}

// Registration for the calling thread's current context, registering the device on first use.
// Null when the process passes through (disabled, no server, no context, ...). *ctx_out receives
// the current context (may be null).
Registration* CurrentRegistration(CUcontext* ctx_out);

// A registration whose server has not beaten its heartbeat for this long is renewed: the server
// restarted (or was replaced by an upgrade) and its new board is another one. The renewal keeps
// the process's priority (decided again by the new server from the same identity) and carries
// the client's counters (memory in use, peak, launches, throttled time) into the new slot.
inline constexpr uint64_t kRenewAfterNs = 500'000'000;
// Attempts are at least this far apart while the server is away.
inline constexpr uint64_t kRenewRetryNs = 250'000'000;
// Renewals of one device's registration in a process's life (a bound on the slots it may leave
// behind on old boards, which stay mapped: in-flight records may still point at them).
inline constexpr uint32_t kMaxRenewals = 8;

// Registers the device of `reg` again with whatever server now listens on the socket, at most
// every kRenewRetryNs, without blocking other threads (one thread renews, the others go on with
// the old registration meanwhile).
void RenewRegistration(Registration* reg, uint64_t now_ns);

// After a launch at `now_ns`: one load of the board's heartbeat; renews the registration if the
// server has been silent for kRenewAfterNs.
inline void KeepRegistered(Registration* reg, uint64_t now_ns) {
  const uint64_t beat = reg->board->header.server_heartbeat_ns.load(std::memory_order_relaxed);
  if (beat < now_ns && now_ns - beat >= kRenewAfterNs) RenewRegistration(reg, now_ns);
}

// The launch counter (ClientArea::Counters::launches: kernels launched, graph nodes counted) in
// batches: each thread adds its launches to its registration's counter once it holds
// kLaunchTallyKernels of them, instead of a locked add on the shared counter's line at every
// launch (one of the launch path's two locked instructions; in the same turns on H100 hosts,
// nine medians of ten comparisons lower, by up to 78 ns a launch, docs/benchmarks.md). A
// thread's tally is added at once where the launch met the gate
// (a best-effort launch beside high-priority work, or a paused client's), at its first launch
// after kLaunchTallyNs without one (a thread that waited, e.g. in a synchronize, shows its
// progress at its next launch), and when it launches on another registration. So the counter
// stands still exactly while a held client launches nothing, and lags a running one by at most
// 31 kernels (a thread's last tally is added when it exits, and the exiting thread's when the
// library is unloaded at the process's exit; threads still running then leave up to 31 each
// out); the server shows the larger of it and the launch events it has read. A registration
// renewed for a new server takes the tally on; the forking thread's is dropped in a fork child.
inline constexpr uint64_t kLaunchTallyKernels = 32;
inline constexpr uint64_t kLaunchTallyNs = 1'000'000;
// The tally is the thread's (ThreadLaunch::tally_*).

// At a thread's first counted launch: its tally is added when it exits.
void WatchLaunchTally();

inline void AddLaunchTally(Registration* reg, uint64_t kernels) {
  if (reg != nullptr && kernels != 0 && reg->area != nullptr) {
    reg->area->counters.launches.fetch_add(kernels, std::memory_order_relaxed);
  }
}

inline void CountLaunch(Registration* reg, uint32_t kernels, uint64_t now_ns, bool gated) {
  ThreadLaunch& t = t_launch;
  if (t.tally_reg != reg) {
    if (t.tally_reg == nullptr) {
      WatchLaunchTally();
    } else if (t.tally_reg->device != reg->device) {
      AddLaunchTally(t.tally_reg, t.tally_kernels);  // another GPU's
      t.tally_kernels = 0;
    }
    // The same GPU's registration renewed (a new server): the tally goes on in the new one,
    // whose counters were carried from the old (CarryClientCounters).
    t.tally_reg = reg;
  }
  // Summed in 64 bits: a graph adds its kernel nodes, up to 2^32 - 1 of them.
  const uint64_t tally = uint64_t{t.tally_kernels} + kernels;
  if (tally >= kLaunchTallyKernels || gated || now_ns - t.tally_added_ns >= kLaunchTallyNs) {
    AddLaunchTally(reg, tally);
    t.tally_kernels = 0;
    t.tally_added_ns = now_ns;
  } else {
    t.tally_kernels = static_cast<uint32_t>(tally);  // under kLaunchTallyKernels
  }
}

// Pushes one event into the registration's ring (a full ring counts a drop, never blocks): its
// first `bytes` (contract::kEventHeadBytes for an event without a name). Then prefetches the
// next entry for writing (contract::EventRing::PrefetchNextEntry).
inline void PushEvent(Registration* reg, const contract::Event& event,
                      size_t bytes = sizeof(contract::Event)) {
  contract::EventRing& ring = reg->area->ring;
  // Not after a drop: the next entry of a full ring is the one the server is about to read.
  if (ring.TryPush(event, bytes) && g_process.prefetch_ring &&
      CurrentBenchSwitch() != contract::BenchSwitch::kNoRingPrefetch) {
    ring.PrefetchNextEntry();
  }
}

// A held span for the timeline's "held at gate" row (kThrottled): `duration_ns` ending at
// `ended_ns`, none when 0; `flags` kPausedWait for a pause; `func` and `stream` the launch held
// (0 for work held on the GPU, which no one launch stands for).
inline void PushHeldSpan(Registration* reg, uint64_t ended_ns, uint64_t duration_ns,
                         uint32_t flags = 0, uint64_t func = 0, uint64_t stream = 0) {
  if (duration_ns == 0) return;
  contract::Event t{};
  t.kind = contract::EventKind::kThrottled;
  t.cpu_ns = ended_ns;
  t.func = func;
  t.stream = stream;
  t.duration_ns = duration_ns;
  t.flags = flags;
  PushEvent(reg, t);
}

// What a hook returns when the driver or the entry point is missing.
inline CUresult DriverMissingResult(bool driver_loaded) {
  return driver_loaded ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace orion::interpose

// Opening of every hook: initialise once, fetch the typed real pointer into `real`.
#define ORION_REAL_OR_RETURN(name)                                          \
  const bool orion_driver_loaded = ::orion::interpose::EnsureProcessInit(); \
  const auto real = ORION_REAL(name);                                       \
  if (real == nullptr) return ::orion::interpose::DriverMissingResult(orion_driver_loaded);
