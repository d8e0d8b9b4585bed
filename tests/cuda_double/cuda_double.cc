// CUDA driver test double: a libcuda.so.1 that stands in for the NVIDIA driver on machines
// without a GPU (CI, laptops). It is NOT a driver and runs no GPU code.
//
// It implements, with the ABI names and prototypes of cuda.h, the driver calls that the
// project's samples and interposer use. Kernels are simulated on a timeline shared by all
// processes of the machine (sim_gpu.h): a launch returns at once and occupies the simulated
// device for its duration after everything queued before it, by any process; synchronize calls
// really sleep until then. Device memory is host memory (so copies and memsets work) counted
// against a simulated capacity shared by all processes.
//
// Knobs (environment): ORION_SIM_DIR (shared state folder), ORION_SIM_DEVICES (default 1),
// ORION_SIM_MEMORY (capacity per device, default 16Gi), ORION_SIM_SCALE (duration multiplier),
// ORION_SIM_INIT_ERROR (a CUresult number that cuInit returns, to test failure paths).
// Kernel durations: `orion_spin(unsigned long long ns)` (and PREFIXorion_spin) runs its first
// argument, others 10 us.
//
// Streams: a stream wait (cuStreamWaitValue32) is taken by the device once the stream's earlier
// work has ended, and holds everything behind it on that stream until its word satisfies it;
// launches behind it return at once and stay queued in the process until then. A per-process
// front-end thread (started on first need) moves queued work on; synchronize, query and event
// calls count it as unfinished.
//
// Simulated jobs (ORION_SIM_JOB, ORION_SIM_RANK, ORION_SIM_COLLECTIVE_TIMEOUT_MS; sim_job.h): a
// communication kernel named like NCCL's and ending in orion_spin spins on its device from its
// start until the peer rank's matching one has started, then runs its duration. Meanwhile no
// other process's kernel starts on that device (one context at a time, no preemption); the
// process's own kernels on other streams run beside it, as kernels of one context do (a
// collective takes a few SMs): a pipeline rank's receive posted on one stream before its sends
// on another reached the device would otherwise wait for itself.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "contract/kernel_class.h"
#include "tests/cuda_double/driver_objects.h"
#include "tests/cuda_double/sim_job.h"

namespace orion::cuda_double {

DriverState& State() {
  static DriverState* state = new DriverState;
  return *state;
}

namespace {

constexpr int kDriverVersion = 13000;
constexpr uint64_t kDefaultKernelNs = 10'000;
constexpr size_t kVmmGranularity = 2ull << 20;
constexpr size_t kPitchAlignment = 512;

thread_local Context* current_ctx = nullptr;

using Lock = std::lock_guard<std::mutex>;

void AtomicMax(std::atomic<uint64_t>& target, uint64_t value) {
  uint64_t seen = target.load(std::memory_order_relaxed);
  while (seen < value && !target.compare_exchange_weak(seen, value, std::memory_order_acq_rel)) {
  }
}

bool Initialized() {
  DriverState& s = State();
  Lock lock(s.mu);
  return s.initialized;
}

bool ValidDevice(CUdevice dev) { return dev >= 0 && dev < SimDeviceCount(); }

// Current context of the calling thread if it is still alive (caller holds the mutex).
Context* CurrentContext(DriverState& s) { return s.Find<Context>(current_ctx); }

// Maps a stream handle to its object; the default-stream handles (0, CU_STREAM_LEGACY,
// CU_STREAM_PER_THREAD) mean the current context's one default stream.
CUresult ResolveStream(DriverState& s, CUstream handle, Stream** out) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    Context* ctx = CurrentContext(s);
    if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    *out = ctx->default_stream;
    return CUDA_SUCCESS;
  }
  *out = s.Find<Stream>(handle);
  return *out == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

Context* NewContext(DriverState& s, int device, bool primary) {
  static uint64_t next_id = 1;  // under s.mu
  auto* ctx = s.Add(new Context);
  ctx->id = next_id++;
  ctx->device = device;
  ctx->gpu = SimGpu::Get(device);
  ctx->primary = primary;
  ctx->default_stream = new Stream;  // not registered: only reachable through default handles
  ctx->default_stream->ctx = ctx;
  return ctx;
}


uint64_t Scaled(uint64_t ns) {
  const double scaled = static_cast<double>(ns) * SimDurationScale();
  return scaled < 1.0 ? 1 : static_cast<uint64_t>(scaled);
}

// Duration of one launch: orion_spin's first argument (kernelParams or the packed `extra`
// buffer), otherwise a fixed small kernel.
uint64_t KernelDurationNs(const Function* f, void** params, void** extra) {
  uint64_t ns = kDefaultKernelNs;
  if (f->spin) {
    if (params != nullptr && params[0] != nullptr) {
      memcpy(&ns, params[0], sizeof(ns));
    } else if (extra != nullptr) {
      const void* buffer = nullptr;
      size_t buffer_size = 0;
      for (int i = 0; i < 16 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != nullptr) {
          buffer_size = *static_cast<size_t*>(extra[i + 1]);
        }
      }
      if (buffer != nullptr && buffer_size >= sizeof(ns)) memcpy(&ns, buffer, sizeof(ns));
    }
  }
  return Scaled(ns);
}

CUresult StreamSync(CUstream hstream);
void Submit(DriverState& s, Stream* st, const QueuedWork& w);

CUresult Launch(CUfunction hfunc, unsigned int gx, unsigned int gy, unsigned int gz,
                unsigned int bx, unsigned int by, unsigned int bz, CUstream hstream, void** params,
                void** extra) {
  const uint64_t entered_ns = NowNs();
  DriverState& s = State();
  Stream* stream = nullptr;
  uint64_t duration = 0;
  bool collective = false;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    Function* f = s.Find<Function>(hfunc);
    if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (static_cast<uint64_t>(bx) * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
    if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
    const CUresult r = ResolveStream(s, hstream, &stream);
    if (r != CUDA_SUCCESS) return r;
    duration = KernelDurationNs(f, params, extra);
    collective = f->collective;
    if (stream->capture != nullptr) {
      auto* node = new GraphNode;
      node->type = CU_GRAPH_NODE_TYPE_KERNEL;
      node->func = f;
      node->duration_ns = duration;
      stream->capture->nodes.push_back(node);
      return CUDA_SUCCESS;
    }
    if (s.kernel_launches < DriverState::kMaxLaunchEntries) {
      s.launch_entered_ns[s.kernel_launches] = entered_ns;
    }
    ++s.kernel_launches;
    QueuedWork w;
    w.duration_ns = duration;
    if (collective) {
      SetDefaultJobRank(SimPhysicalDevice(stream->ctx->device));
      w.collective = SimJob::Get() != nullptr;
      if (w.collective) w.seq = s.collective_seq++;  // in launch order, as NCCL numbers them
    }
    Submit(s, stream, w);
  }
  // ORION_SIM_LAUNCH_SYNCS=N: every Nth launch returns only once its stream is done, as a real
  // driver's launch does that loads its kernel's module lazily or resizes local memory.
  static const uint64_t launch_syncs = [] {
    const char* v = getenv("ORION_SIM_LAUNCH_SYNCS");
    return v != nullptr ? strtoull(v, nullptr, 10) : 0ull;
  }();
  static std::atomic<uint64_t> launches{0};
  if (launch_syncs != 0 && (launches.fetch_add(1) + 1) % launch_syncs == 0) {
    return StreamSync(hstream);
  }
  return CUDA_SUCCESS;
}

CUresult LaunchEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                config->blockDimY, config->blockDimZ, config->hStream, params, extra);
}

// True if [address, address + bytes) lies inside one simulated device allocation or mapping.
bool DeviceRangeValid(DriverState& s, uint64_t address, size_t bytes) {
  auto it = s.allocations.upper_bound(address);
  if (it == s.allocations.begin()) return false;
  --it;
  return address >= it->first && address - it->first <= it->second.size &&
         bytes <= it->second.size - (address - it->first);
}

// Where a copy's address lives. kUnified (cuMemcpy): device if it falls in an allocation.
enum class Side { kHost, kDevice, kUnified };

bool RangeOk(DriverState& s, uint64_t address, size_t bytes, Side side) {
  if (side == Side::kHost) return true;
  if (side == Side::kUnified) {
    auto it = s.allocations.upper_bound(address);
    const bool inside =
        it != s.allocations.begin() && address - std::prev(it)->first < std::prev(it)->second.size;
    if (!inside) return true;
  }
  return DeviceRangeValid(s, address, bytes);
}

