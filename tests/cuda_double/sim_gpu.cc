// Simulated GPU timeline and memory capacity shared across processes (see sim_gpu.h).
// Part of the CUDA driver test double that stands in for the NVIDIA driver without a GPU.
#include "tests/cuda_double/sim_gpu.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

namespace orion::cuda_double {
namespace {

constexpr uint64_t kDefaultCapacity = 16ull << 30;

bool ProcessAlive(int32_t pid) {
  if (pid <= 0) return false;
  return kill(pid, 0) == 0 || errno == EPERM;
}

std::string StateFolder() { return SimStateFolder(); }

void InitState(SimGpuFile* state, int ordinal) {
  memset(static_cast<void*>(state), 0, sizeof(SimGpuFile));
  state->version = SimGpuFile::kVersion;
  state->ordinal = static_cast<uint32_t>(ordinal);
  state->magic.store(SimGpuFile::kMagic, std::memory_order_release);
}

// Maps the device's state file; creation and initialisation happen under flock so that two
// processes starting together never both initialise (or one read a half-written header).
SimGpuFile* MapSharedState(int ordinal) {
  const std::string dir = StateFolder();
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return nullptr;
  const std::string path = dir + "/gpu" + std::to_string(ordinal);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  if (flock(fd, LOCK_EX) != 0) {
    close(fd);
    return nullptr;
  }
  struct stat st {};
  bool fresh = fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(sizeof(SimGpuFile));
  if (fresh && ftruncate(fd, sizeof(SimGpuFile)) != 0) {
    flock(fd, LOCK_UN);
    close(fd);
    return nullptr;
  }
  void* mem = mmap(nullptr, sizeof(SimGpuFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    flock(fd, LOCK_UN);
    close(fd);
    return nullptr;
  }
  auto* state = static_cast<SimGpuFile*>(mem);
  if (fresh || state->magic.load(std::memory_order_acquire) != SimGpuFile::kMagic ||
      state->version != SimGpuFile::kVersion) {
    InitState(state, ordinal);
  }
  flock(fd, LOCK_UN);
  close(fd);  // the mapping stays valid
  return state;
}

}  // namespace

std::string SimStateFolder() {
  const char* dir = getenv("ORION_SIM_DIR");
  if (dir != nullptr && dir[0] != '\0') return dir;
  return "/dev/shm/orion-sim-" + std::to_string(getuid());
}

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void SleepUntilNs(uint64_t deadline_ns) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(deadline_ns / 1'000'000'000ull);
  ts.tv_nsec = static_cast<long>(deadline_ns % 1'000'000'000ull);
  while (NowNs() < deadline_ns) {
    if (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) != 0 && errno != EINTR) {
      break;
    }
  }
}

bool ParseByteSize(const char* text, uint64_t* bytes) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0 || end == text) return false;
  uint64_t unit = 1;
  const std::string suffix(end);
  if (suffix.empty() || suffix == "B") {
    unit = 1;
  } else if (suffix == "Ki" || suffix == "KiB") {
    unit = 1ull << 10;
  } else if (suffix == "Mi" || suffix == "MiB") {
    unit = 1ull << 20;
  } else if (suffix == "Gi" || suffix == "GiB") {
    unit = 1ull << 30;
  } else if (suffix == "Ti" || suffix == "TiB") {
    unit = 1ull << 40;
  } else if (suffix == "K" || suffix == "KB") {
    unit = 1000ull;
  } else if (suffix == "M" || suffix == "MB") {
    unit = 1000ull * 1000;
  } else if (suffix == "G" || suffix == "GB") {
    unit = 1000ull * 1000 * 1000;
  } else {
    return false;
  }
  if (value > UINT64_MAX / unit) return false;
  *bytes = value * unit;
  return true;
}

namespace {
// NVIDIA_VISIBLE_DEVICES as the double's own GPUs; empty when it names anything else (unset,
// "all", "void", other UUIDs): then every ordinal is its own GPU.
const std::vector<int>& VisibleDevices() {
  static const std::vector<int>* visible = [] {
    auto* out = new std::vector<int>;
    const char* text = getenv("NVIDIA_VISIBLE_DEVICES");
    if (text == nullptr) return out;
    static constexpr char kPrefix[] = "GPU-6f72696f-6e2d-7369-6d00-0000000000";
    std::string list = text;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t end = std::min(list.find(',', start), list.size());
      const std::string entry = list.substr(start, end - start);
      unsigned n = 0;
      if (entry.size() != sizeof(kPrefix) + 1 || entry.compare(0, sizeof(kPrefix) - 1, kPrefix) != 0 ||
          sscanf(entry.c_str() + sizeof(kPrefix) - 1, "%2x", &n) != 1 ||
          n >= static_cast<unsigned>(kMaxSimDevices)) {
        out->clear();
        return out;
      }
      out->push_back(static_cast<int>(n));
      start = end + 1;
    }
    return out;
  }();
  return *visible;
}
}  // namespace

