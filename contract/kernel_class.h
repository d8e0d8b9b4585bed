// Orion's kernel classes (compute- or memory-bound) and the name-based guess used for a kernel
// without a measured roofline. Shared by the server (profiles, CSV) and the interposer (the MPS
// gate's complementarity check), so it allocates nothing and needs no C++ library.
#pragma once

#include <stdint.h>

namespace orion::contract {

// Values match Orion's profile CSV (0 = memory, 1 = compute). kMixed is not in Orion: work of
// both classes at once (a CUDA graph launch, or high-priority kernels of different classes on
// one GPU), which no kernel complements.
enum class KernelClass : int32_t { kUnknown = -1, kMemory = 0, kCompute = 1, kMixed = 2 };

// On the board a class is stored as value + 1, so a zeroed word means "unknown".
inline uint32_t KernelClassToBoard(KernelClass c) {
  return static_cast<uint32_t>(static_cast<int32_t>(c) + 1);
}
inline KernelClass KernelClassFromBoard(uint32_t v) {
  return v == 1   ? KernelClass::kMemory
         : v == 2 ? KernelClass::kCompute
         : v == 3 ? KernelClass::kMixed
                  : KernelClass::kUnknown;
}

// Two kernels complement each other when one is compute- and the other memory-bound: they can
// share the SMs with little slowdown (Orion's co-scheduling rule).
inline bool Complementary(KernelClass a, KernelClass b) {
  return a != KernelClass::kUnknown && b != KernelClass::kUnknown && a != KernelClass::kMixed &&
         b != KernelClass::kMixed && a != b;
}

namespace internal {
inline bool ContainsIgnoreCase(const char* haystack, const char* needle) {
  for (const char* h = haystack; *h != '\0'; ++h) {
    const char* a = h;
    const char* b = needle;
    while (*a != '\0' && *b != '\0') {
      char c = *a;
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      if (c != *b) break;
      ++a;
      ++b;
    }
    if (*b == '\0') return true;
  }
  return false;
}
}  // namespace internal

// GEMM/convolution/attention kernels are compute-bound; elementwise, reductions, norms, copies,
// pooling and index kernels are memory-bound; anything else is unknown. `name` may be mangled.
inline KernelClass ClassifyKernelName(const char* name) {
  if (name == nullptr) return KernelClass::kUnknown;
  static constexpr const char* kCompute[] = {"gemm",   "conv",   "xmma",  "cutlass",
                                             "matmul", "wgrad",  "dgrad", "fprop",
                                             "flash",  "attention", "sm90_", "winograd"};
  static constexpr const char* kMemory[] = {"elementwise", "reduce", "norm",    "copy",
                                            "memcpy",      "memset", "softmax", "cat",
                                            "index",       "gather", "scatter", "fill",
                                            "transpose",   "pool"};
  for (const char* k : kCompute) {
    if (internal::ContainsIgnoreCase(name, k)) return KernelClass::kCompute;
  }
  for (const char* k : kMemory) {
    if (internal::ContainsIgnoreCase(name, k)) return KernelClass::kMemory;
  }
  return KernelClass::kUnknown;
}

// Collective communication kernels (NCCL's ncclKernel_* / ncclDevKernel_*): each waits for its
// peers on other GPUs, so holding one at a GPU's gate leaves the peers' kernels spinning on
// theirs until it runs. The gate never holds them.
inline bool IsCommunicationKernelName(const char* name) {
  return name != nullptr && internal::ContainsIgnoreCase(name, "nccl");
}

}  // namespace orion::contract
