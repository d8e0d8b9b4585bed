// Kernel and graph launch hooks: launch events, kernel names, the launch gate, completion
// tracking for high-priority work and sampled GPU timing.
#include "interpose/glibc_compat.h"

#include <stdlib.h>
#include <string.h>

#include "interpose/call_log.h"
#include "interpose/client_state.h"
#include "interpose/completion_tracker.h"
#include "interpose/gpu_hold.h"
#include "interpose/hooks_blas.h"
#include "interpose/launch_gate.h"
#include "interpose/nvtx_ranges.h"
#include "interpose/real_driver.h"
#include "interpose/tables.h"
#include "interpose/timing_hold.h"

namespace orion::interpose {
namespace {

// Per GPU, when the GPU is modeled to finish this process's high-priority work launched so far
// (FollowHighPriorityLaunch).
std::atomic<uint64_t> g_hp_queue_end_ns[kMaxDevices];

struct LaunchInfo {
  uint64_t func = 0;  // CUfunction, or CUgraphExec for graphs
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_mem = 0;
  CUstream stream = nullptr;
  bool per_thread_stream = false;
  bool graph = false;
};

// The kernel's name as the driver keeps it, or null. Launch calls also take a CUkernel (CUDA
// 12+ libraries, e.g. the runtime's own kernels) where a CUfunction goes: cuKernelGetName names
// those.
const char* KernelName(uint64_t func) {
  const char* name = nullptr;
  auto get_name = ORION_DRIVER(cuFuncGetName);
  if (get_name != nullptr && get_name(&name, reinterpret_cast<CUfunction>(func)) == CUDA_SUCCESS) {
    return name;
  }
  auto kernel_name = ORION_DRIVER(cuKernelGetName);
  if (kernel_name != nullptr &&
      kernel_name(&name, reinterpret_cast<CUkernel>(func)) == CUDA_SUCCESS) {
    return name;
  }
  return nullptr;
}

// The process launched a collective: it is a rank of a multi-GPU job (gpu_hold.h, "Ranks of a
// multi-GPU job"). Once, at a kernel's first launch or a graph's instantiation.
void NoteRunsCollectives() {
  g_process.runs_collectives.store(true, std::memory_order_relaxed);
}

[[gnu::cold, gnu::noinline]] void ReportKernelName(Registration* reg, KernelRecord* kernel,
                                                   uint64_t func) {
  contract::Event e{};
  e.kind = contract::EventKind::kKernelName;
  e.cpu_ns = MonotonicNs();
  e.func = func;
  const char* name = KernelName(func);
  CopyTruncated(e.name, sizeof(e.name), name != nullptr ? name : "?");
  kernel->kclass.store(contract::KernelClassToBoard(contract::ClassifyKernelName(name)),
                       std::memory_order_relaxed);
  const bool communication = contract::IsCommunicationKernelName(name);
  kernel->communication.store(communication ? 1 : 0, std::memory_order_relaxed);
  if (communication) NoteRunsCollectives();
  PushEvent(reg, e);
}

// contract::BenchSwitch::kNoClock (a diagnostic arm): the thread's first reading, then the same.
uint64_t ThreadFirstReading() {
  static constinit thread_local uint64_t last ORION_INITIAL_EXEC_TLS = 0;
  if (last == 0) last = MonotonicNs();
  return last;
}

// A launch's clock reading (GuardedLaunch says where it is taken).
[[gnu::always_inline]] inline uint64_t LaunchClock(contract::BenchSwitch bench) {
  return bench != contract::BenchSwitch::kNoClock ? MonotonicNs(g_process.clock_gettime)
                                                  : ThreadFirstReading();
}

// A high-priority launch's notes on its gate entry at `now`: its graph flag (a graph's launch
// takes the GPU hold where `may_hold` and best-effort work is held on the GPU: what they queued
// stops at its next stream wait, HoldsOnGpuFor), its kernel class, its busy period and
// progress (NoteHighPriorityLaunch; a busy period that ended is pushed as kBusyPeriod). True
// when it took the hold: wake the keepers after the launch. Hot: beside the launch's other
// code (in .text it put a high-priority launch's path on one page more than a best-effort one's).
[[gnu::hot]] bool NoteHighPriority(Registration* reg, bool graph, uint32_t kclass, uint64_t now,
                      bool followed, bool may_hold) {
  contract::SlotGate& own_gate = *reg->own_gate;
  const contract::GpuState& gpu = *reg->gpu;
  NoteHighPriorityGraph(own_gate, graph);
  NoteHighPriorityClass(own_gate, kclass);
  BusyPeriod ended;
  // A completion the poller stamped since `now` continues the busy period (no new best-effort
  // budget): NoteHighPriorityLaunch takes a stamp ahead of the launch's as progress.
  const bool ended_period = NoteHighPriorityLaunch(own_gate, gpu, now, &ended, followed);
  // After the launch is in flight in the notes: a keeper that reads them after this epoch sees
  // the graph (gpu_hold.h, HoldGpu).
  const bool took_hold = may_hold && graph && GpuHoldOn(gpu) &&
                         gpu.be_clients.load(std::memory_order_relaxed) != 0 &&
                         HoldGpu(*reg->gate);
  if (ended_period) [[unlikely]] {
    contract::Event b{};
    b.kind = contract::EventKind::kBusyPeriod;
    b.cpu_ns = ended.start_ns;
    b.duration_ns = ended.duration_ns;
    PushEvent(reg, b);
  }
  return took_hold;
}

// The driver's word on whether `stream` is being captured (an invalidated capture included):
// false where it answers with an error, `missing` without the entry point.
bool DriverSaysCapturing(CUstream stream, bool per_thread_stream, bool missing) {
  auto is_capturing = per_thread_stream ? ORION_DRIVER(cuStreamIsCapturing_ptsz)
                                        : ORION_DRIVER(cuStreamIsCapturing);
  if (is_capturing == nullptr) return missing;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return is_capturing(stream, &status) == CUDA_SUCCESS &&
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// True if `stream` is being captured into a graph: such a launch runs nothing now (its kernels
// are counted when the graph is instantiated) and must not be held at the gate or tracked.
// The process's open captures (ProcessState::open_captures, counted by the capture hooks below)
// say first: while none is open no stream can be capturing, a stream that joins a capture
// through an event included, so a launch skips the driver query (about 140 ns on an H100 host).
// A capture the hooks miss would make a captured launch look like a real one; every begin entry
// point of the driver is hooked.
[[gnu::always_inline]] inline bool Capturing(CUstream stream, bool per_thread_stream) {
  return g_process.open_captures.load(std::memory_order_relaxed) > 0 &&
         DriverSaysCapturing(stream, per_thread_stream, /*missing=*/false);
}

// Log mode (no server): the launch timed on the CPU and written to the process's call log.
template <typename Launch>
CUresult LoggedLaunch(const LaunchInfo& info, Launch launch) {
  if (Capturing(info.stream, info.per_thread_stream)) return launch();  // runs nothing now
  return LoggedCall(info.graph ? "cuGraphLaunch" : "cuLaunchKernel",
                    info.graph ? nullptr : KernelName(info.func), 0, launch);
}

// Everything around one launch; `launch` performs the real driver call.
template <typename Launch>
CUresult GuardedLaunch(const LaunchInfo& info, Launch launch) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) [[unlikely]] {
    return CallLogActive() ? LoggedLaunch(info, launch) : launch();
  }
  // Benchmarks only (contract::BenchSwitch): kInterposed unless ORION_BENCH_SWITCH is set.
  const contract::BenchSwitch bench = CurrentBenchSwitch();
  if (bench == contract::BenchSwitch::kAfterRegistration) [[unlikely]] return launch();
  const contract::ClientSlot& slot = *reg->slot;
  const contract::GpuState& gpu = *reg->gpu;
  contract::ClientArea::Counters& counters = reg->area->counters;