// Whether a stream wait's condition holds for `word` (CUstreamWaitValue_flags).
bool WaitHolds(uint32_t word, uint32_t value, unsigned int flags) {
  switch (flags & ~static_cast<unsigned int>(CU_STREAM_WAIT_VALUE_FLUSH)) {
    case CU_STREAM_WAIT_VALUE_GEQ: return static_cast<int32_t>(word - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return word == value;
    case CU_STREAM_WAIT_VALUE_AND: return (word & value) != 0;
    default: return ~(word | value) != 0;  // NOR
  }
}

constexpr uint64_t kStreamWaitLimitNs = 10'000'000'000;  // a wait nobody releases: an error

// ---- The front end: queued work, collectives, and the thread that moves them on -------------

constexpr uint64_t kPendingNs = UINT64_MAX;         // an event whose record is still queued
constexpr uint64_t kFrontEndPollNs = 40'000;        // looking again at words and peers
constexpr uint64_t kFrontEndMinSleepNs = 20'000;

using OpenCollective = DriverState::OpenCollective;

// A collective's end is known: it ends the stream's open kernel, and the device is the other
// processes' again once none of this process's collectives holds it (caller holds s.mu).
void EndCollective(DriverState& s, const OpenCollective& c, uint64_t end_ns) {
  Stream* st = c.stream;
  st->collective_open = false;
  AtomicMax(st->last_end_ns, end_ns);
  AtomicMax(st->ctx->last_end_ns, end_ns);
  DriverState::OwnDevice& own = s.own[st->ctx->device];
  own.lane_until = std::max(own.lane_until, end_ns);
  if (--own.open_collectives == 0) st->ctx->gpu->Close(own.lane_until);
}

// Ends `c` if its peer has started (or it waited past the time limit); whether it ended.
bool TryEndCollective(DriverState& s, const OpenCollective& c, uint64_t now) {
  SimJob* job = SimJob::Get();
  uint64_t peer_start = 0;
  if (job->PeerStart(c.seq, &peer_start)) {
    EndCollective(s, c, std::max(c.start_ns, peer_start) + c.duration_ns);
    return true;
  }
  if (now - c.opened_ns < SimJob::TimeoutNs()) return false;
  // As NCCL's watchdog: the operation is abandoned, the device freed, the job goes on late.
  ++s.collective_timeouts;
  fprintf(stderr,
          "orion cuda double: job %s rank %d: collective %llu waited %.1f s for its peer; "
          "given up\n",
          job->name().c_str(), job->rank(), static_cast<unsigned long long>(c.seq),
          static_cast<double>(now - c.opened_ns) / 1e9);
  EndCollective(s, c, now);
  return true;
}

void WakeFrontEnd(DriverState& s);

// Places one kernel of `st` on its device now if it can; false while another process's
// collective holds the device (caller holds s.mu).
bool TryStartKernel(DriverState& s, Stream* st, const QueuedWork& w, uint64_t now) {
  Context* ctx = st->ctx;
  SimGpu* gpu = ctx->gpu;
  DriverState::OwnDevice& own = s.own[ctx->device];
  const uint64_t earliest = st->last_end_ns.load(std::memory_order_acquire);
  if (w.collective) {
    uint64_t start = 0;
    if (own.open_collectives > 0 && gpu->OpenedByMe()) {
      start = std::max(now, earliest);  // the device is this process's already
    } else {
      uint64_t busy_before = 0;
      if (!gpu->TryOpen(earliest, &start, &busy_before)) return false;
      own.lane_until = busy_before;
      own.open_collectives = 0;
    }
    ++own.open_collectives;
    st->collective_open = true;
    SimJob::Get()->PublishStart(w.seq, start);
    const OpenCollective c{st, w.seq, start, w.duration_ns, now};
    if (!TryEndCollective(s, c, now)) {
      s.open_collectives.push_back(c);
      WakeFrontEnd(s);
    }
    return true;
  }
  uint64_t end = 0;
  if (own.open_collectives > 0 && gpu->OpenedByMe()) {
    const uint64_t start = std::max({now, earliest, own.lane_until});
    end = start + w.duration_ns;
    own.lane_until = end;
  } else if (!gpu->TrySchedule(earliest, w.duration_ns, &end)) {
    return false;
  }
  AtomicMax(st->last_end_ns, end);
  AtomicMax(ctx->last_end_ns, end);
  return true;
}

// Moves `st`'s queued work to the device as far as it can, in order (caller holds s.mu).
void Pump(DriverState& s, Stream* st, uint64_t now) {
  while (!st->queue.empty() && !st->collective_open) {
    QueuedWork& w = st->queue.front();
    if (w.type == QueuedWork::Type::kWait) {
      // The device takes the wait once the stream's earlier work has ended.
      if (st->last_end_ns.load(std::memory_order_acquire) > now ||
          !WaitHolds(w.word->load(std::memory_order_acquire), w.value, w.flags)) {
        return;
      }
    } else if (w.type == QueuedWork::Type::kEventRecord) {
      w.event->time_ns = std::max(now, st->last_end_ns.load(std::memory_order_acquire));
    } else if (!TryStartKernel(s, st, w, now)) {
      return;
    }
    st->queue.pop_front();
  }
}

bool StreamIdle(const Stream* st) { return st->queue.empty() && !st->collective_open; }

// One round of the front end: ends the collectives whose peers started, moves every stream's
// queued work on. Returns when to look again (0: nothing is waiting).
uint64_t Progress(DriverState& s, uint64_t now) {
  for (size_t i = 0; i < s.open_collectives.size();) {
    if (TryEndCollective(s, s.open_collectives[i], now)) {
      s.open_collectives.erase(s.open_collectives.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  uint64_t next = s.open_collectives.empty() ? 0 : now + kFrontEndPollNs;
  for (size_t i = 0; i < s.queued_streams.size();) {
    Stream* st = s.queued_streams[i];
    Pump(s, st, now);
    if (st->queue.empty()) {
      st->listed = false;
      s.queued_streams[i] = s.queued_streams.back();
      s.queued_streams.pop_back();
      continue;
    }
    // A wait behind running work: look again when that work ends; anything else: poll.
    const uint64_t last_end = st->last_end_ns.load(std::memory_order_acquire);
    const uint64_t at = !st->collective_open && st->queue.front().type == QueuedWork::Type::kWait &&
                                last_end > now
                            ? last_end
                            : now + kFrontEndPollNs;
    next = next == 0 ? at : std::min(next, at);
    ++i;
  }
  return next;
}

void FrontEnd() {
  DriverState& s = State();
  std::unique_lock<std::mutex> lock(s.mu);
  const int me = getpid();
  while (s.front_end_pid == me) {
    const uint64_t now = NowNs();
    const uint64_t next = Progress(s, now);
    if (next == 0) {
      s.front_end_wake.wait(lock);
    } else {
      const uint64_t sleep_ns = std::max(next > now ? next - now : 0, kFrontEndMinSleepNs);
      s.front_end_wake.wait_for(lock, std::chrono::nanoseconds(sleep_ns));
    }
  }
}

// Something waits to be moved on: make sure this process's front end runs (caller holds s.mu).
void WakeFrontEnd(DriverState& s) {
  const int me = getpid();
  if (s.front_end_pid != me) {  // first need, or a child after fork(): the thread is not there
    s.front_end_pid = me;
    std::thread(FrontEnd).detach();
  }
  s.front_end_wake.notify_one();
}

// Queues `w` on `st` and moves it on at once if it can (caller holds s.mu).
void Submit(DriverState& s, Stream* st, const QueuedWork& w) {
  st->queue.push_back(w);
  Pump(s, st, NowNs());
  if (st->queue.empty()) return;
  if (!st->listed) {
    st->listed = true;
    s.queued_streams.push_back(st);
    WakeFrontEnd(s);
  } else if (s.front_end_pid != getpid()) {
    WakeFrontEnd(s);  // a child after fork() with its parent's listed streams: start its own
  }  // else the front end looks at this stream's head already
}

// Sleeps until `done` (called under s.mu) says the work it waits for left the front end, moving
// work on meanwhile, and looking again when the front end would (a wait behind running work: when
// that work ends; a simulated GPU's front end costs the host no CPU, so the double polls as little
// as it can); false after kStreamWaitLimitNs (a wait nobody releases).
template <typename Done>
bool WaitForFrontEnd(Done done) {
  DriverState& s = State();
  const uint64_t deadline = NowNs() + kStreamWaitLimitNs;
  for (;;) {
    uint64_t now = 0;
    uint64_t next = 0;
    {
      Lock lock(s.mu);
      now = NowNs();  // under the lock: no collective opened or record placed after it
      next = Progress(s, now);
      if (done()) return true;
    }
    if (now > deadline) return false;
    SleepUntilNs(next == 0 ? now + kFrontEndPollNs
                           : std::min(std::max(next, now + kFrontEndMinSleepNs), deadline));
  }
}

// Waits until every stream of `ctx` has left the front end; then *until_ns is the end of its
// last kernel. False after the limit.
bool DrainContext(Context* ctx, uint64_t* until_ns) {
  DriverState& s = State();
  return WaitForFrontEnd([&] {
    for (const Stream* st : s.queued_streams) {
      if (st->ctx == ctx) return false;
    }
    for (const OpenCollective& c : s.open_collectives) {
      if (c.stream->ctx == ctx) return false;
    }
    *until_ns = ctx->last_end_ns.load(std::memory_order_acquire);
    return true;
  });
}

CUresult StreamSync(CUstream hstream) {
  DriverState& s = State();
  Stream* stream = nullptr;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult r = ResolveStream(s, hstream, &stream);
    if (r != CUDA_SUCCESS) return r;
    if (stream->capture != nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  uint64_t until = 0;
  if (!WaitForFrontEnd([&] {
        if (!StreamIdle(stream)) return false;
        until = stream->last_end_ns.load(std::memory_order_acquire);
        return true;
      })) {
    return CUDA_ERROR_LAUNCH_TIMEOUT;
  }
  SleepUntilNs(until);
  return CUDA_SUCCESS;
}

// The host range registered around [address, address + bytes), or false.
bool HostRegistered(DriverState& s, uint64_t address, size_t bytes) {
  auto it = s.host_registered.upper_bound(address);
  if (it == s.host_registered.begin()) return false;
  --it;
  return address >= it->first && address + bytes <= it->first + it->second;
}

CUresult StreamWaitValue32(CUstream hstream, CUdeviceptr address, uint32_t value,
                           unsigned int flags) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Stream* stream = nullptr;
  const CUresult r = ResolveStream(s, hstream, &stream);
  if (r != CUDA_SUCCESS) return r;
  const unsigned int op = flags & ~static_cast<unsigned int>(CU_STREAM_WAIT_VALUE_FLUSH);
  if (op > CU_STREAM_WAIT_VALUE_NOR || address % 4 != 0 || !HostRegistered(s, address, 4)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (stream->capture != nullptr) return CUDA_SUCCESS;  // memory-op nodes are not simulated
  ++s.stream_waits;
  QueuedWork w;
  w.type = QueuedWork::Type::kWait;
  w.word = reinterpret_cast<const std::atomic<uint32_t>*>(address);
  w.value = value;
  w.flags = flags;
  Submit(s, stream, w);
  return CUDA_SUCCESS;
}

CUresult StreamQuery(CUstream hstream) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Stream* stream = nullptr;
  const CUresult r = ResolveStream(s, hstream, &stream);
  if (r != CUDA_SUCCESS) return r;
  return StreamIdle(stream) && stream->last_end_ns.load(std::memory_order_acquire) <= NowNs()
             ? CUDA_SUCCESS
             : CUDA_ERROR_NOT_READY;
}

CUresult EventRecord(CUevent hevent, CUstream hstream) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Event* event = s.Find<Event>(hevent);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Stream* stream = nullptr;
  const CUresult r = ResolveStream(s, hstream, &stream);
  if (r != CUDA_SUCCESS) return r;
  if (stream->capture != nullptr) return CUDA_SUCCESS;  // event nodes are not simulated
  event->recorded = true;
  if (StreamIdle(stream)) {
    event->time_ns = std::max(NowNs(), stream->last_end_ns.load(std::memory_order_acquire));
    return CUDA_SUCCESS;
  }
  event->time_ns = kPendingNs;  // reached once the work queued before it is on the device
  QueuedWork w;
  w.type = QueuedWork::Type::kEventRecord;
  w.event = event;
  Submit(s, stream, w);
  return CUDA_SUCCESS;
}

// Allocates `bytes` of simulated device memory backed by lazily committed host memory, so
// that filling the simulated capacity costs no real memory until it is written.
CUresult Allocate(SimGpu* gpu, size_t bytes, AllocationKind kind, CUdeviceptr* out) {
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!gpu->TryReserveMemory(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    gpu->ReleaseMemory(bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  DriverState& s = State();
  Lock lock(s.mu);
  const auto address = reinterpret_cast<uint64_t>(mem);
  s.allocations[address] = Allocation{bytes, kind, gpu, nullptr};
  *out = address;
  return CUDA_SUCCESS;
}

CUresult AllocateInCurrentContext(size_t bytes, AllocationKind kind, CUdeviceptr* out) {
  SimGpu* gpu = nullptr;
  {
    DriverState& s = State();
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    Context* ctx = CurrentContext(s);
    if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    gpu = ctx->gpu;
  }
  return Allocate(gpu, bytes, kind, out);
}

CUresult AllocateOnStream(size_t bytes, CUstream hstream, AllocationKind kind, CUdeviceptr* out) {
  SimGpu* gpu = nullptr;
  {
    DriverState& s = State();
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    Stream* stream = nullptr;
    const CUresult r = ResolveStream(s, hstream, &stream);
    if (r != CUDA_SUCCESS) return r;
    gpu = stream->ctx->gpu;
  }
  return Allocate(gpu, bytes, kind, out);
}

CUresult Free(CUdeviceptr address) {
  DriverState& s = State();
  Allocation allocation;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (address == 0) return CUDA_SUCCESS;
    auto it = s.allocations.find(address);
    if (it == s.allocations.end() || it->second.kind == AllocationKind::kVmmMapped) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    allocation = it->second;
    s.allocations.erase(it);
  }
  munmap(reinterpret_cast<void*>(address), allocation.size);
  allocation.gpu->ReleaseMemory(allocation.size);
  return CUDA_SUCCESS;
}

// Synchronous copies wait for the context's queued kernels, as pageable copies on the legacy
// stream do, then move the bytes.
CUresult CopySync(uint64_t dst, Side dst_side, uint64_t src, Side src_side, size_t bytes) {
  DriverState& s = State();
  uint64_t until = 0;
  Context* drain = nullptr;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    Context* ctx = CurrentContext(s);
    if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0) return CUDA_SUCCESS;
    if (dst == 0 || src == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!RangeOk(s, dst, bytes, dst_side) || !RangeOk(s, src, bytes, src_side)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    drain = ctx;
  }
  if (!DrainContext(drain, &until)) return CUDA_ERROR_LAUNCH_TIMEOUT;
  SleepUntilNs(until);
  memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  return CUDA_SUCCESS;
}

// Async copies move the bytes at once (kernels of the double compute nothing, so ordering
// against them is invisible), or become memcpy nodes while the stream is captured.
CUresult CopyAsync(uint64_t dst, Side dst_side, uint64_t src, Side src_side, size_t bytes,
                   CUstream hstream) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Stream* stream = nullptr;
  const CUresult r = ResolveStream(s, hstream, &stream);
  if (r != CUDA_SUCCESS) return r;
  if (bytes == 0) return CUDA_SUCCESS;
  if (dst == 0 || src == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!RangeOk(s, dst, bytes, dst_side) || !RangeOk(s, src, bytes, src_side)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (stream->capture != nullptr) {
    auto* node = new GraphNode;
    node->type = CU_GRAPH_NODE_TYPE_MEMCPY;
    node->copy_dst = dst;
    node->copy_src = src;
    node->copy_bytes = bytes;
    stream->capture->nodes.push_back(node);
    return CUDA_SUCCESS;
  }
  memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  return CUDA_SUCCESS;
}

void FillElements(uint64_t dst, uint32_t value, uint32_t width, size_t count) {
  if (width == 1) {
    memset(reinterpret_cast<void*>(dst), static_cast<int>(value & 0xFF), count);
  } else {
    auto* out = reinterpret_cast<uint32_t*>(dst);
    std::fill(out, out + count, value);
  }
}

// Memsets (synchronous ones when stream is nullptr and `on_stream` false): performed at once,
// or recorded as a memset node while the stream is captured.
CUresult Memset(CUdeviceptr dst, uint32_t value, uint32_t width, size_t count, bool on_stream,
                CUstream hstream) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Stream* stream = nullptr;
  if (on_stream) {
    const CUresult r = ResolveStream(s, hstream, &stream);
    if (r != CUDA_SUCCESS) return r;
  } else if (CurrentContext(s) == nullptr) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (count == 0) return CUDA_SUCCESS;
  if (dst % width != 0 || count > SIZE_MAX / width || !DeviceRangeValid(s, dst, count * width)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (stream != nullptr && stream->capture != nullptr) {
    auto* node = new GraphNode;
    node->type = CU_GRAPH_NODE_TYPE_MEMSET;
    node->copy_dst = dst;
    node->copy_bytes = count * width;
    node->memset_value = value;
    node->memset_width = width;
    stream->capture->nodes.push_back(node);
    return CUDA_SUCCESS;
  }
  FillElements(dst, value, width, count);
  return CUDA_SUCCESS;
}

CUresult BeginCapture(CUstream hstream) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (hstream == nullptr || hstream == CU_STREAM_LEGACY || hstream == CU_STREAM_PER_THREAD) {
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot be captured
  }
  Stream* stream = s.Find<Stream>(hstream);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (stream->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  stream->capture = new Graph;
  stream->capture->ctx = stream->ctx;
  s.open_captures.insert(stream->capture);
  return CUDA_SUCCESS;
}

CUresult EndCapture(CUstream hstream, CUgraph* graph_out) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (graph_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* stream = s.Find<Stream>(hstream);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (stream->capture == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  s.open_captures.erase(stream->capture);
  if (stream->capture->invalidated) {
    for (GraphNode* node : stream->capture->nodes) delete node;
    delete stream->capture;
    stream->capture = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  Graph* graph = s.Add(stream->capture);
  for (GraphNode* node : graph->nodes) s.Add(node);
  stream->capture = nullptr;
  *graph_out = reinterpret_cast<CUgraph>(graph);
  return CUDA_SUCCESS;
}

CUresult IsCapturing(CUstream hstream, CUstreamCaptureStatus* status) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* stream = nullptr;
  const CUresult r = ResolveStream(s, hstream, &stream);
  if (r != CUDA_SUCCESS) return r;
  *status =
      stream->capture != nullptr ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult Instantiate(CUgraphExec* exec_out, CUgraph hgraph) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (exec_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* graph = s.Find<Graph>(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto* exec = s.Add(new GraphExec);
  exec->ctx = graph->ctx;
  for (const GraphNode* node : graph->nodes) exec->nodes.push_back(*node);
  *exec_out = reinterpret_cast<CUgraphExec>(exec);
  return CUDA_SUCCESS;
}

// A graph launch queues its kernels one after another on the stream, each as its own kernel
// on the shared device (so other processes' kernels may fall in between, as with real graphs
// under time-slicing), and performs its copies.
CUresult GraphLaunch(CUgraphExec hexec, CUstream hstream) {
  DriverState& s = State();
  Stream* stream = nullptr;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    GraphExec* exec = s.Find<GraphExec>(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const CUresult r = ResolveStream(s, hstream, &stream);
    if (r != CUDA_SUCCESS) return r;
    if (stream->capture != nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    for (const GraphNode& node : exec->nodes) {
      // Memory may have been freed since capture: check every time, never fault.
      if (node.type == CU_GRAPH_NODE_TYPE_MEMCPY) {
        const bool dst_ok = DeviceRangeValid(s, node.copy_dst, node.copy_bytes);
        const bool src_ok = DeviceRangeValid(s, node.copy_src, node.copy_bytes);
        if (!dst_ok && !src_ok) return CUDA_ERROR_INVALID_VALUE;
      } else if (node.type == CU_GRAPH_NODE_TYPE_MEMSET &&
                 !DeviceRangeValid(s, node.copy_dst, node.copy_bytes)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    for (const GraphNode& node : exec->nodes) {
      if (node.type == CU_GRAPH_NODE_TYPE_KERNEL) {
        QueuedWork w;
        w.duration_ns = node.duration_ns;
        if (node.func != nullptr && node.func->collective) {
          SetDefaultJobRank(SimPhysicalDevice(stream->ctx->device));
          w.collective = SimJob::Get() != nullptr;
          if (w.collective) w.seq = s.collective_seq++;
        }
        Submit(s, stream, w);
      } else if (node.type == CU_GRAPH_NODE_TYPE_MEMCPY) {
        memmove(reinterpret_cast<void*>(node.copy_dst),
                reinterpret_cast<const void*>(node.copy_src), node.copy_bytes);
      } else if (node.type == CU_GRAPH_NODE_TYPE_MEMSET) {
        FillElements(node.copy_dst, node.memset_value, node.memset_width,
                     node.copy_bytes / node.memset_width);
      }
    }
  }
  return CUDA_SUCCESS;
}

// Entry names of a PTX text (".entry name(" or ".entry name ("), in order.
std::vector<std::string> PtxEntries(const char* ptx) {
  std::vector<std::string> names;
  const char* p = ptx;
  while ((p = strstr(p, ".entry")) != nullptr) {
    p += 6;
    if (*p != ' ' && *p != '\t') continue;
    while (*p == ' ' || *p == '\t') ++p;
    const char* begin = p;
    while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
           *p == '_' || *p == '$') {
      ++p;
    }
    if (p > begin) names.emplace_back(begin, p);
  }
  return names;
}

CUresult LoadModule(CUmodule* module_out, const void* image) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (module_out == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = CurrentContext(s);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  uint32_t magic = 0;
  memcpy(&magic, image, sizeof(magic));
  const bool elf = magic == 0x464C457Fu;     // "\x7fELF": cubin
  const bool fatbin = magic == 0xBA55ED50u;  // fat binary header
  auto* module = new Module;
  module->ctx = ctx;
  if (!elf && !fatbin) {
    const char* text = static_cast<const char*>(image);
    if (strstr(text, ".version") == nullptr && strstr(text, ".entry") == nullptr) {
      delete module;
      return CUDA_ERROR_INVALID_IMAGE;
    }
    module->entries = PtxEntries(text);
    module->names_known = true;
  }
  s.Add(module);
  *module_out = reinterpret_cast<CUmodule>(module);
  return CUDA_SUCCESS;
}

CUresult DeviceUuid(CUuuid* uuid, CUdevice dev) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  // Stable across processes and runs, distinct per ordinal: "orion-sim" + ordinal.
  static constexpr char kPrefix[] = {'o', 'r', 'i', 'o', 'n', '-', 's', 'i', 'm'};
  memset(uuid->bytes, 0, sizeof(uuid->bytes));
  memcpy(uuid->bytes, kPrefix, sizeof(kPrefix));
  uuid->bytes[15] = static_cast<char>(SimPhysicalDevice(dev));
  return CUDA_SUCCESS;
}

int DeviceAttribute(CUdevice_attribute attribute, CUdevice dev) {
  // An H100 SXM-like device: what schedulers and the samples look at.
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      return 132;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      return 49152;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      return 232448;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
      return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      return 2048;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
      return 32;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      return 1980000;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      return 52428800;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      return 2;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return 0x18 + dev;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
      return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
      return 1;
    default:
      return 0;
  }
}

CUresult CtxCreate(CUcontext* ctx_out, CUdevice dev) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context* ctx = NewContext(s, dev, /*primary=*/false);
  current_ctx = ctx;  // a created context is pushed onto the calling thread
  *ctx_out = reinterpret_cast<CUcontext>(ctx);
  return CUDA_SUCCESS;
}

CUresult PrimaryCtxRelease(CUdevice dev) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context* ctx = s.primary[dev];
  if (ctx == nullptr || ctx->primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --ctx->primary_refs;  // the handle stays valid: a later retain returns the same one
  return CUDA_SUCCESS;
}

CUresult ElapsedTime(float* ms, CUevent hstart, CUevent hend) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Event* start = s.Find<Event>(hstart);
  Event* end = s.Find<Event>(hend);
  if (start == nullptr || end == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!start->recorded || !end->recorded) return CUDA_ERROR_INVALID_HANDLE;
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  const uint64_t now = NowNs();
  if (start->time_ns > now || end->time_ns > now) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>(
      (static_cast<double>(end->time_ns) - static_cast<double>(start->time_ns)) / 1e6);
  return CUDA_SUCCESS;
}

CUresult GraphInstantiateLegacy(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node,
                                char* log, size_t log_size) {
  if (error_node != nullptr) *error_node = nullptr;
  if (log != nullptr && log_size > 0) log[0] = '\0';
  return Instantiate(exec, graph);
}

// Creates a handle of T in the current context after checking the descriptor's sizes.
template <typename T, typename Handle>
CUresult CreateArray(Handle* handle, bool valid) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr || !valid) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = CurrentContext(s);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto* array = s.Add(new T);
  array->ctx = ctx;
  *handle = reinterpret_cast<Handle>(array);
  return CUDA_SUCCESS;
}

template <typename T>
CUresult DestroyArray(const void* handle) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  T* array = s.Find<T>(handle);
  if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  s.Remove(array);
  delete array;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace orion::cuda_double

using orion::cuda_double::AllocationKind;
using orion::cuda_double::Context;
using orion::cuda_double::current_ctx;
using orion::cuda_double::CurrentContext;
using orion::cuda_double::DriverState;
using orion::cuda_double::Event;
using orion::cuda_double::Function;
using orion::cuda_double::Graph;
using orion::cuda_double::GraphExec;
using orion::cuda_double::GraphNode;
using orion::cuda_double::Initialized;
using orion::cuda_double::Lock;
using orion::cuda_double::MemPool;
using orion::cuda_double::Module;
using orion::cuda_double::SimGpu;
using orion::cuda_double::State;
using orion::cuda_double::Stream;
using orion::cuda_double::ValidDevice;
using orion::cuda_double::VmmHandle;

extern "C" {

// ---- Initialisation and devices ------------------------------------------------------------

CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (const char* forced = getenv("ORION_SIM_INIT_ERROR"); forced != nullptr && *forced) {
    return static_cast<CUresult>(atoi(forced));
  }
  if (orion::cuda_double::SimDeviceCount() == 0) return CUDA_ERROR_NO_DEVICE;
  DriverState& s = State();
  Lock lock(s.mu);
  s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = orion::cuda_double::kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = orion::cuda_double::SimDeviceCount();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, static_cast<size_t>(len), "Orion Simulated GPU (H100-like)");
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return orion::cuda_double::DeviceUuid(uuid, dev);
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  return orion::cuda_double::DeviceUuid(uuid, dev);
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = SimGpu::Get(dev)->capacity();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice dev) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (value == nullptr || attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *value = orion::cuda_double::DeviceAttribute(attribute, dev);
  return CUDA_SUCCESS;
}

// ---- Contexts ------------------------------------------------------------------------------

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (s.primary[dev] == nullptr) {
    s.primary[dev] = orion::cuda_double::NewContext(s, dev, /*primary=*/true);
  }
  ++s.primary[dev]->primary_refs;
  *pctx = reinterpret_cast<CUcontext>(s.primary[dev]);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  return orion::cuda_double::PrimaryCtxRelease(dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return orion::cuda_double::PrimaryCtxRelease(dev);
}

CUresult CUDAAPI cuCtxCreate(CUcontext* pctx, unsigned int /*flags*/, CUdevice dev) {
  return orion::cuda_double::CtxCreate(pctx, dev);
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int /*flags*/, CUdevice dev) {
  return orion::cuda_double::CtxCreate(pctx, dev);
}

CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* /*params*/,
                                int /*num_params*/, unsigned int /*flags*/, CUdevice dev) {
  return orion::cuda_double::CtxCreate(pctx, dev);
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* /*params*/,
                                unsigned int /*flags*/, CUdevice dev) {
  return orion::cuda_double::CtxCreate(pctx, dev);
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext hctx) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Context* ctx = s.Find<Context>(hctx);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;  // primary contexts are released
  s.Remove(ctx);
  if (current_ctx == ctx) current_ctx = nullptr;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext hctx) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (hctx == nullptr) {
    current_ctx = nullptr;
    return CUDA_SUCCESS;
  }
  Context* ctx = s.Find<Context>(hctx);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  current_ctx = ctx;
  return CUDA_SUCCESS;
}

