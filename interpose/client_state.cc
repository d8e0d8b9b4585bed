// Registration with orion-server over its Unix socket, mapping of the board and areas it
// hands over, fork handling.
#include "interpose/glibc_compat.h"

#include "interpose/client_state.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "interpose/call_log.h"
#include "interpose/cpu_limits.h"
#include "interpose/hooks_blas.h"
#include "interpose/memory_quota.h"
#include "interpose/completion_tracker.h"
#include "interpose/nvtx_ranges.h"
#include "interpose/real_driver.h"
#include "interpose/tables.h"
#include "interpose/timing_log.h"
#include "interpose/version_pin.h"

extern "C" char* program_invocation_short_name;

namespace orion::interpose {

constinit ProcessState g_process;
constinit thread_local ThreadLaunch t_launch ORION_INITIAL_EXEC_TLS;

namespace {

enum RegistrationState : uint32_t { kUnregistered = 0, kActive = 1, kFailed = 2 };

pthread_once_t g_process_once = PTHREAD_ONCE_INIT;
pthread_mutex_t g_register_mutex = PTHREAD_MUTEX_INITIALIZER;
std::atomic<uint32_t> g_note_printed{0};

std::atomic<uint32_t> g_state[kMaxDevices];
// Per device: the registrations it has had (the first, then one per renewal after a server
// restart) and the index of the live one. Old ones stay valid: records in flight point at them.
Registration g_registrations[kMaxDevices][kMaxRenewals + 1];
std::atomic<uint32_t> g_live[kMaxDevices];
uint64_t g_last_renewal_ns[kMaxDevices];  // under g_register_mutex

void Note(const char* what) {
  if (g_process.config.quiet || g_note_printed.exchange(1) != 0) return;
  WriteStderrLine("orion: %s; passing CUDA calls through unchanged\n", what);
}

void FailOpen(const char* what) {
  g_process.pass_through.store(1, std::memory_order_release);
  Note(what);
}

bool WriteAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

void ResetLaunchTally() {
  t_launch.tally_reg = nullptr;
  t_launch.tally_kernels = 0;
  t_launch.tally_added_ns = 0;
}

void OnForkChild() {
  // The child shares the parent's connection and slot; neither is ours. Forget both so the
  // child registers on its own if it uses CUDA. Closing the inherited descriptor does not end
  // the parent's registration (the parent still holds its copy).
  pthread_mutex_init(&g_register_mutex, nullptr);
  for (int i = 0; i < kMaxDevices; ++i) {
    for (Registration& reg : g_registrations[i]) {
      if (reg.socket_fd >= 0) close(reg.socket_fd);
      reg = Registration{};
    }
    g_live[i].store(0, std::memory_order_relaxed);
    g_last_renewal_ns[i] = 0;
    g_state[i].store(kUnregistered, std::memory_order_relaxed);
  }
  g_process.epoch.fetch_add(1, std::memory_order_relaxed);
  ResetLaunchTally();  // the parent's registration's
  ResetTablesAfterFork();
  ResetCompletionTrackerAfterFork();
  ResetCallLogAfterFork();
  ResetTimingLogAfterFork();
  ResetNvtxAfterFork();
  ResetGemmSplitAfterFork();
}

void* MapDescriptor(int fd, size_t bytes, bool writable, size_t* mapped_bytes);

// Maps the benchmark's switch file (kEnvBenchSwitch); a path that cannot be mapped is ignored.
void MapBenchSwitch(const char* path) {
  if (path == nullptr || path[0] == '\0') return;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  size_t mapped = 0;
  void* addr = MapDescriptor(fd, sizeof(uint32_t), /*writable=*/false, &mapped);
  close(fd);
  if (addr != nullptr) g_process.bench_switch = static_cast<const std::atomic<uint32_t>*>(addr);
}

// A thread's launch tally left short of a batch is added when the thread exits (the key's
// destructor) and, for the thread that ends the process, when the library is unloaded: a
// process's count is exact once it is gone (threads still running at its exit excepted).
pthread_key_t g_tally_key;
bool g_tally_key_made = false;

void AddLaunchTallyNow(void*) {
  AddLaunchTally(t_launch.tally_reg, t_launch.tally_kernels);
  ResetLaunchTally();
}

// The library's destructor runs after the application's atexit handlers, which may launch.
__attribute__((destructor)) void AddLaunchTallyAtExit() { AddLaunchTallyNow(nullptr); }

void InitProcess() {
  PinLoadedVersion();
  g_process.prefetch_ring = contract::EventRing::CanPrefetchNextEntry();
  EnvConfig& config = g_process.config;
  config = ReadEnvConfig(getenv);
  g_process.driver_ok = EnsureDriverResolved();
  g_process.ctx_get_current = ORION_DRIVER(cuCtxGetCurrent);
  // Disabled or no driver: the hooks only forward (or report CUDA_ERROR_NOT_INITIALIZED).
  if (config.disabled || !g_process.driver_ok) return;
  config.usable_millicpus = ProcessMilliCpus();
  config.gate_spin_cap_ns = GateSpinCapNs(config.usable_millicpus);
  config.lazy_poll_ns = LazyPollNsFor(config, config.usable_millicpus);
  StartTimingLog(config.timing_log_dir, config.start_latency);
  MapBenchSwitch(getenv(contract::kEnvBenchSwitch));
  pthread_atfork(nullptr, nullptr, OnForkChild);
  g_tally_key_made = pthread_key_create(&g_tally_key, AddLaunchTallyNow) == 0;
}

Registration* Live(int device) { return &g_registrations[device][g_live[device].load()]; }

// Maps a descriptor the server handed over; null on failure. `writable`: the gate and client
// areas; the board is mapped read-only (the server sealed it against anything else).
void* MapDescriptor(int fd, size_t bytes, bool writable, size_t* mapped_bytes) {
  // lseek rather than fstat: fstat binds to GLIBC_2.33 on current glibc.
  const off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
  if (size < 0 || static_cast<size_t>(size) < bytes) return nullptr;
  void* addr = mmap(nullptr, static_cast<size_t>(size), writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) return nullptr;
  *mapped_bytes = static_cast<size_t>(size);
  return addr;
}

const contract::Board* MapBoard(int fd, uint64_t epoch, size_t* mapped_bytes, bool* reused) {
  *reused = false;
  // Reuse a mapping another device's registration already made of the same board (one per
  // node, per server start: the epoch tells a restarted server's board from the old one).
  for (int i = 0; i < kMaxDevices; ++i) {
    if (g_state[i].load(std::memory_order_acquire) != kActive) continue;
    const Registration* other = Live(i);
    if (other->board != nullptr &&
        other->board->header.server_epoch.load(std::memory_order_relaxed) == epoch) {
      *mapped_bytes = contract::kBoardBytes;
      *reused = true;
      return other->board;
    }
  }
  return static_cast<const contract::Board*>(
      MapDescriptor(fd, contract::kBoardBytes, /*writable=*/false, mapped_bytes));
}

void CloseAll(const int* fds) {
  for (int i = 0; i < contract::kRegisterFds; ++i) {
    if (fds[i] >= 0) close(fds[i]);
  }
}

// Registers `device` with the server, waiting at most `timeout` for each socket operation. On
// failure writes a reason into `why`.
bool Register(int device, Registration* reg, timeval timeout, char* why, size_t why_bytes) {
  contract::RegisterRequest request;
  memset(&request, 0, sizeof(request));
  request.header = contract::MakeHeader(contract::MessageType::kRegister, sizeof(request));
  request.claimed_pid = static_cast<uint32_t>(getpid());
  request.device_ordinal = static_cast<uint32_t>(device);
  if (auto get_uuid = ORION_DRIVER(cuDeviceGetUuid_v2); get_uuid != nullptr) {
    CUuuid uuid;
    if (get_uuid(&uuid, device) == CUDA_SUCCESS) {
      FormatGpuUuid(reinterpret_cast<const unsigned char*>(uuid.bytes), request.gpu_uuid,
                    sizeof(request.gpu_uuid));
    }
  }
  request.requested_priority = g_process.config.requested_priority;
  request.requested_memory_limit = g_process.config.requested_memory_limit;
  request.requested_latency_target_us = g_process.config.requested_latency_target_us;
  request.usable_millicpus = g_process.config.usable_millicpus;
  CopyTruncated(request.requested_job, sizeof(request.requested_job),
                g_process.config.requested_job);
  CopyTruncated(request.process_name, sizeof(request.process_name), program_invocation_short_name);

  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(why, why_bytes, "cannot create a Unix socket (%s)", strerror(errno));
    return false;
  }
  // A hung server must not hang the application's CUDA call for long.
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  CopyTruncated(addr.sun_path, sizeof(addr.sun_path), g_process.config.socket_path);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    snprintf(why, why_bytes, "cannot reach orion-server at %s (%s)", g_process.config.socket_path,
             strerror(errno));
    close(fd);
    return false;
  }
  contract::RegisterReply reply;
  memset(&reply, 0, sizeof(reply));
  int fds[contract::kRegisterFds];
  int nfds = 0;
  errno = 0;
  if (!WriteAll(fd, &request, sizeof(request)) ||
      !contract::ReceiveWithFds(fd, &reply, sizeof(reply), fds, &nfds)) {
    snprintf(why, why_bytes, "registration with orion-server at %s failed (%s)",
             g_process.config.socket_path, errno != 0 ? strerror(errno) : "connection closed");
    close(fd);
    return false;
  }
  // The mappings (or the reasons to fail) are all that is kept of the descriptors.
  struct Closer {
    int* fds;
    ~Closer() { CloseAll(fds); }
  } closer{fds};
  reply.message[sizeof(reply.message) - 1] = '\0';
  if (reply.header.magic != contract::kWireMagic ||
      reply.header.version != contract::kWireVersion ||
      reply.header.type != static_cast<uint32_t>(contract::MessageType::kRegisterReply) ||
      reply.header.bytes != sizeof(reply)) {
    snprintf(why, why_bytes, "orion-server sent a malformed registration reply (version %u)",
             reply.header.version);
    close(fd);
    return false;
  }
  if (reply.status != static_cast<uint32_t>(contract::RegisterStatus::kOk)) {
    snprintf(why, why_bytes, "orion-server refused registration of device %d (status %u: %s)",
             device, reply.status, reply.message);
    close(fd);
    return false;
  }
  if (reply.slot >= contract::kMaxSlots || reply.gpu >= contract::kMaxGpus) {
    snprintf(why, why_bytes, "orion-server assigned slot %u / gpu %u out of range", reply.slot,
             reply.gpu);
    close(fd);
    return false;
  }
  if (nfds != contract::kRegisterFds) {
    snprintf(why, why_bytes,
             "orion-server handed over %d of the %d shared-memory areas (an older server?)", nfds,
             contract::kRegisterFds);
    close(fd);
    return false;
  }
  size_t mapped = 0;
  bool reused = false;
  const contract::Board* board =
      MapBoard(fds[contract::kBoardFd], reply.server_epoch, &mapped, &reused);
  if (board == nullptr || !contract::BoardLooksValid(*board, mapped)) {
    snprintf(why, why_bytes, "the board orion-server handed over does not match this "
             "interposer's layout (version %u, expected %u)",
             board != nullptr ? board->header.version : 0u, contract::kBoardVersion);
    if (board != nullptr && !reused) munmap(const_cast<contract::Board*>(board), mapped);
    close(fd);
    return false;
  }
  const contract::ClientSlot& slot = board->slots[reply.slot];
  size_t gate_bytes = 0, area_bytes = 0, quota_bytes = 0;
  auto* gate = static_cast<contract::GateArea*>(MapDescriptor(
      fds[contract::kGateFd], sizeof(contract::GateArea), /*writable=*/true, &gate_bytes));
  auto* area = static_cast<contract::ClientArea*>(MapDescriptor(
      fds[contract::kAreaFd], sizeof(contract::ClientArea), /*writable=*/true, &area_bytes));
  auto* quota = static_cast<contract::QuotaArea*>(MapDescriptor(
      fds[contract::kQuotaFd], sizeof(contract::QuotaArea), /*writable=*/true, &quota_bytes));
  const bool owned = slot.generation.load(std::memory_order_acquire) == reply.generation &&
                     slot.state.load(std::memory_order_acquire) ==
                         static_cast<uint32_t>(contract::SlotState::kActive);
  if (!owned || gate == nullptr || area == nullptr || quota == nullptr ||
      !contract::GateLooksValid(*gate, gate_bytes, reply.gpu) ||
      !contract::AreaLooksValid(*area, area_bytes, reply.slot, reply.generation) ||
      !contract::QuotaLooksValid(*quota, quota_bytes)) {
    snprintf(why, why_bytes, "board slot %u, its gate area, its client area or its quota area "
             "does not belong to this registration", reply.slot);
    if (gate != nullptr) munmap(gate, gate_bytes);
    if (area != nullptr) munmap(area, area_bytes);
    if (quota != nullptr) munmap(quota, quota_bytes);
    if (!reused) munmap(const_cast<contract::Board*>(board), mapped);
    close(fd);
    return false;
  }
  reg->device = device;
  reg->socket_fd = fd;
  reg->board = board;
  reg->slot = &slot;
  reg->gpu = &board->gpus[reply.gpu];
  reg->gate = gate;
  reg->own_gate = &gate->slots[reply.slot];
  reg->area = area;
  reg->quota = quota;
  reg->slot_index = reply.slot;
  reg->generation = reply.generation;
  reg->client_id = reply.client_id;
  reg->server_epoch = reply.server_epoch;
  return true;
}