  KernelRecord* kernel = info.graph ? g_graphs.Find(info.func) : g_kernels.FindOrInsert(info.func);
  if (!info.graph && kernel != nullptr && kernel->ClaimNameReport()) [[unlikely]] {
    ReportKernelName(reg, kernel, info.func);
  }
  if (Capturing(info.stream, info.per_thread_stream)) [[unlikely]] return launch();
  auto is_high = [&slot] {
    return slot.priority.load(std::memory_order_relaxed) ==
           static_cast<uint32_t>(contract::Priority::kHigh);
  };
  bool high = is_high();
  // A collective waits for its peers on other GPUs: held here, it would leave them spinning
  // (contract::IsCommunicationKernelName). Pausing the client still holds it.
  const bool communication =
      kernel != nullptr && kernel->communication.load(std::memory_order_relaxed) != 0;
  const bool gated = !high && !communication &&
                     gpu.mode.load(std::memory_order_relaxed) !=
                         static_cast<uint32_t>(contract::GateMode::kPassThrough);
  const uint64_t blocks = static_cast<uint64_t>(info.grid[0]) * info.grid[1] * info.grid[2];
  const uint64_t estimate = kernel != nullptr ? kernel->EstimateNs() : kDefaultKernelEstimateNs;
  const uint32_t kclass = kernel != nullptr ? kernel->kclass.load(std::memory_order_relaxed) : 0;
  if (bench == contract::BenchSwitch::kBeforeClock) [[unlikely]] return launch();

