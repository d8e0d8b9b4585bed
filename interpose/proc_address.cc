// Symbol-lookup hooks: cuGetProcAddress (v1 and v2) and dlsym hand out our hooks in place of the
// driver's entry points, so runtimes (cudart, PyTorch, Triton) that resolve the driver by
// version or by handle still go through the interposer.
#include "interpose/glibc_compat.h"

#include <dlfcn.h>
#include <string.h>

#include "interpose/client_state.h"
#include "interpose/real_driver.h"

namespace orion::interpose {
namespace {

// Replaces *pfn by our hook when it is the real pointer of a hooked ABI symbol. Comparing
// pointers (not names) picks the exact variant the driver chose for this version and stream
// flag (cuLaunchKernel vs cuLaunchKernel_ptsz, cuMemAlloc vs cuMemAlloc_v2).
void SwapInHook(const char* symbol, void** pfn, int cuda_version) {
  if (pfn == nullptr || *pfn == nullptr) return;
  const int hook = FindHookByRealPointer(*pfn);
  if (hook >= 0) {
    *pfn = g_hook_fns[hook];
    return;
  }
  // The driver may hand out an internal entry for itself; keep callers on our wrapper anyway.
  if (symbol != nullptr && strcmp(symbol, "cuGetProcAddress") == 0) {
    *pfn = cuda_version >= 12000 ? g_hook_fns[kHook_cuGetProcAddress_v2]
                                 : g_hook_fns[kHook_cuGetProcAddress];
  }
}

}  // namespace
}  // namespace orion::interpose

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                  cuuint64_t flags) {
  ORION_REAL_OR_RETURN(cuGetProcAddress)
  const CUresult result = real(symbol, pfn, cuda_version, flags);
  if (result == CUDA_SUCCESS) orion::interpose::SwapInHook(symbol, pfn, cuda_version);
  return result;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  ORION_REAL_OR_RETURN(cuGetProcAddress_v2)
  const CUresult result = real(symbol, pfn, cuda_version, flags, status);
  if (result == CUDA_SUCCESS) orion::interpose::SwapInHook(symbol, pfn, cuda_version);
  return result;
}

// ---- dlsym ----
//
// dlsym(RTLD_NEXT, ...) resolves relative to its caller's return address, so anything we do not
// replace must reach glibc as a tail jump with the caller's frame intact; otherwise another
// interposer asking for "the next malloc" would be answered relative to this library. The
// exported entry is therefore a few instructions of assembly around a C++ decision.

extern "C" {
// Hook for (handle, name), or null to let the real dlsym answer.
__attribute__((visibility("hidden"), used)) void* orion_dlsym_decide(void* handle,
                                                                     const char* name);
// Where the assembly entry jumps when we do not replace the symbol.
__attribute__((visibility("hidden"), used)) void* orion_real_dlsym_target = nullptr;
}

namespace {
void* NoDlsym(void*, const char*) { return nullptr; }
}  // namespace

void* orion_dlsym_decide(void* handle, const char* name) {
  if (orion_real_dlsym_target == nullptr) {
    // Resolving the real dlsym is idempotent; a race writes the same value.
    void* real = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (real == nullptr) real = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (real == nullptr) real = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
    __atomic_store_n(&orion_real_dlsym_target,
                     real != nullptr ? real : reinterpret_cast<void*>(&NoDlsym), __ATOMIC_RELEASE);
  }
  // RTLD_NEXT from someone else means "the definition after mine": never answer with our hook
  // (an interposer stacked on top of us would call itself).
  if (handle == RTLD_NEXT) return nullptr;
  const int hook = orion::interpose::FindHookByName(name);
  if (hook < 0) return nullptr;
  // Only hand out the hook where the lookup itself succeeds (the handle really has the symbol).
  if (orion::interpose::RealDlsym(handle, name) == nullptr) return nullptr;
  return orion::interpose::g_hook_fns[hook];
}

#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym, @function\n"
    ".p2align 4\n"
    "dlsym:\n"
    "  .cfi_startproc\n"
    "  endbr64\n"
    "  pushq %rdi\n"
    "  .cfi_adjust_cfa_offset 8\n"
    "  pushq %rsi\n"
    "  .cfi_adjust_cfa_offset 8\n"
    "  subq $8, %rsp\n"  // 16-byte alignment for the call
    "  .cfi_adjust_cfa_offset 8\n"
    "  call orion_dlsym_decide\n"
    "  addq $8, %rsp\n"
    "  .cfi_adjust_cfa_offset -8\n"
    "  popq %rsi\n"
    "  .cfi_adjust_cfa_offset -8\n"
    "  popq %rdi\n"
    "  .cfi_adjust_cfa_offset -8\n"
    "  testq %rax, %rax\n"
    "  jz 1f\n"
    "  ret\n"
    "1:\n"
    "  jmp *orion_real_dlsym_target(%rip)\n"
    "  .cfi_endproc\n"
    ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym, %function\n"
    ".p2align 4\n"
    "dlsym:\n"
    "  .cfi_startproc\n"
    "  stp x29, x30, [sp, #-32]!\n"
    "  .cfi_def_cfa_offset 32\n"
    "  .cfi_offset 29, -32\n"
    "  .cfi_offset 30, -24\n"
    "  mov x29, sp\n"
    "  stp x0, x1, [sp, #16]\n"
    "  bl orion_dlsym_decide\n"
    "  mov x2, x0\n"
    "  ldp x0, x1, [sp, #16]\n"
    "  ldp x29, x30, [sp], #32\n"
    "  .cfi_def_cfa_offset 0\n"
    "  cbz x2, 1f\n"
    "  mov x0, x2\n"
    "  ret\n"
    "1:\n"
    "  adrp x16, orion_real_dlsym_target\n"
    "  ldr x16, [x16, :lo12:orion_real_dlsym_target]\n"
    "  br x16\n"
    "  .cfi_endproc\n"
    ".size dlsym, .-dlsym\n");
#else
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  void* hook = orion_dlsym_decide(handle, name);
  if (hook != nullptr) return hook;
  return reinterpret_cast<void* (*)(void*, const char*)>(orion_real_dlsym_target)(handle, name);
}
#endif