// The client-written counters of a registration, carried into its renewal: the quota keeps
// counting what the process holds (in its pod's new quota area too, past the limit if need be:
// the memory is held already), and the totals go on from where they were.
void CarryClientCounters(const Registration& from_reg, Registration& to_reg) {
  using Counters = contract::ClientArea::Counters;
  const Counters& from = from_reg.area->counters;
  Counters& to = to_reg.area->counters;
  for (auto field : {&Counters::memory_used_bytes, &Counters::memory_peak_bytes,
                     &Counters::launches, &Counters::throttled_ns}) {
    (to.*field).fetch_add((from.*field).load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
  }
  TryReserve(to_reg.quota->counters.used_bytes, to_reg.quota->counters.peak_bytes, 0,
             from.memory_used_bytes.load(std::memory_order_relaxed));
}

Registration* RegisterDevice(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  const uint32_t state = g_state[device].load(std::memory_order_acquire);
  if (state == kActive) return Live(device);
  if (state == kFailed) return nullptr;
  pthread_mutex_lock(&g_register_mutex);
  Registration* result = nullptr;
  if (g_process.pass_through.load(std::memory_order_acquire) == 0) {
    const uint32_t again = g_state[device].load(std::memory_order_acquire);
    if (again == kActive) {
      result = Live(device);
    } else if (again == kUnregistered) {
      char why[400] = {};
      if (Register(device, Live(device), timeval{2, 0}, why, sizeof(why))) {
        g_state[device].store(kActive, std::memory_order_release);
        result = Live(device);
      } else {
        g_state[device].store(kFailed, std::memory_order_release);
        // Log mode: with no server, the process keeps its own record (ORION_LOG_DIR).
        if (g_process.config.log_dir[0] != '\0') {
          StartCallLog(g_process.config.log_dir, program_invocation_short_name,
                       g_process.config.quiet);
        }
        FailOpen(why);
      }
    }
  }
  pthread_mutex_unlock(&g_register_mutex);
  return result;
}

}  // namespace