  GateTicket ticket;
  // Beside a high-priority graph service with gpu_hold, the launch goes at once behind a stream
  // wait on the gate's word (gpu_hold.h); a process that cuts GEMMs waits at the gate on the
  // CPU first, then goes behind the word too. Otherwise, without a high-priority client on the
  // GPU the gate lets a best-effort launch go uncharged: asked only where there is one (or the
  // client is paused).
  const bool paused = slot.paused.load(std::memory_order_relaxed) != 0;
  const bool beside_high = gated && HighPriorityPresent(gpu, reg->slot_index);
  auto beside_graph_service = [&] {
    return GpuHoldOn(gpu) && HoldsOnGpuFor(*reg->gate, gpu, reg->slot_index);
  };
  // A hold released past its bound (gpu_hold.h, "A hold that lasts") sends launches to the gate
  // on the CPU for policy.gpu_hold_release_ms from the release and while the high-priority clients
  // stay busy; then idle, the release is over, whether or not the keeper has looked since.
  auto released = [&] {
    if (!reg->HoldReleased()) return false;
    const uint64_t now = MonotonicNs();
    return reg->StillReleased(now, HoldReleaseNs(gpu), [&] {
      return HighPriorityBusy(*reg->gate, gpu, reg->slot_index, now).busy;
    });
  };
  const bool hold_on_gpu = beside_high && !paused &&
                           !g_process.runs_collectives.load(std::memory_order_relaxed) &&
                           !released() && beside_graph_service();
  const bool cuts_gemms = hold_on_gpu && g_process.splits_gemms.load(std::memory_order_relaxed);
  const bool held_on_gpu =
      hold_on_gpu && !cuts_gemms && QueueHoldWait(reg, info.stream, info.per_thread_stream);
  if (paused || (beside_high && !held_on_gpu)) [[unlikely]] {
    EndHeldOnGpu(reg);
    ticket = WaitAtGate(*reg->board, *reg->gate, reg->slot_index,
                        BestEffortLaunch{blocks, estimate, kclass}, Config().gate_spin_cap_ns,
                        &counters);
    // Promoted through the admin API while waiting: this launch is already high priority (the
    // wait ends on the promotion), so it is tracked and makes best-effort clients wait.
    high = is_high();
    // Admitted, and still stopped by the service's next graph if it has not started by then
    // (asked again: the wait may have been long, and an eager service never holds the word).
    if (cuts_gemms && !high && beside_graph_service()) {
      QueueHoldWait(reg, info.stream, info.per_thread_stream, HoldWord::kAdmitted);
    }
  }

