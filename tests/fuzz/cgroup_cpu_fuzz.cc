// Fuzz target: what the interposer reads at start inside every user process to find its CPUs
// (interpose/cpu_limits.h): /proc/self/cgroup's text and the cgroup files it names. The input is
// the cgroup text, a NUL, then the bytes every file is cut from (which file gets which slice, or
// none, depends on a hash of its path). Checks: no crash or sanitizer report, paths stay in their
// buffers, the answer is a limit or "none", and the same input gives the same answer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "interpose/cpu_limits.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

struct FuzzFiles {
  const uint8_t* blob;
  size_t size;
  bool operator()(const char* path, char* buf, size_t buf_size) const {
    Check(strlen(path) < 768);
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the path
    for (const char* p = path; *p != '\0'; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 1099511628211ull;
    if (size == 0 || (h & 3) == 0) return false;  // a quarter of the files do not exist
    const size_t start = (h >> 8) % size;
    const size_t n = std::min<size_t>(std::min<size_t>(size - start, (h >> 40) % 48 + 1),
                                      buf_size - 1);
    memcpy(buf, blob + start, n);
    buf[n] = '\0';
    return true;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orion::interpose;
  const uint8_t* nul = static_cast<const uint8_t*>(memchr(data, 0, size));
  const size_t text_len = nul != nullptr ? static_cast<size_t>(nul - data) : size;
  const std::string cgroup(reinterpret_cast<const char*>(data), text_len);
  const FuzzFiles files{nul != nullptr ? nul + 1 : data + size,
                        nul != nullptr ? size - text_len - 1 : 0};
  const uint32_t a = CgroupMilliCpus(cgroup.c_str(), files);
  Check(a == CgroupMilliCpus(cgroup.c_str(), files));
  Check(a == kUnlimitedMilliCpus || a < kUnlimitedMilliCpus);
  const uint32_t usable = UsableMilliCpus(4, a);
  Check(usable <= 4000);
  // The parsers alone, on the raw text.
  const uint32_t m = ParseCpuMax(cgroup.c_str());
  Check(m == kUnlimitedMilliCpus || m >= 1);
  (void)ParseCfsQuota(cgroup.c_str(), cgroup.c_str());
  return 0;
}
