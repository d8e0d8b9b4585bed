// What the cuBLAS double's probe programs share: the double's own (not hooked) entry points
// they call, checks that end the probe on a failed call, inputs, and reading a double's call log
// (orion_blas_double_take_calls: "API m n k" a line, since the last read).
#pragma once

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "interpose/blas_abi.h"

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, CUstream stream);
}

#define PROBE_CU(call)                                                  \
  do {                                                                  \
    const CUresult probe_result = (call);                               \
    if (probe_result != CUDA_SUCCESS) {                                 \
      fprintf(stderr, "probe: %s failed: %d\n", #call, probe_result);   \
      exit(1);                                                          \
    }                                                                   \
  } while (0)
#define PROBE_BLAS(call)                                                \
  do {                                                                  \
    const cublasStatus_t probe_status = (call);                         \
    if (probe_status != 0) {                                            \
      fprintf(stderr, "probe: %s failed: %d\n", #call, probe_status);   \
      exit(1);                                                          \
    }                                                                   \
  } while (0)

namespace orion::testing {

using TakeCallsFn = size_t (*)(char*, size_t);

// `count` values in [-1, 1), the same for the same seed.
inline std::vector<float> Values(size_t count, uint32_t seed) {
  std::vector<float> v(count);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

// The calls a double received since the last read, and their log.
struct Received {
  size_t calls = 0;
  std::string log;
};

inline Received Take(TakeCallsFn take) {
  static char buf[1 << 16];
  Received r;
  r.calls = take(buf, sizeof(buf));
  r.log = buf;
  return r;
}

}  // namespace orion::testing
