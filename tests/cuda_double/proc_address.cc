// cuGetProcAddress and the error-name calls of the CUDA driver test double (the libcuda.so.1
// stand-in for machines without a GPU).
//
// One table, ORION_DOUBLE_ENTRY_POINTS, lists every entry point the double exports under the
// unversioned name that callers pass to cuGetProcAddress, the first CUDA version that maps the
// name to that ABI symbol, and its per-thread-default-stream (_ptsz/_ptds) twin. A look-up picks
// the newest row not newer than the caller's cudaVersion, as the driver does.
#include <cstring>

#include "tests/cuda_double/driver_objects.h"

namespace orion::cuda_double {
namespace {

// X(name, since_version, default_symbol, per_thread_symbol)
// clang-format off
#define ORION_DOUBLE_ENTRY_POINTS(X)                                                        \
  X(cuInit, 2000, cuInit, cuInit)                                                           \
  X(cuDriverGetVersion, 2020, cuDriverGetVersion, cuDriverGetVersion)                       \
  X(cuDeviceGet, 2000, cuDeviceGet, cuDeviceGet)                                            \
  X(cuDeviceGetCount, 2000, cuDeviceGetCount, cuDeviceGetCount)                             \
  X(cuDeviceGetName, 2000, cuDeviceGetName, cuDeviceGetName)                                \
  X(cuDeviceGetUuid, 9020, cuDeviceGetUuid, cuDeviceGetUuid)                                \
  X(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2, cuDeviceGetUuid_v2)                         \
  X(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2, cuDeviceTotalMem_v2)                       \
  X(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute, cuDeviceGetAttribute)                 \
  X(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)     \
  X(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease)  \
  X(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2,                         \
    cuDevicePrimaryCtxRelease_v2)                                                           \
  X(cuCtxCreate, 2000, cuCtxCreate, cuCtxCreate)                                            \
  X(cuCtxCreate, 3020, cuCtxCreate_v2, cuCtxCreate_v2)                                      \
  X(cuCtxCreate, 11040, cuCtxCreate_v3, cuCtxCreate_v3)                                     \
  X(cuCtxCreate, 12050, cuCtxCreate_v4, cuCtxCreate_v4)                                     \
  X(cuCtxDestroy, 4000, cuCtxDestroy_v2, cuCtxDestroy_v2)                                   \
  X(cuCtxSetCurrent, 4000, cuCtxSetCurrent, cuCtxSetCurrent)                                \
  X(cuCtxGetCurrent, 4000, cuCtxGetCurrent, cuCtxGetCurrent)                                \
  X(cuCtxGetDevice, 2000, cuCtxGetDevice, cuCtxGetDevice)                                   \
  X(cuCtxGetId, 12000, cuCtxGetId, cuCtxGetId)                                               \
  X(cuCtxSynchronize, 2000, cuCtxSynchronize, cuCtxSynchronize)                             \
  X(cuModuleLoadData, 2000, cuModuleLoadData, cuModuleLoadData)                             \
  X(cuModuleLoadDataEx, 2010, cuModuleLoadDataEx, cuModuleLoadDataEx)                       \
  X(cuModuleGetFunction, 2000, cuModuleGetFunction, cuModuleGetFunction)                    \
  X(cuModuleUnload, 2000, cuModuleUnload, cuModuleUnload)                                   \
  X(cuFuncGetName, 12030, cuFuncGetName, cuFuncGetName)                                     \
  X(cuLaunchKernel, 4000, cuLaunchKernel, cuLaunchKernel_ptsz)                              \
  X(cuLaunchKernelEx, 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz)                       \
  X(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel,                             \
    cuLaunchCooperativeKernel_ptsz)                                                         \
  X(cuStreamCreate, 2000, cuStreamCreate, cuStreamCreate)                                   \
  X(cuStreamDestroy, 4000, cuStreamDestroy_v2, cuStreamDestroy_v2)                          \
  X(cuStreamSynchronize, 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz)               \
  X(cuStreamQuery, 2000, cuStreamQuery, cuStreamQuery_ptsz)                                 \
  X(cuStreamWaitValue32, 12000, cuStreamWaitValue32_v2, cuStreamWaitValue32_v2_ptsz)        \
  X(cuMemHostRegister, 6050, cuMemHostRegister_v2, cuMemHostRegister_v2)                    \
  X(cuMemHostUnregister, 4000, cuMemHostUnregister, cuMemHostUnregister)                    \
  X(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2,                          \
    cuMemHostGetDevicePointer_v2)                                                           \
  X(cuEventCreate, 2000, cuEventCreate, cuEventCreate)                                      \
  X(cuEventRecord, 2000, cuEventRecord, cuEventRecord_ptsz)                                 \
  X(cuEventQuery, 2000, cuEventQuery, cuEventQuery)                                         \
  X(cuEventSynchronize, 2000, cuEventSynchronize, cuEventSynchronize)                       \
  X(cuEventElapsedTime, 2000, cuEventElapsedTime, cuEventElapsedTime)                       \
  X(cuEventElapsedTime, 12080, cuEventElapsedTime_v2, cuEventElapsedTime_v2)                \
  X(cuEventDestroy, 4000, cuEventDestroy_v2, cuEventDestroy_v2)                             \
  X(cuMemAlloc, 3020, cuMemAlloc_v2, cuMemAlloc_v2)                                         \
  X(cuMemAllocPitch, 3020, cuMemAllocPitch_v2, cuMemAllocPitch_v2)                          \
  X(cuMemAllocManaged, 6000, cuMemAllocManaged, cuMemAllocManaged)                          \
  X(cuMemFree, 3020, cuMemFree_v2, cuMemFree_v2)                                            \
  X(cuMemGetInfo, 3020, cuMemGetInfo_v2, cuMemGetInfo_v2)                                   \
  X(cuArrayCreate, 3020, cuArrayCreate_v2, cuArrayCreate_v2)                               \
  X(cuArray3DCreate, 3020, cuArray3DCreate_v2, cuArray3DCreate_v2)                          \
  X(cuMipmappedArrayCreate, 5000, cuMipmappedArrayCreate, cuMipmappedArrayCreate)           \
  X(cuArrayDestroy, 2000, cuArrayDestroy, cuArrayDestroy)                                   \
  X(cuMipmappedArrayDestroy, 5000, cuMipmappedArrayDestroy, cuMipmappedArrayDestroy)        \
  X(cuCtxSetLimit, 3010, cuCtxSetLimit, cuCtxSetLimit)                                      \
  X(cuCtxGetLimit, 3010, cuCtxGetLimit, cuCtxGetLimit)                                      \
  X(cuMemAllocAsync, 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz)                          \
  X(cuMemFreeAsync, 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz)                             \
  X(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz)  \
  X(cuMemPoolCreate, 11020, cuMemPoolCreate, cuMemPoolCreate)                               \
  X(cuMemPoolDestroy, 11020, cuMemPoolDestroy, cuMemPoolDestroy)                            \
  X(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity,                    \
    cuMemGetAllocationGranularity)                                                          \
  X(cuMemAddressReserve, 10020, cuMemAddressReserve, cuMemAddressReserve)                   \
  X(cuMemAddressFree, 10020, cuMemAddressFree, cuMemAddressFree)                            \
  X(cuMemCreate, 10020, cuMemCreate, cuMemCreate)                                           \
  X(cuMemRelease, 10020, cuMemRelease, cuMemRelease)                                        \
  X(cuMemMap, 10020, cuMemMap, cuMemMap)                                                    \
  X(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle,                         \
    cuMemRetainAllocationHandle)                                                             \
  X(cuMemUnmap, 10020, cuMemUnmap, cuMemUnmap)                                              \
  X(cuMemSetAccess, 10020, cuMemSetAccess, cuMemSetAccess)                                  \
  X(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds)                              \
  X(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)                              \
  X(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds)                              \
  X(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)               \
  X(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)               \
  X(cuMemcpy, 4000, cuMemcpy, cuMemcpy_ptds)                                                \
  X(cuMemcpyAsync, 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz)                                 \
  X(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz)               \
  X(cuMemsetD8, 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds)                                    \
  X(cuMemsetD8Async, 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz)                           \
  X(cuMemsetD32Async, 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz)                        \
  X(cuMemsetD32, 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds)                                 \
  X(cuStreamBeginCapture, 10000, cuStreamBeginCapture, cuStreamBeginCapture_ptsz)           \
  X(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz)     \
  X(cuStreamEndCapture, 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz)                 \
  X(cuStreamIsCapturing, 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz)              \
  X(cuGraphInstantiate, 10000, cuGraphInstantiate, cuGraphInstantiate)                      \
  X(cuGraphInstantiate, 11000, cuGraphInstantiate_v2, cuGraphInstantiate_v2)                \
  X(cuGraphInstantiate, 12000, cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags)    \
  X(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags,                        \
    cuGraphInstantiateWithFlags)                                                            \
  X(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams,                      \
    cuGraphInstantiateWithParams_ptsz)                                                      \
  X(cuGraphLaunch, 10000, cuGraphLaunch, cuGraphLaunch_ptsz)                                \
  X(cuGraphChildGraphNodeGetGraph, 10000, cuGraphChildGraphNodeGetGraph,                    \
    cuGraphChildGraphNodeGetGraph)                                                          \
  X(cuGraphGetNodes, 10000, cuGraphGetNodes, cuGraphGetNodes)                               \
  X(cuGraphNodeGetType, 10000, cuGraphNodeGetType, cuGraphNodeGetType)                      \
  X(cuGraphExecDestroy, 10000, cuGraphExecDestroy, cuGraphExecDestroy)                      \
  X(cuGraphDestroy, 10000, cuGraphDestroy, cuGraphDestroy)                                  \
  X(cuGetErrorName, 6000, cuGetErrorName, cuGetErrorName)                                   \
  X(cuGetErrorString, 6000, cuGetErrorString, cuGetErrorString)                             \
  X(cuGetProcAddress, 11030, cuGetProcAddress, cuGetProcAddress)                            \
  X(cuGetProcAddress, 12000, cuGetProcAddress_v2, cuGetProcAddress_v2)

// clang-format on

struct EntryPoint {
  const char* name;
  int since_version;
  void* symbol;
  void* per_thread_symbol;
};

#define ORION_DOUBLE_ENTRY_ROW(name, version, symbol, ptds) \
  EntryPoint{#name, version, reinterpret_cast<void*>(&symbol), reinterpret_cast<void*>(&ptds)},
const EntryPoint kEntryPoints[] = {ORION_DOUBLE_ENTRY_POINTS(ORION_DOUBLE_ENTRY_ROW)};
#undef ORION_DOUBLE_ENTRY_ROW

// Every CUresult of CUDA 13.0 (cuda.h order), as name suffixes after "CUDA_".
// clang-format off
#define ORION_DOUBLE_RESULTS(X)                                                                \
  X(SUCCESS) X(ERROR_INVALID_VALUE) X(ERROR_OUT_OF_MEMORY) X(ERROR_NOT_INITIALIZED) \
  X(ERROR_DEINITIALIZED) X(ERROR_PROFILER_DISABLED) X(ERROR_PROFILER_NOT_INITIALIZED) \
  X(ERROR_PROFILER_ALREADY_STARTED) X(ERROR_PROFILER_ALREADY_STOPPED) X(ERROR_STUB_LIBRARY) \
  X(ERROR_CALL_REQUIRES_NEWER_DRIVER) X(ERROR_DEVICE_UNAVAILABLE) X(ERROR_NO_DEVICE) \
  X(ERROR_INVALID_DEVICE) X(ERROR_DEVICE_NOT_LICENSED) X(ERROR_INVALID_IMAGE) \
  X(ERROR_INVALID_CONTEXT) X(ERROR_CONTEXT_ALREADY_CURRENT) X(ERROR_MAP_FAILED) \
  X(ERROR_UNMAP_FAILED) X(ERROR_ARRAY_IS_MAPPED) X(ERROR_ALREADY_MAPPED) \
  X(ERROR_NO_BINARY_FOR_GPU) X(ERROR_ALREADY_ACQUIRED) X(ERROR_NOT_MAPPED) \
  X(ERROR_NOT_MAPPED_AS_ARRAY) X(ERROR_NOT_MAPPED_AS_POINTER) X(ERROR_ECC_UNCORRECTABLE) \
  X(ERROR_UNSUPPORTED_LIMIT) X(ERROR_CONTEXT_ALREADY_IN_USE) X(ERROR_PEER_ACCESS_UNSUPPORTED) \
  X(ERROR_INVALID_PTX) X(ERROR_INVALID_GRAPHICS_CONTEXT) X(ERROR_NVLINK_UNCORRECTABLE) \
  X(ERROR_JIT_COMPILER_NOT_FOUND) X(ERROR_UNSUPPORTED_PTX_VERSION) \
  X(ERROR_JIT_COMPILATION_DISABLED) X(ERROR_UNSUPPORTED_EXEC_AFFINITY) \
  X(ERROR_UNSUPPORTED_DEVSIDE_SYNC) X(ERROR_CONTAINED) X(ERROR_INVALID_SOURCE) \
  X(ERROR_FILE_NOT_FOUND) X(ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND) \
  X(ERROR_SHARED_OBJECT_INIT_FAILED) X(ERROR_OPERATING_SYSTEM) X(ERROR_INVALID_HANDLE) \
  X(ERROR_ILLEGAL_STATE) X(ERROR_LOSSY_QUERY) X(ERROR_NOT_FOUND) X(ERROR_NOT_READY) \
  X(ERROR_ILLEGAL_ADDRESS) X(ERROR_LAUNCH_OUT_OF_RESOURCES) X(ERROR_LAUNCH_TIMEOUT) \
  X(ERROR_LAUNCH_INCOMPATIBLE_TEXTURING) X(ERROR_PEER_ACCESS_ALREADY_ENABLED) \
  X(ERROR_PEER_ACCESS_NOT_ENABLED) X(ERROR_PRIMARY_CONTEXT_ACTIVE) X(ERROR_CONTEXT_IS_DESTROYED) \
  X(ERROR_ASSERT) X(ERROR_TOO_MANY_PEERS) X(ERROR_HOST_MEMORY_ALREADY_REGISTERED) \
  X(ERROR_HOST_MEMORY_NOT_REGISTERED) X(ERROR_HARDWARE_STACK_ERROR) X(ERROR_ILLEGAL_INSTRUCTION) \
  X(ERROR_MISALIGNED_ADDRESS) X(ERROR_INVALID_ADDRESS_SPACE) X(ERROR_INVALID_PC) \
  X(ERROR_LAUNCH_FAILED) X(ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) X(ERROR_TENSOR_MEMORY_LEAK) \
  X(ERROR_NOT_PERMITTED) X(ERROR_NOT_SUPPORTED) X(ERROR_SYSTEM_NOT_READY) \
  X(ERROR_SYSTEM_DRIVER_MISMATCH) X(ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE) \
  X(ERROR_MPS_CONNECTION_FAILED) X(ERROR_MPS_RPC_FAILURE) X(ERROR_MPS_SERVER_NOT_READY) \
  X(ERROR_MPS_MAX_CLIENTS_REACHED) X(ERROR_MPS_MAX_CONNECTIONS_REACHED) \
  X(ERROR_MPS_CLIENT_TERMINATED) X(ERROR_CDP_NOT_SUPPORTED) X(ERROR_CDP_VERSION_MISMATCH) \
  X(ERROR_STREAM_CAPTURE_UNSUPPORTED) X(ERROR_STREAM_CAPTURE_INVALIDATED) \
  X(ERROR_STREAM_CAPTURE_MERGE) X(ERROR_STREAM_CAPTURE_UNMATCHED) \
  X(ERROR_STREAM_CAPTURE_UNJOINED) X(ERROR_STREAM_CAPTURE_ISOLATION) \
  X(ERROR_STREAM_CAPTURE_IMPLICIT) X(ERROR_CAPTURED_EVENT) X(ERROR_STREAM_CAPTURE_WRONG_THREAD) \
  X(ERROR_TIMEOUT) X(ERROR_GRAPH_EXEC_UPDATE_FAILURE) X(ERROR_EXTERNAL_DEVICE) \
  X(ERROR_INVALID_CLUSTER_SIZE) X(ERROR_FUNCTION_NOT_LOADED) X(ERROR_INVALID_RESOURCE_TYPE) \
  X(ERROR_INVALID_RESOURCE_CONFIGURATION) X(ERROR_KEY_ROTATION) X(ERROR_UNKNOWN)

// clang-format on

struct ResultName {
  CUresult code;
  const char* name;
};
#define ORION_DOUBLE_RESULT_ROW(suffix) ResultName{CUDA_##suffix, "CUDA_" #suffix},
const ResultName kResultNames[] = {ORION_DOUBLE_RESULTS(ORION_DOUBLE_RESULT_ROW)};
#undef ORION_DOUBLE_RESULT_ROW

const ResultName* FindResult(CUresult code) {
  for (const ResultName& row : kResultNames) {
    if (row.code == code) return &row;
  }
  return nullptr;
}

// "CUDA_ERROR_OUT_OF_MEMORY" -> "out of memory": built once per code, kept for the process.
const char* Description(const ResultName& row) {
  static char(*texts)[64] = new char[sizeof(kResultNames) / sizeof(kResultNames[0])][64]();
  char* text = texts[&row - kResultNames];
  if (text[0] == '\0') {
    const char* words = row.name + (strncmp(row.name, "CUDA_ERROR_", 11) == 0 ? 11 : 5);
    size_t i = 0;
    for (; words[i] != '\0' && i + 1 < 64; ++i) {
      const char c = words[i];
      text[i] = c == '_' ? ' ' : static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    text[i] = '\0';
  }
  return text;
}

CUresult Lookup(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const EntryPoint* best = nullptr;
  bool known = false;
  for (const EntryPoint& row : kEntryPoints) {
    if (strcmp(row.name, symbol) != 0) continue;
    known = true;
    if (row.since_version <= cuda_version &&
        (best == nullptr || row.since_version > best->since_version)) {
      best = &row;
    }
  }
  if (best == nullptr) {
    if (known && status != nullptr) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = per_thread ? best->per_thread_symbol : best->symbol;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace orion::cuda_double

extern "C" {

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto* row = orion::cuda_double::FindResult(error);
  *name = row == nullptr ? nullptr : row->name;
  return row == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto* row = orion::cuda_double::FindResult(error);
  *text = row == nullptr ? nullptr : orion::cuda_double::Description(*row);
  return row == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                  cuuint64_t flags) {
  return orion::cuda_double::Lookup(symbol, pfn, cuda_version, flags, nullptr);
}

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  return orion::cuda_double::Lookup(symbol, pfn, cuda_version, flags, status);
}

}  // extern "C"