  const uint64_t launch_index = kernel != nullptr ? kernel->NextLaunchIndex() : 1;
  // Sampled launches (1 in 64 of a best-effort client's and 1 in 256 of a high-priority
  // client's by default: kernel_registry.h) are timed on the GPU in every mode: they teach the
  // gate the kernels' durations and give the timeline measured spans. Profiling times every
  // launch, and every CUDA graph launch is timed: a graph is often a whole request, 1 in 64 of
  // them left a window of 250 requests with 4 samples (busy seconds 0.96x to 1.20x the
  // profiler's, H100), and its timing costs one event record more on a launch of tens of
  // microseconds (the completion event of a followed graph is recorded anyway).
  const bool profile = Config().profile || slot.profile.load(std::memory_order_relaxed) != 0;
  const bool sampled =
      info.graph ||
      ShouldSample(launch_index, high ? Config().sample_every_high : Config().sample_every);
  const bool timed =
      kernel != nullptr &&
      (profile || (sampled && !Config().no_timing && bench != contract::BenchSwitch::kNoTiming));

  // The launch's one clock reading: the gate's where it read one. Otherwise it is read before
  // the driver call only where something before the call needs it: a high-priority launch that
  // best-effort clients may be held for (its notes tell them it is busy: FollowHighPriority), a
  // timed launch, a charged one. Every other launch (a high-priority client's alone on its GPU,
  // a best-effort one's that the gate on the CPU neither held nor charged: held on the GPU, a
  // collective, or with no high-priority client there) reads it once the driver returned. The
  // reading waits for every load before it (the vDSO orders it): before the call, for the misses
  // of the launch path's own lines; after it, the driver has waited for them already. In an
  // eager service's request on one core (H100), read before the call it cost 0.4% of the service
  // time over no reading at all, and read after it neither its CPU nor its service time resolve
  // from none (docs/benchmarks.md, round eleven). A reading extrapolated from the time-stamp
  // counter was no cheaper in place (round eight).
  const bool notes = high && bench != contract::BenchSwitch::kNoHighPriorityNotes;
  const bool clock_first = ticket.go_ns != 0 || timed || ticket.budget_ns != 0 ||
                           (notes && FollowHighPriority(gpu));
  uint64_t now = ticket.go_ns != 0 ? ticket.go_ns : clock_first ? LaunchClock(bench) : 0;

