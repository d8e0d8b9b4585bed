// A probe's reading of the CUDA driver test double's counters (orion_double_<name>: stream_waits,
// kernel_launches, context_queries), looked up with dlsym so that a probe also runs where the
// driver is not the double (it then has no counts).
#pragma once

#include <dlfcn.h>
#include <stdio.h>

namespace orion::testing {

// True and *count set where the double has the counter `name`.
inline bool ReadDoubleCount(const char* name, unsigned long long* count) {
  char symbol[64];
  snprintf(symbol, sizeof(symbol), "orion_double_%s", name);
  using Count = unsigned long long (*)();
  auto read = reinterpret_cast<Count>(dlsym(RTLD_DEFAULT, symbol));
  if (read == nullptr) return false;
  *count = read();
  return true;
}

}  // namespace orion::testing