// The context stack of this thread below the current context (push/pop), bounded like a
// driver's would be.
thread_local std::vector<Context*> pushed_ctx;

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext hctx) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Context* ctx = s.Find<Context>(hctx);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (pushed_ctx.size() >= 64) return CUDA_ERROR_OUT_OF_MEMORY;
  pushed_ctx.push_back(current_ctx);
  current_ctx = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (current_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(current_ctx);
  current_ctx = pushed_ctx.empty() ? nullptr : pushed_ctx.back();
  if (!pushed_ctx.empty()) pushed_ctx.pop_back();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  DriverState& s = State();
  Lock lock(s.mu);
  ++s.context_queries;
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(CurrentContext(s));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetId(CUcontext hctx, unsigned long long* id) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = hctx == nullptr ? CurrentContext(s) : s.Find<Context>(hctx);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *id = ctx->id;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = CurrentContext(s);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  DriverState& s = State();
  uint64_t until = 0;
  Context* ctx = nullptr;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    ctx = CurrentContext(s);
    if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (!orion::cuda_double::DrainContext(ctx, &until)) return CUDA_ERROR_LAUNCH_TIMEOUT;
  orion::cuda_double::SleepUntilNs(until);
  return CUDA_SUCCESS;
}

// ---- Modules and functions -----------------------------------------------------------------

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  return orion::cuda_double::LoadModule(module, image);
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image,
                                    unsigned int /*num_options*/, CUjit_option* /*options*/,
                                    void** /*option_values*/) {
  return orion::cuda_double::LoadModule(module, image);
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Module* module = s.Find<Module>(hmod);
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  for (Function* f : module->functions) {
    if (f->name == name) {
      *hfunc = reinterpret_cast<CUfunction>(f);
      return CUDA_SUCCESS;
    }
  }
  if (module->names_known &&
      std::find(module->entries.begin(), module->entries.end(), name) == module->entries.end()) {
    return CUDA_ERROR_NOT_FOUND;
  }
  auto* f = s.Add(new Function);
  f->module = module;
  f->name = name;
  // orion_spin, also renamed with a prefix (a sample's kernel named like a collective).
  f->spin = f->name.size() >= 10 && f->name.compare(f->name.size() - 10, 10, "orion_spin") == 0;
  f->collective = f->spin && orion::contract::IsCommunicationKernelName(name);
  module->functions.push_back(f);
  *hfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Module* module = s.Find<Module>(hmod);
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  for (Function* f : module->functions) s.Remove(f);
  s.Remove(module);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Function* f = s.Find<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = f->name.c_str();  // lives as long as the process: functions are never freed
  return CUDA_SUCCESS;
}