int SimPhysicalDevice(int ordinal) {
  const std::vector<int>& visible = VisibleDevices();
  return visible.empty() || ordinal < 0 || ordinal >= static_cast<int>(visible.size())
             ? ordinal
             : visible[ordinal];
}

int SimDeviceCount() {
  if (!VisibleDevices().empty()) return static_cast<int>(VisibleDevices().size());
  const char* text = getenv("ORION_SIM_DEVICES");
  if (text == nullptr) return 1;
  const int count = atoi(text);
  if (count < 0) return 0;
  return count > kMaxSimDevices ? kMaxSimDevices : count;
}

uint64_t SimMemoryCapacity() {
  uint64_t bytes = kDefaultCapacity;
  const char* text = getenv("ORION_SIM_MEMORY");
  if (text != nullptr && !ParseByteSize(text, &bytes)) bytes = kDefaultCapacity;
  return bytes;
}

double SimDurationScale() {
  const char* text = getenv("ORION_SIM_SCALE");
  if (text == nullptr) return 1.0;
  const double scale = strtod(text, nullptr);
  return scale > 0 ? scale : 1.0;
}

SimGpu* SimGpu::Get(int ordinal) {
  if (ordinal < 0 || ordinal >= SimDeviceCount()) return nullptr;
  // Leaked on purpose: the double must stay usable from atexit handlers of the host program.
  static SimGpu* devices[kMaxSimDevices] = {};
  static std::mutex* open_mutex = new std::mutex;
  std::lock_guard<std::mutex> lock(*open_mutex);
  if (devices[ordinal] == nullptr) {
    const int physical = SimPhysicalDevice(ordinal);
    SimGpuFile* state = MapSharedState(physical);
    if (state == nullptr) {
      fprintf(stderr,
              "orion cuda double: cannot map shared state for gpu%d under %s (%s); "
              "kernels of other processes will not be serialised with this one\n",
              physical, StateFolder().c_str(), strerror(errno));
      state = new SimGpuFile;
      InitState(state, physical);
    }
    devices[ordinal] = new SimGpu(ordinal, state, SimMemoryCapacity());
  }
  return devices[ordinal];
}

