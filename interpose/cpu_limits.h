// How much CPU the host process may use: its affinity (a cpuset, `taskset`) and the CPU quota of
// its cgroup and every parent cgroup it can see (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` /
// `cpu.cfs_period_us`), as thousandths of a CPU. A Kubernetes pod with `limits.cpu: 1` reads
// 1000. The launch gate spins before it sleeps only where the process has CPUs to spare.
//
// The parsing and the walk up the cgroup tree are pure, with the file reader injected, so they
// are tested without a cgroup; no allocation, no libstdc++ (this runs inside user processes).
//
// Usage:
//   const uint32_t millicpus = ProcessMilliCpus();  // reads /proc/self/cgroup, /sys/fs/cgroup
//   const uint64_t spin_cap_ns = GateSpinCapNs(millicpus);
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

namespace orion::interpose {

inline constexpr uint32_t kUnlimitedMilliCpus = UINT32_MAX;

// Thousandths of a CPU from a quota and a period (microseconds), rounded up; 0 quota or period:
// no limit.
inline uint32_t MilliCpusOf(uint64_t quota_us, uint64_t period_us) {
  if (quota_us == 0 || period_us == 0) return kUnlimitedMilliCpus;
  if (quota_us > (UINT64_MAX - period_us) / 1000) return kUnlimitedMilliCpus - 1;  // absurd quota
  const uint64_t m = (quota_us * 1000 + period_us - 1) / period_us;
  return m >= kUnlimitedMilliCpus ? kUnlimitedMilliCpus - 1 : static_cast<uint32_t>(m);
}

// Reads a decimal number at *p (spaces first), advancing p; false without a digit.
inline bool ReadDecimal(const char** p, uint64_t* out) {
  const char* s = *p;
  while (*s == ' ') ++s;
  if (*s < '0' || *s > '9') return false;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) {
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(*s - '0');
  }
  *p = s;
  *out = v;
  return true;
}

// cgroup v2 cpu.max: "max 100000" (no limit) or "150000 100000" (1.5 CPUs). Junk: no limit.
inline uint32_t ParseCpuMax(const char* text) {
  const char* p = text;
  while (*p == ' ') ++p;
  uint64_t quota = 0, period = 0;
  if (strncmp(p, "max", 3) == 0) return kUnlimitedMilliCpus;
  if (!ReadDecimal(&p, &quota) || !ReadDecimal(&p, &period)) return kUnlimitedMilliCpus;
  return MilliCpusOf(quota, period);
}

// cgroup v1: cpu.cfs_quota_us ("-1" = no limit) and cpu.cfs_period_us.
inline uint32_t ParseCfsQuota(const char* quota_text, const char* period_text) {
  const char* q = quota_text;
  const char* per = period_text;
  while (*q == ' ') ++q;
  uint64_t quota = 0, period = 0;
  if (*q == '-' || !ReadDecimal(&q, &quota) || !ReadDecimal(&per, &period)) {
    return kUnlimitedMilliCpus;
  }
  return MilliCpusOf(quota, period);
}

// Whether a comma-separated controller list ("cpu,cpuacct") names `name`.
inline bool ListsController(const char* list, size_t len, const char* name) {
  const size_t n = strlen(name);
  for (size_t i = 0; i <= len;) {
    const char* comma = static_cast<const char*>(memchr(list + i, ',', len - i));
    const size_t stop = comma != nullptr ? static_cast<size_t>(comma - list) : len;
    if (stop - i == n && strncmp(list + i, name, n) == 0) return true;
    i = stop + 1;
  }
  return false;
}