// ---- Launches ------------------------------------------------------------------------------

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz,
                                unsigned int /*shared_mem*/, CUstream stream, void** params,
                                void** extra) {
  return orion::cuda_double::Launch(f, gx, gy, gz, bx, by, bz, stream, params, extra);
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                     unsigned int gz, unsigned int bx, unsigned int by,
                                     unsigned int bz, unsigned int /*shared_mem*/, CUstream stream,
                                     void** params, void** extra) {
  return orion::cuda_double::Launch(f, gx, gy, gz, bx, by, bz, stream, params, extra);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                  void** extra) {
  return orion::cuda_double::LaunchEx(config, f, params, extra);
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                                       void** extra) {
  return orion::cuda_double::LaunchEx(config, f, params, extra);
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                           unsigned int gz, unsigned int bx, unsigned int by,
                                           unsigned int bz, unsigned int /*shared_mem*/,
                                           CUstream stream, void** params) {
  return orion::cuda_double::Launch(f, gx, gy, gz, bx, by, bz, stream, params, nullptr);
}

CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                                unsigned int gz, unsigned int bx, unsigned int by,
                                                unsigned int bz, unsigned int /*shared_mem*/,
                                                CUstream stream, void** params) {
  return orion::cuda_double::Launch(f, gx, gy, gz, bx, by, bz, stream, params, nullptr);
}

