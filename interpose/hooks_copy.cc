// Copy and memset hooks: one timeline event per call (bytes, stream, direction), nothing else; in
// log mode (no server) one call-log line.
#include "interpose/glibc_compat.h"

#include "interpose/call_log.h"
#include "interpose/client_state.h"
#include "interpose/env_config.h"
#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"

namespace orion::interpose {
namespace {

using contract::CopyDirection;
using contract::EventKind;

// Where a unified address lives, as the driver says (cuPointerGetAttribute); false for memory it
// does not know (pageable host memory) or without the entry point.
bool OnDevice(uint64_t address) {
  auto get = ORION_DRIVER(cuPointerGetAttribute);
  unsigned int type = 0;
  if (get == nullptr ||
      get(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, static_cast<CUdeviceptr>(address)) !=
          CUDA_SUCCESS) {
    return false;
  }
  return type != CU_MEMORYTYPE_HOST;
}

void Report(const char* call, uint64_t started_unix_ns, EventKind kind, CopyDirection direction,
            uint64_t address, uint64_t source, uint64_t bytes, CUstream stream) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr && started_unix_ns == 0) return;
  // cuMemcpy / cuMemcpyAsync (what the CUDA runtime calls for most cudaMemcpy*) copy between
  // unified addresses: the direction is asked of the driver.
  if (kind == EventKind::kMemcpy && direction == CopyDirection::kUnknown) {
    direction = CopyDirectionOf(OnDevice(address), OnDevice(source));
  }
  if (reg == nullptr) {
    if (started_unix_ns != 0) {
      LogCall(call, nullptr, started_unix_ns, RealtimeNs() - started_unix_ns, bytes, direction,
              kind == EventKind::kMemcpy);
    }
    return;
  }
  contract::Event e{};
  e.kind = kind;
  e.aux = static_cast<uint32_t>(direction);
  e.cpu_ns = MonotonicNs();
  e.func = address;
  e.bytes = bytes;
  e.stream = reinterpret_cast<uint64_t>(stream);
  PushEvent(reg, e);
}

}  // namespace
}  // namespace orion::interpose

using orion::contract::CopyDirection;
using orion::contract::EventKind;

// Events are reported after a successful call so failed copies do not appear on the timeline.
#define ORION_REPORT_AFTER(call, kind, direction, address, source, bytes, stream)             \
  const uint64_t orion_t0 =                                                                   \
      orion::interpose::CallLogActive() ? orion::interpose::RealtimeNs() : 0;                 \
  const CUresult result = call;                                                               \
  if (result == CUDA_SUCCESS) {                                                               \
    orion::interpose::Report(__func__, orion_t0, kind, direction,                             \
                             static_cast<uint64_t>(address), (uint64_t)(source), bytes,       \
                             stream);                                                         \
  }                                                                                           \
  return result;

#define ORION_COPY_SYNC(name, dst_type, src_type, direction)                                  \
  CUresult CUDAAPI name(dst_type dst, src_type src, size_t bytes) {                           \
    ORION_REAL_OR_RETURN(name)                                                                \
    ORION_REPORT_AFTER(real(dst, src, bytes), EventKind::kMemcpy, direction, (uint64_t)(dst), \
                       src, bytes, nullptr)                                                   \
  }
#define ORION_COPY_ASYNC(name, dst_type, src_type, direction)                        \
  CUresult CUDAAPI name(dst_type dst, src_type src, size_t bytes, CUstream stream) { \
    ORION_REAL_OR_RETURN(name)                                                       \
    ORION_REPORT_AFTER(real(dst, src, bytes, stream), EventKind::kMemcpy, direction, \
                       (uint64_t)(dst), src, bytes, stream)                          \
  }

ORION_COPY_SYNC(cuMemcpy, CUdeviceptr, CUdeviceptr, CopyDirection::kUnknown)
ORION_COPY_SYNC(cuMemcpy_ptds, CUdeviceptr, CUdeviceptr, CopyDirection::kUnknown)
ORION_COPY_ASYNC(cuMemcpyAsync, CUdeviceptr, CUdeviceptr, CopyDirection::kUnknown)
ORION_COPY_ASYNC(cuMemcpyAsync_ptsz, CUdeviceptr, CUdeviceptr, CopyDirection::kUnknown)
ORION_COPY_SYNC(cuMemcpyHtoD_v2, CUdeviceptr, const void*, CopyDirection::kHostToDevice)
ORION_COPY_SYNC(cuMemcpyHtoD_v2_ptds, CUdeviceptr, const void*, CopyDirection::kHostToDevice)
ORION_COPY_SYNC(cuMemcpyDtoH_v2, void*, CUdeviceptr, CopyDirection::kDeviceToHost)
ORION_COPY_SYNC(cuMemcpyDtoH_v2_ptds, void*, CUdeviceptr, CopyDirection::kDeviceToHost)
ORION_COPY_SYNC(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr, CopyDirection::kDeviceToDevice)
ORION_COPY_SYNC(cuMemcpyDtoD_v2_ptds, CUdeviceptr, CUdeviceptr, CopyDirection::kDeviceToDevice)
ORION_COPY_ASYNC(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void*, CopyDirection::kHostToDevice)
ORION_COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, CUdeviceptr, const void*, CopyDirection::kHostToDevice)
ORION_COPY_ASYNC(cuMemcpyDtoHAsync_v2, void*, CUdeviceptr, CopyDirection::kDeviceToHost)
ORION_COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, void*, CUdeviceptr, CopyDirection::kDeviceToHost)
ORION_COPY_ASYNC(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr, CopyDirection::kDeviceToDevice)
ORION_COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, CUdeviceptr, CUdeviceptr,
                 CopyDirection::kDeviceToDevice)

#define ORION_MEMSET_SYNC(name, value_type, element_bytes)                                        \
  CUresult CUDAAPI name(CUdeviceptr dst, value_type value, size_t count) {                        \
    ORION_REAL_OR_RETURN(name)                                                                    \
    ORION_REPORT_AFTER(real(dst, value, count), EventKind::kMemset, CopyDirection::kUnknown, dst, \
                       0, count*(element_bytes), nullptr)                                         \
  }
#define ORION_MEMSET_ASYNC(name, value_type, element_bytes)                                 \
  CUresult CUDAAPI name(CUdeviceptr dst, value_type value, size_t count, CUstream stream) { \
    ORION_REAL_OR_RETURN(name)                                                              \
    ORION_REPORT_AFTER(real(dst, value, count, stream), EventKind::kMemset,                 \
                       CopyDirection::kUnknown, dst, 0, count*(element_bytes), stream)      \
  }

ORION_MEMSET_SYNC(cuMemsetD8_v2, unsigned char, 1)
ORION_MEMSET_SYNC(cuMemsetD8_v2_ptds, unsigned char, 1)
ORION_MEMSET_SYNC(cuMemsetD32_v2, unsigned int, 4)
ORION_MEMSET_SYNC(cuMemsetD32_v2_ptds, unsigned int, 4)
ORION_MEMSET_ASYNC(cuMemsetD8Async, unsigned char, 1)
ORION_MEMSET_ASYNC(cuMemsetD8Async_ptsz, unsigned char, 1)
ORION_MEMSET_ASYNC(cuMemsetD32Async, unsigned int, 4)
ORION_MEMSET_ASYNC(cuMemsetD32Async_ptsz, unsigned int, 4)