// The smallest quota on the way from the process's cgroup up to the root it can see.
// `proc_self_cgroup` is /proc/self/cgroup's text, lines "ID:CONTROLLERS:PATH". read(path, buf,
// size) fills buf with a file's text (NUL-terminated) and returns false if there is none.
// cgroup v2 ("0::PATH") reads /sys/fs/cgroup/PATH/cpu.max and its parents'; where a v1 line lists
// the cpu controller, cpu.cfs_quota_us and cpu.cfs_period_us under /sys/fs/cgroup/cpu,cpuacct (or
// /cpu) at PATH and its parents. In a container PATH may name the host's tree while the mount
// shows the container's own cgroup at its root: missing files are skipped and the root is read.
template <typename ReadFile>
uint32_t CgroupMilliCpus(const char* proc_self_cgroup, ReadFile read) {
  char path[512] = {};
  bool found = false, v1 = false;
  for (const char* line = proc_self_cgroup; line != nullptr && *line != '\0';) {
    const char* end = strchr(line, '\n');
    const size_t len = end != nullptr ? static_cast<size_t>(end - line) : strlen(line);
    const char* first = static_cast<const char*>(memchr(line, ':', len));
    const char* second = nullptr;
    if (first != nullptr) {
      second = static_cast<const char*>(
          memchr(first + 1, ':', len - static_cast<size_t>(first + 1 - line)));
    }
    if (second != nullptr) {
      const size_t controllers = static_cast<size_t>(second - first - 1);
      const size_t path_len = len - static_cast<size_t>(second + 1 - line);
      const bool cpu_v1 = controllers > 0 && ListsController(first + 1, controllers, "cpu");
      const bool v2 = controllers == 0 && first == line + 1 && line[0] == '0';
      if ((cpu_v1 || (v2 && !v1)) && path_len < sizeof(path)) {
        memcpy(path, second + 1, path_len);
        path[path_len] = '\0';
        found = true;
        v1 = cpu_v1;
      }
    }
    line = end != nullptr ? end + 1 : nullptr;
  }
  if (!found) return kUnlimitedMilliCpus;

  static const char* const kV1Roots[] = {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"};
  char file[768], text[64], period[64];
  uint32_t best = kUnlimitedMilliCpus;
  // From the full path up to the root ("" after the last cut).
  for (size_t n = strlen(path);;) {
    path[n] = '\0';
    uint32_t m = kUnlimitedMilliCpus;
    if (!v1) {
      snprintf(file, sizeof(file), "/sys/fs/cgroup%s/cpu.max", path);
      if (read(file, text, sizeof(text))) m = ParseCpuMax(text);
    } else {
      for (const char* root : kV1Roots) {
        snprintf(file, sizeof(file), "%s%s/cpu.cfs_quota_us", root, path);
        if (!read(file, text, sizeof(text))) continue;
        snprintf(file, sizeof(file), "%s%s/cpu.cfs_period_us", root, path);
        if (read(file, period, sizeof(period))) m = ParseCfsQuota(text, period);
        break;
      }
    }
    if (m < best) best = m;
    if (n == 0) break;
    while (n > 0 && path[n - 1] != '/') --n;  // cut the last component
    if (n > 0) --n;                           // and its slash
  }
  return best;
}

// The process's CPUs: affinity count x 1000, capped by the cgroup quota (ProcessMilliCpus reads
// both for real).
inline uint32_t UsableMilliCpus(uint32_t affinity_cpus, uint32_t cgroup_millicpus) {
  const uint64_t by_affinity =
      affinity_cpus == 0 ? kUnlimitedMilliCpus : static_cast<uint64_t>(affinity_cpus) * 1000;
  return static_cast<uint32_t>(by_affinity < cgroup_millicpus ? by_affinity : cgroup_millicpus);
}

// Spinning at the gate catches a release within microseconds, but only where another CPU is
// free to run the process's other threads meanwhile: below two CPUs the spin only burns the
// quota (or the one core) that the process's own work needs. Returns the most the gate may spin.
uint64_t GateSpinCapNs(uint32_t usable_millicpus);

// Reads the process's affinity and its cgroup quotas (once per call; the caller caches it).
uint32_t ProcessMilliCpus();

}  // namespace orion::interpose