uint64_t SimGpu::ScheduleKernel(uint64_t earliest_start_ns, uint64_t duration_ns) {
  uint64_t end = 0;
  while (!TrySchedule(earliest_start_ns, duration_ns, &end)) SleepUntilNs(NowNs() + 50'000);
  return end;
}

namespace {
// A device held open-ended by a process that is gone (crashed mid-collective) is free again.
bool TakeBackFromDeadHolder(SimGpuFile* state, uint64_t* busy) {
  const int32_t holder = state->open_pid.load(std::memory_order_acquire);
  if (holder == 0 || ProcessAlive(holder)) return false;
  if (!state->busy_until_ns.compare_exchange_strong(*busy, NowNs(), std::memory_order_acq_rel)) {
    return true;  // changed meanwhile: look again
  }
  state->open_pid.store(0, std::memory_order_release);
  *busy = state->busy_until_ns.load(std::memory_order_acquire);
  return true;
}
}  // namespace

bool SimGpu::TrySchedule(uint64_t earliest_start_ns, uint64_t duration_ns, uint64_t* end_ns) {
  const uint64_t now = NowNs();
  uint64_t busy = state_->busy_until_ns.load(std::memory_order_acquire);
  uint64_t end = 0;
  for (;;) {
    if (busy == kOpenEnded) {
      if (TakeBackFromDeadHolder(state_, &busy)) continue;
      return false;
    }
    uint64_t start = now > earliest_start_ns ? now : earliest_start_ns;
    if (busy > start) start = busy;
    end = start + duration_ns;
    if (state_->busy_until_ns.compare_exchange_weak(busy, end, std::memory_order_acq_rel,
                                                    std::memory_order_acquire)) {
      break;
    }
  }
  state_->kernels_launched.fetch_add(1, std::memory_order_relaxed);
  state_->busy_ns_total.fetch_add(duration_ns, std::memory_order_relaxed);
  *end_ns = end;
  return true;
}

bool SimGpu::TryOpen(uint64_t earliest_start_ns, uint64_t* start_ns, uint64_t* busy_before_ns) {
  const uint64_t now = NowNs();
  uint64_t busy = state_->busy_until_ns.load(std::memory_order_acquire);
  for (;;) {
    if (busy == kOpenEnded) {
      if (TakeBackFromDeadHolder(state_, &busy)) continue;
      return false;
    }
    if (state_->busy_until_ns.compare_exchange_weak(busy, kOpenEnded, std::memory_order_acq_rel,
                                                    std::memory_order_acquire)) {
      break;
    }
  }
  state_->open_pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
  state_->open_since_ns.store(now, std::memory_order_relaxed);
  state_->kernels_launched.fetch_add(1, std::memory_order_relaxed);
  *busy_before_ns = busy;
  *start_ns = std::max({now, earliest_start_ns, busy});
  return true;
}

void SimGpu::Close(uint64_t end_ns) {
  if (!OpenedByMe()) return;  // taken back meanwhile (this process was thought dead)
  state_->open_pid.store(0, std::memory_order_release);
  uint64_t open = kOpenEnded;
  state_->busy_until_ns.compare_exchange_strong(open, end_ns, std::memory_order_acq_rel);
}

bool SimGpu::OpenedByMe() const {
  return state_->busy_until_ns.load(std::memory_order_acquire) == kOpenEnded &&
         state_->open_pid.load(std::memory_order_acquire) == static_cast<int32_t>(getpid());
}

std::atomic<uint64_t>* SimGpu::OwnBytes() {
  const int32_t me = static_cast<int32_t>(getpid());
  if (slot_pid_.load(std::memory_order_acquire) == me) {
    const int32_t index = slot_index_.load(std::memory_order_acquire);
    if (index < 0) return &state_->orphan_bytes;
    auto& slot = state_->processes[index];
    if (slot.pid.load(std::memory_order_acquire) == me) return &slot.bytes;
  }
  // First use in this process (or first after fork: the parent's slot is not ours).
  int32_t claimed = -1;
  for (uint32_t i = 0; i < kMaxSimProcesses && claimed < 0; ++i) {
    auto& slot = state_->processes[i];
    int32_t owner = slot.pid.load(std::memory_order_acquire);
    if (owner == me) {
      claimed = static_cast<int32_t>(i);
    } else if (owner == 0 || !ProcessAlive(owner)) {
      if (slot.pid.compare_exchange_strong(owner, me, std::memory_order_acq_rel)) {
        slot.bytes.store(0, std::memory_order_release);
        claimed = static_cast<int32_t>(i);
      }
    }
  }
  slot_index_.store(claimed, std::memory_order_release);
  slot_pid_.store(me, std::memory_order_release);
  return claimed < 0 ? &state_->orphan_bytes : &state_->processes[claimed].bytes;
}

uint64_t SimGpu::MemoryInUse() {
  uint64_t total = state_->orphan_bytes.load(std::memory_order_acquire);
  for (auto& slot : state_->processes) {
    const uint64_t bytes = slot.bytes.load(std::memory_order_acquire);
    if (bytes == 0) continue;
    // Memory of a crashed process is given back, as the real driver does on process exit.
    if (ProcessAlive(slot.pid.load(std::memory_order_acquire))) total += bytes;
  }
  return total;
}

bool SimGpu::TryReserveMemory(uint64_t bytes) {
  std::atomic<uint64_t>* own = OwnBytes();
  // Count first, then check: two processes racing for the last bytes may both fail, but the
  // device is never overcommitted.
  own->fetch_add(bytes, std::memory_order_acq_rel);
  if (MemoryInUse() > capacity_) {
    own->fetch_sub(bytes, std::memory_order_acq_rel);
    return false;
  }
  return true;
}

void SimGpu::ReleaseMemory(uint64_t bytes) {
  std::atomic<uint64_t>* own = OwnBytes();
  uint64_t held = own->load(std::memory_order_acquire);
  // Clamp: memory allocated before a fork belongs to the parent's slot.
  while (!own->compare_exchange_weak(held, held > bytes ? held - bytes : 0,
                                     std::memory_order_acq_rel)) {
  }
}

}  // namespace orion::cuda_double
