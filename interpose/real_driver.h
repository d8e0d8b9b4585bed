// Access to the real CUDA driver behind the hooks: the real dlsym, the libcuda handle, the table
// of real entry points (one per hooked function) and the bookkeeping driver functions.
//
// Usage:
//   if (!orion::interpose::EnsureDriverResolved()) return CUDA_ERROR_NOT_INITIALIZED;
//   auto real = ORION_REAL(cuMemAlloc_v2);  // typed pointer, may be null
#pragma once

#include "interpose/cuda_abi.h"

namespace orion::interpose {

// Real entry points, filled once under pthread_once; read without locks afterwards.
extern void* g_real_hooks[kHookCount];
extern void* g_driver_fns[kDriverFnCount];
// Our own hook functions and their ABI names, in HookId order.
extern void* const g_hook_fns[kHookCount];
extern const char* const g_hook_names[kHookCount];

// Loads libcuda.so.1 (RTLD_NOLOAD first, so the process's own copy is used) and resolves every
// hooked and bookkeeping symbol. Returns false if no driver could be loaded. Thread-safe.
bool EnsureDriverResolved();

// The real glibc dlsym (never our hook).
void* RealDlsym(void* handle, const char* name);

// Hook index for an ABI name, or -1.
int FindHookByName(const char* name);
// Hook index whose real driver pointer is `fn`, or -1 (pointer identity covers every version
// and stream flavour that cuGetProcAddress can hand out).
int FindHookByRealPointer(const void* fn);

}  // namespace orion::interpose

#define ORION_REAL(name)                               \
  reinterpret_cast<::orion::interpose::RealFn_##name>( \
      ::orion::interpose::g_real_hooks[::orion::interpose::kHook_##name])
#define ORION_DRIVER(name)                               \
  reinterpret_cast<::orion::interpose::DriverFn_##name>( \
      ::orion::interpose::g_driver_fns[::orion::interpose::kDriver_##name])
