// Rendezvous of a simulated job's ranks for their collectives (see sim_job.h). Part of the CUDA
// driver test double.
#include "tests/cuda_double/sim_job.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tests/cuda_double/sim_gpu.h"

namespace orion::cuda_double {
namespace {

std::atomic<int> default_rank{-1};

SimJobFile* MapJobFile(const std::string& name) {
  const std::string dir = SimStateFolder();
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return nullptr;
  const std::string path = dir + "/job-" + name;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  // Under flock, as the gpu<N> files: one rank initialises, the other never reads it half-done.
  if (flock(fd, LOCK_EX) != 0) {
    close(fd);
    return nullptr;
  }
  struct stat st {};
  const bool fresh = fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(sizeof(SimJobFile));
  void* mem = MAP_FAILED;
  if (!fresh || ftruncate(fd, sizeof(SimJobFile)) == 0) {
    mem = mmap(nullptr, sizeof(SimJobFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (mem != MAP_FAILED) {
    auto* file = static_cast<SimJobFile*>(mem);
    if (fresh || file->magic.load(std::memory_order_acquire) != SimJobFile::kMagic ||
        file->version != SimJobFile::kVersion) {
      memset(mem, 0, sizeof(SimJobFile));
      file->version = SimJobFile::kVersion;
      file->magic.store(SimJobFile::kMagic, std::memory_order_release);
    }
  }
  flock(fd, LOCK_UN);
  close(fd);
  return mem == MAP_FAILED ? nullptr : static_cast<SimJobFile*>(mem);
}

}  // namespace

void SetDefaultJobRank(int physical_gpu) {
  int unset = -1;
  default_rank.compare_exchange_strong(unset, physical_gpu % SimJobFile::kRanks);
}

SimJob* SimJob::Get() {
  // Leaked on purpose, as the devices: usable from the host program's exit handlers.
  static SimJob* job = [] () -> SimJob* {
    const char* name = getenv("ORION_SIM_JOB");
    if (name == nullptr || name[0] == '\0' || strchr(name, '/') != nullptr) return nullptr;
    int rank = default_rank.load();
    if (const char* r = getenv("ORION_SIM_RANK"); r != nullptr && r[0] != '\0') rank = atoi(r);
    if (rank < 0 || rank >= SimJobFile::kRanks) rank = 0;
    SimJobFile* file = MapJobFile(name);
    if (file == nullptr) {
      fprintf(stderr, "orion cuda double: cannot map job %s under %s (%s); its collectives run "
              "as plain kernels\n", name, SimStateFolder().c_str(), strerror(errno));
      return nullptr;
    }
    return new SimJob(name, rank, file);
  }();
  return job;
}

void SimJob::PublishStart(uint64_t seq, uint64_t start_ns) {
  SimJobFile::Slot& slot = file_->slots[seq % SimJobFile::kSlots];
  slot.start_ns[rank_].store(start_ns, std::memory_order_relaxed);
  // seq_cst: a rank publishes, then looks for its peer's start; with both in one total order at
  // least one of two ranks starting together sees the other.
  slot.seq_plus_one[rank_].store(seq + 1, std::memory_order_seq_cst);
}

bool SimJob::PeerStart(uint64_t seq, uint64_t* start_ns) const {
  const int peer = 1 - rank_;
  const SimJobFile::Slot& slot = file_->slots[seq % SimJobFile::kSlots];
  if (slot.seq_plus_one[peer].load(std::memory_order_seq_cst) != seq + 1) return false;
  *start_ns = slot.start_ns[peer].load(std::memory_order_relaxed);
  return true;
}

uint64_t SimJob::TimeoutNs() {
  static const uint64_t timeout = [] {
    const char* v = getenv("ORION_SIM_COLLECTIVE_TIMEOUT_MS");
    const uint64_t ms = v != nullptr ? strtoull(v, nullptr, 10) : 0;
    return (ms != 0 ? ms : 10'000) * 1'000'000ull;
  }();
  return timeout;
}

}  // namespace orion::cuda_double