  // High-priority work is followed to completion only while the gate may hold somebody for it,
  // and only where it may outlast the grace after its launch.
  const bool follow =
      notes && clock_first &&
      FollowHighPriorityLaunch(
                  gpu, *reg->gate, g_hp_queue_end_ns[reg->device], now,
                  kernel != nullptr ? kernel->estimate_ns.load(std::memory_order_relaxed) : 0,
                  info.graph);
  PendingLaunch* pending = nullptr;
  uint32_t hold_ticket = 0;  // timing_hold.h: opened on every path below once the end is recorded
  if (follow || timed || ticket.budget_ns != 0) [[unlikely]] {
    // Waited for asleep in the driver only where that pays: a graph or a long kernel.
    pending = AcquirePending(ctx, timed,
                             follow && (info.graph || estimate >= kDriverWaitMinNs));
    if (pending != nullptr) {
      pending->reg = reg;
      pending->kernel = kernel;
      pending->func = info.func;
      pending->stream = reinterpret_cast<uint64_t>(info.stream);
      pending->budget_ns = ticket.budget_ns;
      pending->high_priority = follow;
      memcpy(pending->grid, info.grid, sizeof(info.grid));
      memcpy(pending->block, info.block, sizeof(info.block));
      pending->warmup = launch_index < kWarmupLaunches;
      pending->held = false;
      pending->graph = info.graph;
      if (timed) {
        pending->high = high;
        pending->contended =
            OtherWorkInFlight(*reg->gate, gpu, reg->slot_index, high, now);
        // Not while a stream of the process captures a graph: registering the hold's page then
        // could invalidate a capture in the global mode.
        if (!info.graph && !pending->contended && !pending->warmup &&
            kernel->LaunchedOn(reg->device) &&
            g_process.open_captures.load(std::memory_order_relaxed) == 0 &&
            bench != contract::BenchSwitch::kNoTimingHold) {
          hold_ticket = HoldForTiming(info.stream, info.per_thread_stream);
          pending->held = hold_ticket != 0;
        }
        if (!RecordStart(pending, info.stream, info.per_thread_stream)) pending->timed = false;
      }
    } else if (ticket.budget_ns != 0) {
      ReleaseBudget(*reg->gate, ticket.budget_ns);  // untracked: do not leak the charge
    }
  }
  // A high-priority launch's notes go with its clock reading: before the call where it was read
  // there (best-effort clients may be held for it and must see the GPU busy as early as
  // possible; or the launch is timed), else after the call (below).
  const bool took_hold =
      notes && clock_first &&
      NoteHighPriority(reg, info.graph, kclass, now,
                       /*followed=*/pending != nullptr && pending->high_priority,
                       /*may_hold=*/true);
  NoteLaunchStream(ctx, info.stream, info.per_thread_stream);
  RestartGemmTiming(info.stream, info.per_thread_stream);
  const CUresult result = launch();
  if (took_hold) WakeHoldKeepers(*reg->gate);  // after the launch: off the request's path
  if (result != CUDA_SUCCESS) [[unlikely]] {
    if (pending != nullptr) CompleteNow(pending);
    ReleaseTimingHold(hold_ticket);
    return result;
  }
  if (!clock_first) {
    now = LaunchClock(bench);
    if (notes) {
      NoteHighPriority(reg, info.graph, kclass, now, /*followed=*/false, /*may_hold=*/false);
    }
  }
  // Timed launches only (a kernel's first ones are): what the hold asks, off the launch path.
  if (timed && !info.graph) kernel->NoteLaunchedOn(reg->device);
  const uint32_t kernels = info.graph ? (kernel != nullptr ? kernel->aux.load() : 0) : 1;
  // The launch's record for the server: counted, and its event pushed (a benchmark's arm may
  // leave both out to see what they cost: contract::BenchSwitch::kNoLaunchRecords).
  if (bench != contract::BenchSwitch::kNoLaunchRecords) {
    CountLaunch(reg, kernels, now, paused || beside_high);
    // Every field before the name is set; a launch has no name, so only those words are pushed
    // (and the name's bytes are never initialised).
    contract::Event e;
    e.kind = info.graph ? contract::EventKind::kGraphLaunch : contract::EventKind::kLaunch;
    e.aux = info.graph ? kernels : 0;
    e.cpu_ns = now;
    e.func = info.func;
    e.stream = reinterpret_cast<uint64_t>(info.stream);
    e.bytes = 0;
    e.duration_ns = 0;
    memcpy(e.grid, info.grid, sizeof(e.grid));
    memcpy(e.block, info.block, sizeof(e.block));
    e.shared_mem = info.shared_mem;
    e.flags = pending != nullptr && pending->timed ? contract::kTimedLaunch : 0;
    static_assert(offsetof(contract::Event, flags) + sizeof(e.flags) ==
                  contract::kEventHeadBytes);
    PushEvent(reg, e, contract::kEventHeadBytes);
  }