// ---- Streams and events --------------------------------------------------------------------

CUresult CUDAAPI cuStreamCreate(CUstream* phstream, unsigned int flags) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (phstream == nullptr || (flags & ~static_cast<unsigned int>(CU_STREAM_NON_BLOCKING))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Context* ctx = CurrentContext(s);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto* stream = s.Add(new Stream);
  stream->ctx = ctx;
  stream->flags = flags;
  *phstream = reinterpret_cast<CUstream>(stream);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hstream) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Stream* stream = s.Find<Stream>(hstream);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  s.Remove(stream);  // queued work still completes on the simulated device
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytes, unsigned int flags) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (p == nullptr || bytes == 0 || (flags & ~0xFu) != 0) return CUDA_ERROR_INVALID_VALUE;
  // Unsafe while a capture is open (captures here are global mode, as the probes begin them):
  // the call is refused and the capture invalidated, as the real driver does.
  if (!s.open_captures.empty()) {
    for (Graph* capture : s.open_captures) capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  const uint64_t base = reinterpret_cast<uint64_t>(p);
  auto next = s.host_registered.lower_bound(base);
  if ((next != s.host_registered.end() && next->first < base + bytes) ||
      orion::cuda_double::HostRegistered(s, base, 1)) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  s.host_registered[base] = bytes;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return s.host_registered.erase(reinterpret_cast<uint64_t>(p)) == 1
             ? CUDA_SUCCESS
             : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned int flags) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!orion::cuda_double::HostRegistered(s, reinterpret_cast<uint64_t>(p), 1)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *dptr = reinterpret_cast<CUdeviceptr>(p);  // one address space, as with unified addressing
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr address, cuuint32_t value,
                                        unsigned int flags) {
  return orion::cuda_double::StreamWaitValue32(stream, address, value, flags);
}

