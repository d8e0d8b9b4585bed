// CUDA driver ABI as the interposer sees it: cuda.h types, the hook list expanded into an enum,
// pointer types and exported prototypes, and the bookkeeping driver functions.
//
// cuda.h renames entry points with macros (cuMemAlloc -> cuMemAlloc_v2, cuGraphInstantiate ->
// cuGraphInstantiateWithFlags, cuGetProcAddress -> cuGetProcAddress_v2); the few macros that
// collide with ABI names in our list are removed here so every name means the exported symbol.
#pragma once

#include <cuda.h>

#undef cuGetProcAddress
#undef cuGraphAddNode
#undef cuGetProcAddress_v2
#undef cuGraphInstantiate
#undef cuMemcpy
#undef cuMemcpyAsync
#undef cuMemsetD8Async
#undef cuMemsetD32Async
#undef cuLaunchKernel
#undef cuLaunchKernelEx
#undef cuLaunchCooperativeKernel
#undef cuGraphLaunch
#undef cuGraphInstantiateWithParams
#undef cuMemAllocAsync
#undef cuMemFreeAsync
#undef cuMemAllocFromPoolAsync
#undef cuEventRecord
#undef cuStreamIsCapturing
#undef cuStreamBeginCapture
#undef cuStreamBeginCaptureToGraph
#undef cuStreamEndCapture

#define ORION_EXPORT extern "C" __attribute__((visibility("default")))

// Exported hook prototypes (a body with another signature fails to compile).
#define ORION_HOOK(name, params, args) ORION_EXPORT CUresult CUDAAPI name params;
#include "interpose/hooked_functions.def"
#undef ORION_HOOK

namespace orion::interpose {

enum HookId : int {
#define ORION_HOOK(name, params, args) kHook_##name,
#include "interpose/hooked_functions.def"
#undef ORION_HOOK
  kHookCount
};

// Pointer types of the real driver functions, one per hook: Real_cuMemAlloc_v2 etc.
#define ORION_HOOK(name, params, args) using RealFn_##name = CUresult(CUDAAPI*) params;
#include "interpose/hooked_functions.def"
#undef ORION_HOOK

enum DriverFnId : int {
#define ORION_DRIVER_FN(name, fallback, params) kDriver_##name,
#include "interpose/driver_functions.def"
#undef ORION_DRIVER_FN
  kDriverFnCount
};

#define ORION_DRIVER_FN(name, fallback, params) using DriverFn_##name = CUresult(CUDAAPI*) params;
#include "interpose/driver_functions.def"
#undef ORION_DRIVER_FN

}  // namespace orion::interpose