  if (ticket.waited_ns != 0 || ticket.wait_published) [[unlikely]] {
    contract::EndWait(counters, ticket.waited_ns, ticket.wait_published);
    // The wait as up to two spans ending when the launch went out: the pause first (a resumed
    // client may still meet the gate), then the time held at the gate.
    const uint64_t paused = ticket.paused_ns < ticket.waited_ns ? ticket.paused_ns
                                                                : ticket.waited_ns;
    const uint64_t gate_held = ticket.waited_ns - paused;
    const uint64_t stream = reinterpret_cast<uint64_t>(info.stream);
    PushHeldSpan(reg, now - gate_held, paused, contract::kPausedWait, info.func, stream);
    PushHeldSpan(reg, now, gate_held, 0, info.func, stream);
  }
  // A tracked record takes the time the launch returned (its own clock reading, on a path that
  // records events anyway): a timed sample takes what lies between its start event's record and
  // that return off the kernel's time as the driver's handover (sample_timing.h).
  if (pending != nullptr) [[unlikely]] {
    SubmitPending(pending, info.stream, info.per_thread_stream, MonotonicNs());
  }
  ReleaseTimingHold(hold_ticket);
  KeepRegistered(reg, now);
  return result;
}

LaunchInfo KernelInfo(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned shmem, CUstream stream, bool ptsz) {
  LaunchInfo info;
  info.func = reinterpret_cast<uint64_t>(f);
  info.grid[0] = gx;
  info.grid[1] = gy;
  info.grid[2] = gz;
  info.block[0] = bx;
  info.block[1] = by;
  info.block[2] = bz;
  info.shared_mem = shmem;
  info.stream = stream;
  info.per_thread_stream = ptsz;
  return info;
}

LaunchInfo ExInfo(const CUlaunchConfig* config, CUfunction f, bool ptsz) {
  if (config == nullptr) return KernelInfo(f, 1, 1, 1, 1, 1, 1, 0, nullptr, ptsz);
  return KernelInfo(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                    config->blockDimY, config->blockDimZ, config->sharedMemBytes, config->hStream,
                    ptsz);
}

LaunchInfo GraphInfo(CUgraphExec exec, CUstream stream, bool ptsz) {
  LaunchInfo info;
  info.func = reinterpret_cast<uint64_t>(exec);
  info.stream = stream;
  info.per_thread_stream = ptsz;
  info.graph = true;
  return info;
}

// Kernel nodes of a graph, child graphs included (bounded depth: a pathological nest must not
// recurse without end inside the host process); a collective among them is noted.
uint64_t CountKernelNodes(CUgraph graph, int depth) {
  auto get_nodes = ORION_DRIVER(cuGraphGetNodes);
  auto get_type = ORION_DRIVER(cuGraphNodeGetType);
  auto get_child = ORION_DRIVER(cuGraphChildGraphNodeGetGraph);
  auto get_params = ORION_DRIVER(cuGraphKernelNodeGetParams_v2);
  if (graph == nullptr || get_nodes == nullptr || get_type == nullptr || depth > 8) return 0;
  size_t count = 0;
  if (get_nodes(graph, nullptr, &count) != CUDA_SUCCESS || count == 0) return 0;
  auto* nodes = static_cast<CUgraphNode*>(calloc(count, sizeof(CUgraphNode)));
  if (nodes == nullptr) return 0;
  uint64_t kernels = 0;
  if (get_nodes(graph, nodes, &count) == CUDA_SUCCESS) {
    for (size_t i = 0; i < count; ++i) {
      CUgraphNodeType type;
      if (nodes[i] == nullptr || get_type(nodes[i], &type) != CUDA_SUCCESS) continue;
      if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
        ++kernels;
        if (get_params != nullptr) {  // a captured collective makes the process a job's rank
          CUDA_KERNEL_NODE_PARAMS_v2 params{};
          if (get_params(nodes[i], &params) == CUDA_SUCCESS &&
              contract::IsCommunicationKernelName(
                  KernelName(params.func != nullptr ? reinterpret_cast<uint64_t>(params.func)
                                                    : reinterpret_cast<uint64_t>(params.kern)))) {
            NoteRunsCollectives();
          }
        }
      } else if (type == CU_GRAPH_NODE_TYPE_GRAPH && get_child != nullptr) {
        CUgraph child = nullptr;
        if (get_child(nodes[i], &child) == CUDA_SUCCESS) {
          kernels += CountKernelNodes(child, depth + 1);
        }
      }
    }
  }
  free(nodes);
  return kernels;
}