CUresult CUDAAPI cuStreamWaitValue32_v2_ptsz(CUstream stream, CUdeviceptr address,
                                             cuuint32_t value, unsigned int flags) {
  return orion::cuda_double::StreamWaitValue32(stream, address, value, flags);
}

// Not a driver entry point: the stream waits this process queued (tests read it by dlsym).
uint64_t orion_double_stream_waits() {
  DriverState& s = State();
  Lock lock(s.mu);
  return s.stream_waits;
}

// Not a driver entry point: the collectives of this process that gave up waiting for their peer
// (sim_job.h; tests read it by dlsym).
uint64_t orion_double_collective_timeouts() {
  DriverState& s = State();
  Lock lock(s.mu);
  return s.collective_timeouts;
}

// Not a driver entry point: the cuCtxGetCurrent calls of this process (tests read it by dlsym).
uint64_t orion_double_context_queries() {
  DriverState& s = State();
  Lock lock(s.mu);
  return s.context_queries;
}

// Not a driver entry point: the kernels this process launched to run (tests read it by dlsym).
uint64_t orion_double_kernel_launches() {
  DriverState& s = State();
  Lock lock(s.mu);
  return s.kernel_launches;
}

// Not a driver entry point: when the process's kernel launch `index` (0 the first; captured ones
// not counted) entered the driver, CLOCK_MONOTONIC; 0 past the first kMaxLaunchEntries.
uint64_t orion_double_launch_entered_ns(uint64_t index) {
  DriverState& s = State();
  Lock lock(s.mu);
  return index < s.kernel_launches && index < DriverState::kMaxLaunchEntries
             ? s.launch_entered_ns[index]
             : 0;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hstream) {
  return orion::cuda_double::StreamSync(hstream);
}

CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hstream) {
  return orion::cuda_double::StreamSync(hstream);
}

CUresult CUDAAPI cuStreamQuery(CUstream hstream) {
  return orion::cuda_double::StreamQuery(hstream);
}

CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hstream) {
  return orion::cuda_double::StreamQuery(hstream);
}

CUresult CUDAAPI cuEventCreate(CUevent* phevent, unsigned int flags) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (phevent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = CurrentContext(s);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto* event = s.Add(new Event);
  event->ctx = ctx;
  event->flags = flags;
  *phevent = reinterpret_cast<CUevent>(event);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hevent, CUstream hstream) {
  return orion::cuda_double::EventRecord(hevent, hstream);
}

CUresult CUDAAPI cuEventRecord_ptsz(CUevent hevent, CUstream hstream) {
  return orion::cuda_double::EventRecord(hevent, hstream);
}

CUresult CUDAAPI cuEventQuery(CUevent hevent) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Event* event = s.Find<Event>(hevent);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!event->recorded) return CUDA_SUCCESS;  // as the driver: nothing to wait for
  return event->time_ns <= orion::cuda_double::NowNs() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hevent) {
  DriverState& s = State();
  uint64_t until = 0;
  Event* event = nullptr;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    event = s.Find<Event>(hevent);
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  // A record still queued behind a wait or a collective: until the front end has placed it.
  if (!orion::cuda_double::WaitForFrontEnd([&] {
        until = event->recorded ? event->time_ns : 0;
        return until != orion::cuda_double::kPendingNs;
      })) {
    return CUDA_ERROR_LAUNCH_TIMEOUT;
  }
  orion::cuda_double::SleepUntilNs(until);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent hstart, CUevent hend) {
  return orion::cuda_double::ElapsedTime(ms, hstart, hend);
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent hstart, CUevent hend) {
  return orion::cuda_double::ElapsedTime(ms, hstart, hend);
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hevent) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Event* event = s.Find<Event>(hevent);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  s.Remove(event);
  return CUDA_SUCCESS;
}

// ---- Memory --------------------------------------------------------------------------------

CUresult CUDAAPI cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  return orion::cuda_double::CreateArray<orion::cuda_double::Array>(
      handle, desc != nullptr && desc->Width != 0 && desc->NumChannels != 0);
}

CUresult CUDAAPI cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  return orion::cuda_double::CreateArray<orion::cuda_double::Array>(
      handle, desc != nullptr && desc->Width != 0 && desc->NumChannels != 0);
}

CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* handle,
                                        const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned int levels) {
  return orion::cuda_double::CreateArray<orion::cuda_double::MipmappedArray>(
      handle, desc != nullptr && desc->Width != 0 && desc->NumChannels != 0 && levels != 0);
}

CUresult CUDAAPI cuArrayDestroy(CUarray handle) {
  return orion::cuda_double::DestroyArray<orion::cuda_double::Array>(handle);
}

CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  return orion::cuda_double::DestroyArray<orion::cuda_double::MipmappedArray>(handle);
}

CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Context* ctx = orion::cuda_double::CurrentContext(s);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (limit != CU_LIMIT_MALLOC_HEAP_SIZE) return CUDA_SUCCESS;  // other limits: accepted, unused
  ctx->malloc_heap_bytes = value;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetLimit(size_t* value, CUlimit limit) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  Context* ctx = orion::cuda_double::CurrentContext(s);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *value = limit == CU_LIMIT_MALLOC_HEAP_SIZE ? ctx->malloc_heap_bytes : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  return orion::cuda_double::AllocateInCurrentContext(bytes, AllocationKind::kDevice, dptr);
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                    unsigned int element_bytes) {
  if (pitch == nullptr || width == 0 || height == 0 ||
      (element_bytes != 4 && element_bytes != 8 && element_bytes != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t aligned = (width + orion::cuda_double::kPitchAlignment - 1) /
                         orion::cuda_double::kPitchAlignment * orion::cuda_double::kPitchAlignment;
  if (aligned > SIZE_MAX / height) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r =
      orion::cuda_double::AllocateInCurrentContext(aligned * height, AllocationKind::kPitch, dptr);
  if (r == CUDA_SUCCESS) *pitch = aligned;
  return r;
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int /*flags*/) {
  return orion::cuda_double::AllocateInCurrentContext(bytes, AllocationKind::kManaged, dptr);
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) { return orion::cuda_double::Free(dptr); }

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  SimGpu* gpu = nullptr;
  {
    DriverState& s = State();
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Context* ctx = CurrentContext(s);
    if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    gpu = ctx->gpu;
  }
  const uint64_t used = gpu->MemoryInUse();
  *total_bytes = gpu->capacity();
  *free_bytes = used >= gpu->capacity() ? 0 : gpu->capacity() - used;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return orion::cuda_double::AllocateOnStream(bytes, stream, AllocationKind::kAsync, dptr);
}

CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return orion::cuda_double::AllocateOnStream(bytes, stream, AllocationKind::kAsync, dptr);
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream /*stream*/) {
  return orion::cuda_double::Free(dptr);
}

CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream /*stream*/) {
  return orion::cuda_double::Free(dptr);
}

static CUresult AllocFromPool(CUdeviceptr* dptr, size_t bytes, CUmemoryPool hpool,
                              CUstream hstream) {
  SimGpu* gpu = nullptr;
  {
    DriverState& s = State();
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    MemPool* pool = s.Find<MemPool>(hpool);
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Stream* stream = nullptr;
    const CUresult r = orion::cuda_double::ResolveStream(s, hstream, &stream);
    if (r != CUDA_SUCCESS) return r;
    gpu = SimGpu::Get(pool->device);
  }
  return orion::cuda_double::Allocate(gpu, bytes, AllocationKind::kPool, dptr);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                         CUstream stream) {
  return AllocFromPool(dptr, bytes, pool, stream);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                              CUstream stream) {
  return AllocFromPool(dptr, bytes, pool, stream);
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (pool == nullptr || props == nullptr || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(props->location.id)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* created = s.Add(new MemPool);
  created->device = props->location.id;
  *pool = reinterpret_cast<CUmemoryPool>(created);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool hpool) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  MemPool* pool = s.Find<MemPool>(hpool);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  s.Remove(pool);
  return CUDA_SUCCESS;
}