void WatchLaunchTally() {
  // Any value but null: the destructor runs at the thread's exit.
  if (g_tally_key_made) pthread_setspecific(g_tally_key, &t_launch);
}

void RenewRegistration(Registration* reg, uint64_t now_ns) {
  const int device = reg->device;
  if (device < 0 || device >= kMaxDevices) return;
  // One thread renews; the others keep launching on the old registration meanwhile.
  if (pthread_mutex_trylock(&g_register_mutex) != 0) return;
  const uint32_t index = g_live[device].load(std::memory_order_relaxed);
  if (Live(device) == reg && index < kMaxRenewals &&
      now_ns - g_last_renewal_ns[device] >= kRenewRetryNs) {
    g_last_renewal_ns[device] = now_ns;
    Registration& fresh = g_registrations[device][index + 1];
    fresh = Registration{};
    char why[400] = {};
    // Short timeouts: this runs in the application's launching thread.
    if (Register(device, &fresh, timeval{0, 200'000}, why, sizeof(why))) {
      CarryClientCounters(*reg, fresh);
      g_kernels.ForgetNameReports();
      close(reg->socket_fd);
      reg->socket_fd = -1;
      g_live[device].store(index + 1, std::memory_order_release);
      g_process.epoch.fetch_add(1, std::memory_order_relaxed);  // thread caches look again
      if (!g_process.config.quiet) {
        char line[160];
        const int n = snprintf(line, sizeof(line),
                               "orion: orion-server restarted; device %d registered again "
                               "(client %u)\n",
                               device, fresh.client_id);
        if (n > 0) {
          ssize_t ignored = write(2, line, static_cast<size_t>(n));
          (void)ignored;
        }
      }
    }
  }
  pthread_mutex_unlock(&g_register_mutex);
}

bool EnsureProcessInitSlow() {
  pthread_once(&g_process_once, InitProcess);
  g_process.ready.store(true, std::memory_order_release);
  return g_process.driver_ok;
}

[[gnu::hot]] Registration* CurrentRegistration(CUcontext* ctx_out) {
  *ctx_out = nullptr;
  if (!EnsureProcessInit() || g_process.config.disabled) return nullptr;
  if (g_process.pass_through.load(std::memory_order_relaxed) != 0) return nullptr;
  const contract::BenchSwitch bench = CurrentBenchSwitch();
  if (bench == contract::BenchSwitch::kPassThrough) return nullptr;
  auto get_ctx = g_process.ctx_get_current;
  if (get_ctx == nullptr) return nullptr;
  ThreadLaunch& cached = t_launch;
  CUcontext ctx = nullptr;
  if (bench == contract::BenchSwitch::kNoContextQuery && cached.ctx != nullptr) [[unlikely]] {
    ctx = cached.ctx;
  } else if (get_ctx(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    return nullptr;
  }
  *ctx_out = ctx;
  const uint32_t epoch = g_process.epoch.load(std::memory_order_relaxed);
  Registration* reg;
  if (ctx == cached.ctx && epoch == cached.epoch) {
    reg = cached.reg;
  } else {
    CUdevice device = -1;
    auto get_device = ORION_DRIVER(cuCtxGetDevice);
    if (get_device == nullptr || get_device(&device) != CUDA_SUCCESS) return nullptr;
    reg = RegisterDevice(device);
    cached.ctx = ctx;
    cached.reg = reg;
    cached.epoch = epoch;
  }
  if (reg == nullptr || !reg->StillOwned()) return nullptr;
  return reg;
}

void WriteStderrLine(const char* format, ...) {
  char line[512];
  va_list args;
  va_start(args, format);
  const int n = vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  if (n > 0) {
    ssize_t ignored = write(2, line, static_cast<size_t>(n) < sizeof(line) ? n : sizeof(line) - 1);
    (void)ignored;
  }
}

bool StartQuietThread(void* (*main)(void*), void* arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t thread;
  const bool started = pthread_create(&thread, nullptr, main, arg) == 0;
  if (started) pthread_detach(thread);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return started;
}

}  // namespace orion::interpose