void RememberGraph(CUresult result, CUgraphExec* exec, CUgraph graph) {
  if (result != CUDA_SUCCESS || exec == nullptr || *exec == nullptr) return;
  CUcontext ctx = nullptr;
  if (CurrentRegistration(&ctx) == nullptr) return;
  KernelRecord* record = g_graphs.FindOrInsert(reinterpret_cast<uint64_t>(*exec));
  if (record == nullptr) return;
  const uint64_t kernels = CountKernelNodes(graph, 0);
  record->aux.store(kernels > 0xFFFFFFFFu ? 0xFFFFFFFFu : static_cast<uint32_t>(kernels),
                    std::memory_order_relaxed);
  record->kclass.store(contract::KernelClassToBoard(contract::KernelClass::kMixed),
                       std::memory_order_relaxed);
  record->queued_ns.store(0, std::memory_order_relaxed);  // an earlier exec's, at this address
}

CUresult CaptureBegun(CUresult result) {
  if (result == CUDA_SUCCESS) g_process.open_captures.fetch_add(1, std::memory_order_relaxed);
  return result;
}

// Ends a capture: counted down when the stream was capturing before the call (an invalidated
// capture ends too, with an error), never below 0.
template <typename End>
CUresult CaptureEnded(CUstream stream, bool per_thread_stream, End end) {
  // Without the query it counts down anyway (Capturing cannot ask the driver then either).
  const bool was = DriverSaysCapturing(stream, per_thread_stream, /*missing=*/true);
  const CUresult result = end();
  if (was) {
    int32_t open = g_process.open_captures.load(std::memory_order_relaxed);
    while (open > 0 &&
           !g_process.open_captures.compare_exchange_weak(open, open - 1,
                                                          std::memory_order_relaxed)) {
    }
  }
  return result;
}

}  // namespace
}  // namespace orion::interpose

using orion::interpose::CaptureBegun;
using orion::interpose::CaptureEnded;
using orion::interpose::ExInfo;
using orion::interpose::GraphInfo;
using orion::interpose::GuardedLaunch;
using orion::interpose::KernelInfo;
using orion::interpose::RememberGraph;

#define ORION_KERNEL_LAUNCH_HOOK(name, ptsz)                                               \
  [[gnu::hot]] CUresult CUDAAPI name(CUfunction f, unsigned int gx, unsigned int gy,       \
                                     unsigned int gz, unsigned int bx, unsigned int by,    \
                                     unsigned int bz, unsigned int shmem, CUstream stream, \
                                     void** params, void** extra) {                        \
    ORION_REAL_OR_RETURN(name)                                                             \
    return GuardedLaunch(KernelInfo(f, gx, gy, gz, bx, by, bz, shmem, stream, ptsz), [&] { \
      return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                \
    });                                                                                    \
  }
ORION_KERNEL_LAUNCH_HOOK(cuLaunchKernel, false)
ORION_KERNEL_LAUNCH_HOOK(cuLaunchKernel_ptsz, true)

#define ORION_COOPERATIVE_LAUNCH_HOOK(name, ptsz)                                                 \
  [[gnu::hot]] CUresult CUDAAPI name(CUfunction f, unsigned int gx, unsigned int gy,              \
                                     unsigned int gz, unsigned int bx, unsigned int by,           \
                                     unsigned int bz, unsigned int shmem, CUstream stream,        \
                                     void** params) {                                             \
    ORION_REAL_OR_RETURN(name)                                                                    \
    return GuardedLaunch(KernelInfo(f, gx, gy, gz, bx, by, bz, shmem, stream, ptsz),              \
                         [&] { return real(f, gx, gy, gz, bx, by, bz, shmem, stream, params); }); \
  }
ORION_COOPERATIVE_LAUNCH_HOOK(cuLaunchCooperativeKernel, false)
ORION_COOPERATIVE_LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, true)

#define ORION_LAUNCH_EX_HOOK(name, ptsz)                                                           \
  [[gnu::hot]] CUresult CUDAAPI name(const CUlaunchConfig* config, CUfunction f, void** params,    \
                                     void** extra) {                                               \
    ORION_REAL_OR_RETURN(name)                                                                     \
    return GuardedLaunch(ExInfo(config, f, ptsz), [&] { return real(config, f, params, extra); }); \
  }