// ---- Virtual memory management -------------------------------------------------------------

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags /*option*/) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *granularity = orion::cuda_double::kVmmGranularity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                     CUdeviceptr /*addr*/, unsigned long long /*flags*/) {
  using orion::cuda_double::kVmmGranularity;
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (ptr == nullptr || size == 0 || size % kVmmGranularity != 0 ||
      (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (alignment < kVmmGranularity) alignment = kVmmGranularity;
  // Over-reserve and trim so the range is aligned like the driver's.
  const size_t span = size + alignment;
  void* mem = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto raw = reinterpret_cast<uint64_t>(mem);
  const uint64_t start = (raw + alignment - 1) / alignment * alignment;
  if (start > raw) munmap(mem, start - raw);
  if (raw + span > start + size) {
    munmap(reinterpret_cast<void*>(start + size), raw + span - (start + size));
  }
  DriverState& s = State();
  Lock lock(s.mu);
  s.reservations[start] = size;
  *ptr = start;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto mapped = s.allocations.lower_bound(ptr);
  if (mapped != s.allocations.end() && mapped->first < ptr + size) {
    return CUDA_ERROR_INVALID_VALUE;  // still mapped: unmap first, as the driver requires
  }
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                             const CUmemAllocationProp* prop, unsigned long long /*flags*/) {
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr || prop == nullptr || size == 0 ||
      size % orion::cuda_double::kVmmGranularity != 0 ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidDevice(prop->location.id)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  SimGpu* gpu = SimGpu::Get(prop->location.id);
  if (!gpu->TryReserveMemory(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  const int fd = memfd_create("orion-sim-vmm", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    gpu->ReleaseMemory(size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  DriverState& s = State();
  Lock lock(s.mu);
  auto* vmm = s.Add(new VmmHandle);
  vmm->gpu = gpu;
  vmm->size = size;
  vmm->fd = fd;
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(vmm);
  return CUDA_SUCCESS;
}

static void DropPhysicalIfUnused(VmmHandle* vmm) {
  if (vmm->released && vmm->mappings == 0 && vmm->fd >= 0) {
    close(vmm->fd);
    vmm->fd = -1;
    if (!vmm->imported) vmm->gpu->ReleaseMemory(vmm->size);
  }
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  VmmHandle* vmm = s.Find<VmmHandle>(reinterpret_cast<const void*>(handle));
  if (vmm == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (--vmm->references > 0) return CUDA_SUCCESS;  // a retained reference is left
  s.Remove(vmm);
  vmm->released = true;  // the memory lives on while it is mapped, as with the driver
  DropPhysicalIfUnused(vmm);
  return CUDA_SUCCESS;
}

// ---- Memory shared between processes ----
// The double's IPC handle carries the exported allocation's size; opening it gives a fresh
// simulated allocation of that size (what the importer's accounting needs, not shared bytes).
// A shareable VMM handle is the memfd behind it (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  auto it = s.allocations.upper_bound(dptr);
  if (it == s.allocations.begin()) return CUDA_ERROR_NOT_FOUND;
  --it;
  if (dptr - it->first >= it->second.size) return CUDA_ERROR_NOT_FOUND;
  if (base != nullptr) *base = it->first;
  if (size != nullptr) *size = it->second.size;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  size_t size = 0;
  CUdeviceptr base = 0;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = cuMemGetAddressRange_v2(&base, &size, dptr);
  if (r != CUDA_SUCCESS || base != dptr) return CUDA_ERROR_INVALID_VALUE;
  memset(handle, 0, sizeof(*handle));
  memcpy(handle->reserved, &size, sizeof(size));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle,
                                       unsigned int /*flags*/) {
  size_t size = 0;
  memcpy(&size, handle.reserved, sizeof(size));
  if (dptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  return orion::cuda_double::AllocateInCurrentContext(size, AllocationKind::kDevice, dptr);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) { return orion::cuda_double::Free(dptr); }

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType type,
                                              unsigned long long /*flags*/) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  VmmHandle* vmm = s.Find<VmmHandle>(reinterpret_cast<const void*>(handle));
  if (vmm == nullptr || shareable == nullptr ||
      type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = dup(vmm->fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                void* shareable, CUmemAllocationHandleType type) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = dup(static_cast<int>(reinterpret_cast<intptr_t>(shareable)));
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* vmm = s.Add(new VmmHandle);
  vmm->gpu = SimGpu::Get(0);
  vmm->size = static_cast<size_t>(st.st_size);
  vmm->fd = fd;
  vmm->imported = true;  // the exporter's capacity holds the bytes
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(vmm);
  return CUDA_SUCCESS;
}

// The handle of the allocation mapped at `addr`, one more reference to it (released with
// cuMemRelease like the one cuMemCreate gave).
CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.allocations.find(reinterpret_cast<CUdeviceptr>(addr));
  if (it == s.allocations.end() || it->second.kind != AllocationKind::kVmmMapped) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  VmmHandle* vmm = it->second.vmm;
  if (vmm->references++ == 0) {  // released while mapped: a handle again
    s.Add(vmm);
    vmm->released = false;
  }
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(vmm);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long /*flags*/) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  VmmHandle* vmm = s.Find<VmmHandle>(reinterpret_cast<const void*>(handle));
  if (vmm == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (size == 0 || offset > vmm->size || size > vmm->size - offset ||
      ptr % orion::cuda_double::kVmmGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto reservation = s.reservations.upper_bound(ptr);
  if (reservation == s.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --reservation;
  if (ptr + size > reservation->first + reservation->second) return CUDA_ERROR_INVALID_VALUE;
  auto next = s.allocations.lower_bound(ptr);
  if (next != s.allocations.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != s.allocations.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
  }
  void* mem = mmap(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, vmm->fd, static_cast<off_t>(offset));
  if (mem == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  s.allocations[ptr] =
      orion::cuda_double::Allocation{size, AllocationKind::kVmmMapped, nullptr, vmm};
  ++vmm->mappings;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  auto it = s.allocations.find(ptr);
  if (it == s.allocations.end() || it->second.kind != AllocationKind::kVmmMapped) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The range may cover several adjacent mappings; all of it must be mapped.
  uint64_t cursor = ptr;
  for (auto scan = it; cursor < ptr + size; ++scan) {
    if (scan == s.allocations.end() || scan->first != cursor ||
        scan->second.kind != AllocationKind::kVmmMapped) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    cursor += scan->second.size;
  }
  if (cursor != ptr + size) return CUDA_ERROR_INVALID_VALUE;
  while (it != s.allocations.end() && it->first < ptr + size) {
    // Back to an inaccessible reservation, keeping the address range ours.
    mmap(reinterpret_cast<void*>(it->first), it->second.size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    VmmHandle* vmm = it->second.vmm;
    --vmm->mappings;
    DropPhysicalIfUnused(vmm);
    it = s.allocations.erase(it);
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                size_t count) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t cursor = ptr;
  for (auto it = s.allocations.find(ptr); cursor < ptr + size; ++it) {
    if (it == s.allocations.end() || it->first != cursor ||
        it->second.kind != AllocationKind::kVmmMapped) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    cursor += it->second.size;
  }
  return CUDA_SUCCESS;  // mappings are readable and writable from the start
}

// ---- Copies and memsets --------------------------------------------------------------------

#define ORION_DOUBLE_HOST(p) reinterpret_cast<uint64_t>(p)
using orion::cuda_double::CopyAsync;
using orion::cuda_double::CopySync;
using orion::cuda_double::Memset;
using orion::cuda_double::Side;

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return CopySync(dst, Side::kUnified, src, Side::kUnified, bytes);
}
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return cuMemcpy(dst, src, bytes);
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream st) {
  return CopyAsync(dst, Side::kUnified, src, Side::kUnified, bytes, st);
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream st) {
  return cuMemcpyAsync(dst, src, bytes, st);
}

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  return CopySync(dst, Side::kDevice, ORION_DOUBLE_HOST(src), Side::kHost, bytes);
}
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t bytes) {
  return cuMemcpyHtoD_v2(dst, src, bytes);
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  return CopySync(ORION_DOUBLE_HOST(dst), Side::kHost, src, Side::kDevice, bytes);
}
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t bytes) {
  return cuMemcpyDtoH_v2(dst, src, bytes);
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return CopySync(dst, Side::kDevice, src, Side::kDevice, bytes);
}
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return cuMemcpyDtoD_v2(dst, src, bytes);
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream st) {
  return CopyAsync(dst, Side::kDevice, ORION_DOUBLE_HOST(src), Side::kHost, bytes, st);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t bytes,
                                           CUstream st) {
  return cuMemcpyHtoDAsync_v2(dst, src, bytes, st);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream st) {
  return CopyAsync(ORION_DOUBLE_HOST(dst), Side::kHost, src, Side::kDevice, bytes, st);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t bytes, CUstream st) {
  return cuMemcpyDtoHAsync_v2(dst, src, bytes, st);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream st) {
  return CopyAsync(dst, Side::kDevice, src, Side::kDevice, bytes, st);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                           CUstream st) {
  return cuMemcpyDtoDAsync_v2(dst, src, bytes, st);
}
#undef ORION_DOUBLE_HOST

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  return Memset(dst, value, 1, count, false, nullptr);
}
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t count) {
  return cuMemsetD8_v2(dst, value, count);
}
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count) {
  return Memset(dst, value, 4, count, false, nullptr);
}
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t count) {
  return cuMemsetD32_v2(dst, value, count);
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream st) {
  return Memset(dst, value, 1, count, true, st);
}
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t count,
                                      CUstream st) {
  return cuMemsetD8Async(dst, value, count, st);
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream st) {
  return Memset(dst, value, 4, count, true, st);
}
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t count,
                                       CUstream st) {
  return cuMemsetD32Async(dst, value, count, st);
}

