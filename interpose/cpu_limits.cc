// The process's CPUs for real: sched_getaffinity and the cgroup files (cpu_limits.h).
#include "interpose/glibc_compat.h"

#include "interpose/cpu_limits.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include "contract/gate_rules.h"

namespace orion::interpose {
namespace {

// A small file's text, NUL-terminated; false if it cannot be read.
bool ReadSmallFile(const char* path, char* buf, size_t size) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t used = 0;
  while (used + 1 < size) {
    const ssize_t n = read(fd, buf + used, size - 1 - used);
    if (n <= 0) break;
    used += static_cast<size_t>(n);
  }
  close(fd);
  buf[used] = '\0';
  return used > 0;
}

}  // namespace

uint64_t GateSpinCapNs(uint32_t usable_millicpus) {
  return usable_millicpus < 2000 ? 0 : contract::kMaxSpinNs;
}

uint32_t ProcessMilliCpus() {
  uint32_t affinity = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) affinity = static_cast<uint32_t>(CPU_COUNT(&set));
  char cgroup[4096];
  const uint32_t quota = ReadSmallFile("/proc/self/cgroup", cgroup, sizeof(cgroup))
                             ? CgroupMilliCpus(cgroup, ReadSmallFile)
                             : kUnlimitedMilliCpus;
  return UsableMilliCpus(affinity, quota);
}

}  // namespace orion::interpose