ORION_LAUNCH_EX_HOOK(cuLaunchKernelEx, false)
ORION_LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz, true)

#define ORION_GRAPH_LAUNCH_HOOK(name, ptsz)                                                  \
  [[gnu::hot]] CUresult CUDAAPI name(CUgraphExec exec, CUstream stream) {                    \
    ORION_REAL_OR_RETURN(name)                                                               \
    return GuardedLaunch(GraphInfo(exec, stream, ptsz), [&] { return real(exec, stream); }); \
  }
ORION_GRAPH_LAUNCH_HOOK(cuGraphLaunch, false)
ORION_GRAPH_LAUNCH_HOOK(cuGraphLaunch_ptsz, true)

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                             unsigned long long flags) {
  ORION_REAL_OR_RETURN(cuGraphInstantiateWithFlags)
  const CUresult result = real(exec, graph, flags);
  RememberGraph(result, exec, graph);
  return result;
}

CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node,
                                    char* log, size_t log_bytes) {
  ORION_REAL_OR_RETURN(cuGraphInstantiate)
  const CUresult result = real(exec, graph, error_node, log, log_bytes);
  RememberGraph(result, exec, graph);
  return result;
}

CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node,
                                       char* log, size_t log_bytes) {
  ORION_REAL_OR_RETURN(cuGraphInstantiate_v2)
  const CUresult result = real(exec, graph, error_node, log, log_bytes);
  RememberGraph(result, exec, graph);
  return result;
}

CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  ORION_REAL_OR_RETURN(cuGraphInstantiateWithParams)
  const CUresult result = real(exec, graph, params);
  RememberGraph(result, exec, graph);
  return result;
}

CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  ORION_REAL_OR_RETURN(cuGraphInstantiateWithParams_ptsz)
  const CUresult result = real(exec, graph, params);
  RememberGraph(result, exec, graph);
  return result;
}

// Every entry point that begins a capture: the driver's call, then the count.
#define ORION_CAPTURE_BEGIN_HOOK(name, params, args) \
  CUresult CUDAAPI name params {                     \
    ORION_REAL_OR_RETURN(name)                       \
    return CaptureBegun(real args);                  \
  }
ORION_CAPTURE_BEGIN_HOOK(cuStreamBeginCapture, (CUstream stream), (stream))
ORION_CAPTURE_BEGIN_HOOK(cuStreamBeginCapture_ptsz, (CUstream stream), (stream))
ORION_CAPTURE_BEGIN_HOOK(cuStreamBeginCapture_v2, (CUstream stream, CUstreamCaptureMode mode),
                         (stream, mode))
ORION_CAPTURE_BEGIN_HOOK(cuStreamBeginCapture_v2_ptsz,
                         (CUstream stream, CUstreamCaptureMode mode), (stream, mode))
ORION_CAPTURE_BEGIN_HOOK(cuStreamBeginCaptureToGraph,
                         (CUstream stream, CUgraph graph, const CUgraphNode* deps,
                          const CUgraphEdgeData* edges, size_t count, CUstreamCaptureMode mode),
                         (stream, graph, deps, edges, count, mode))
ORION_CAPTURE_BEGIN_HOOK(cuStreamBeginCaptureToGraph_ptsz,
                         (CUstream stream, CUgraph graph, const CUgraphNode* deps,
                          const CUgraphEdgeData* edges, size_t count, CUstreamCaptureMode mode),
                         (stream, graph, deps, edges, count, mode))

CUresult CUDAAPI cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  ORION_REAL_OR_RETURN(cuStreamEndCapture)
  return CaptureEnded(stream, false, [&] { return real(stream, graph); });
}

CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  ORION_REAL_OR_RETURN(cuStreamEndCapture_ptsz)
  return CaptureEnded(stream, true, [&] { return real(stream, graph); });
}