// ---- Stream capture and graphs -------------------------------------------------------------

CUresult CUDAAPI cuStreamBeginCapture(CUstream stream) {
  return orion::cuda_double::BeginCapture(stream);
}

CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream stream) {
  return orion::cuda_double::BeginCapture(stream);
}

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode /*mode*/) {
  return orion::cuda_double::BeginCapture(stream);
}

CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode /*mode*/) {
  return orion::cuda_double::BeginCapture(stream);
}

CUresult CUDAAPI cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return orion::cuda_double::EndCapture(stream, graph);
}

CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return orion::cuda_double::EndCapture(stream, graph);
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  return orion::cuda_double::IsCapturing(stream, status);
}

CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus* status) {
  return orion::cuda_double::IsCapturing(stream, status);
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                             unsigned long long /*flags*/) {
  return orion::cuda_double::Instantiate(exec, graph);
}

CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node,
                                    char* log, size_t log_size) {
  return orion::cuda_double::GraphInstantiateLegacy(exec, graph, error_node, log, log_size);
}

CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node,
                                       char* log, size_t log_size) {
  return orion::cuda_double::GraphInstantiateLegacy(exec, graph, error_node, log, log_size);
}

CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = orion::cuda_double::Instantiate(exec, graph);
  params->hErrNode_out = nullptr;
  params->result_out =
      r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return cuGraphInstantiateWithParams(exec, graph, params);
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return orion::cuda_double::GraphLaunch(exec, stream);
}

CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return orion::cuda_double::GraphLaunch(exec, stream);
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hgraph, CUgraphNode* nodes, size_t* num_nodes) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (num_nodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* graph = s.Find<Graph>(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (nodes != nullptr) {
    const size_t n = std::min(*num_nodes, graph->nodes.size());
    for (size_t i = 0; i < n; ++i) nodes[i] = reinterpret_cast<CUgraphNode>(graph->nodes[i]);
    for (size_t i = n; i < *num_nodes; ++i) nodes[i] = nullptr;
  }
  *num_nodes = graph->nodes.size();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hnode, CUgraphNodeType* type) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GraphNode* node = s.Find<GraphNode>(hnode);
  if (node == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *type = node->type;
  return CUDA_SUCCESS;
}

// Captured graphs of the double hold no child-graph nodes.
CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hnode, CUgraph* graph) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GraphNode* node = s.Find<GraphNode>(hnode);
  if (node == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hexec) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  GraphExec* exec = s.Find<GraphExec>(hexec);
  if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  s.Remove(exec);
  return CUDA_SUCCESS;
}

// A graph's allocations freed inside it (a free node) go with the graph; those it leaves
// allocated stay until cuMemFree / cuMemFreeAsync, as on a real driver after a launch.
CUresult CUDAAPI cuGraphDestroy(CUgraph hgraph) {
  DriverState& s = State();
  std::vector<uint64_t> freed;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    Graph* graph = s.Find<Graph>(hgraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    for (GraphNode* node : graph->nodes) {
      if (node->type == CU_GRAPH_NODE_TYPE_MEM_FREE) freed.push_back(node->mem_dptr);
      s.Remove(node);
    }
    s.Remove(graph);
  }
  for (uint64_t dptr : freed) orion::cuda_double::Free(dptr);
  return CUDA_SUCCESS;
}

// Graphs built by hand: memory allocation and free nodes only (kernels come from capture).
CUresult CUDAAPI cuGraphCreate(CUgraph* out, unsigned int /*flags*/) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = CurrentContext(s);
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto* graph = s.Add(new Graph);
  graph->ctx = ctx;
  *out = reinterpret_cast<CUgraph>(graph);
  return CUDA_SUCCESS;
}

// The allocation's address is fixed when the node is added (as on a real driver); the simulated
// GPU's memory is taken then too, the earliest a real one could need it.
// (Called by the generic form too: not through the exported symbol, which a preloaded
// interposer replaces.)
static CUresult AddMemAllocNode(CUgraphNode* out, CUgraph hgraph,
                                CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  DriverState& s = State();
  SimGpu* gpu = nullptr;
  {
    Lock lock(s.mu);
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (out == nullptr || params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Graph* graph = s.Find<Graph>(hgraph);
    if (graph == nullptr || graph->ctx == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    gpu = graph->ctx->gpu;
  }
  CUdeviceptr dptr = 0;
  const CUresult r = orion::cuda_double::Allocate(gpu, params->bytesize,
                                                  orion::cuda_double::AllocationKind::kAsync,
                                                  &dptr);
  if (r != CUDA_SUCCESS) return r;
  Lock lock(s.mu);
  Graph* graph = s.Find<Graph>(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto* node = s.Add(new GraphNode);
  node->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  node->mem_dptr = dptr;
  node->mem_bytes = params->bytesize;
  graph->nodes.push_back(node);
  params->dptr = dptr;
  *out = reinterpret_cast<CUgraphNode>(node);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph hgraph,
                                        const CUgraphNode* /*deps*/, size_t /*count*/,
                                        CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  return AddMemAllocNode(out, hgraph, params);
}

// The generic form (v1 and v2 symbols), for memory-allocation nodes only (what the
// interposer's quota cares about).
static CUresult AddGenericNode(CUgraphNode* out, CUgraph hgraph, CUgraphNodeParams* params) {
  if (params == nullptr || params->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};
  alloc.poolProps = params->alloc.poolProps;
  alloc.bytesize = params->alloc.bytesize;
  const CUresult r = AddMemAllocNode(out, hgraph, &alloc);
  if (r == CUDA_SUCCESS) params->alloc.dptr = alloc.dptr;
  return r;
}

CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* /*deps*/,
                                   const CUgraphEdgeData* /*edges*/, size_t /*count*/,
                                   CUgraphNodeParams* params) {
  return AddGenericNode(out, hgraph, params);
}

// The CUDA 12.0-12.2 ABI symbol, which cuda.h now renames to the _v2 form.
#undef cuGraphAddNode
extern "C" CUresult CUDAAPI cuGraphAddNode(CUgraphNode* out, CUgraph hgraph,
                                           const CUgraphNode* deps, size_t count,
                                           CUgraphNodeParams* params);
CUresult CUDAAPI cuGraphAddNode(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* /*deps*/,
                                size_t /*count*/, CUgraphNodeParams* params) {
  return AddGenericNode(out, hgraph, params);
}

CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph hgraph,
                                       const CUgraphNode* /*deps*/, size_t /*count*/,
                                       CUdeviceptr dptr) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* graph = s.Find<Graph>(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto* node = s.Add(new GraphNode);
  node->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  node->mem_dptr = dptr;
  graph->nodes.push_back(node);
  *out = reinterpret_cast<CUgraphNode>(node);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode hnode, CUdeviceptr* dptr_out) {
  DriverState& s = State();
  Lock lock(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GraphNode* node = s.Find<GraphNode>(hnode);
  if (node == nullptr || node->type != CU_GRAPH_NODE_TYPE_MEM_FREE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *dptr_out = node->mem_dptr;
  return CUDA_SUCCESS;
}

}  // extern "C"
