// Memory hooks: the per-client quota (allocations that would cross it fail with
// CUDA_ERROR_OUT_OF_MEMORY before reaching the driver), exact used/peak counters, allocation
// events, and cuMemGetInfo virtualised to the quota.
#include "interpose/glibc_compat.h"

#include "interpose/call_log.h"
#include "interpose/client_state.h"
#include "interpose/launch_gate.h"
#include "interpose/memory_quota.h"
#include "interpose/real_driver.h"
#include "interpose/tables.h"

namespace orion::interpose {
namespace {

using contract::EventKind;
using contract::MemoryKind;

void PushMemoryEvent(Registration* reg, EventKind kind, uint64_t address, uint64_t bytes,
                     MemoryKind memory_kind, CUstream stream) {
  contract::Event e{};
  e.kind = kind;
  e.aux = static_cast<uint32_t>(memory_kind);
  e.cpu_ns = MonotonicNs();
  e.func = address;
  e.bytes = bytes;
  e.stream = reinterpret_cast<uint64_t>(stream);
  PushEvent(reg, e);
}

// Reserves `bytes` in the slot's quota; on refusal reports kAllocDenied.
bool Reserve(Registration* reg, uint64_t bytes, MemoryKind kind) {
  const uint64_t limit = reg->slot->memory_limit_bytes.load(std::memory_order_relaxed);
  contract::ClientArea::Counters& counters = reg->area->counters;
  if (TryReserve(counters.memory_used_bytes, counters.memory_peak_bytes, limit, bytes)) {
    return true;
  }
  PushMemoryEvent(reg, EventKind::kAllocDenied, 0, bytes, kind, nullptr);
  return false;
}

// One allocation whose size is known up front. `allocate` performs the real call.
template <typename Allocate>
CUresult GuardedAlloc(const char* call, CUdeviceptr* dptr, uint64_t bytes, MemoryKind kind,
                      CUstream stream, Allocate allocate) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) {
    return CallLogActive() ? LoggedCall(call, nullptr, bytes, allocate) : allocate();
  }
  if (!Reserve(reg, bytes, kind)) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult result = allocate();
  if (result != CUDA_SUCCESS || dptr == nullptr) {
    Unreserve(reg->area->counters.memory_used_bytes, bytes);
    return result;
  }
  if (!g_allocations.Insert(*dptr, bytes, kind)) {
    // Table full: the bytes could never be returned, so do not count them.
    Unreserve(reg->area->counters.memory_used_bytes, bytes);
  }
  PushMemoryEvent(reg, EventKind::kMemAlloc, *dptr, bytes, kind, stream);
  return result;
}

template <typename Free>
CUresult GuardedFree(const char* call, CUdeviceptr dptr, CUstream stream, Free release) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return CallLogActive() ? LoggedCall(call, nullptr, 0, release) : release();
  AllocationTable<65536>::Entry entry{};
  const bool known = g_allocations.Find(dptr, &entry);
  const CUresult result = release();
  if (result == CUDA_SUCCESS && known && g_allocations.Remove(dptr, &entry)) {
    Unreserve(reg->area->counters.memory_used_bytes, entry.bytes);
  }
  if (result == CUDA_SUCCESS) {
    PushMemoryEvent(reg, EventKind::kMemFree, dptr, known ? entry.bytes : 0,
                    known ? entry.kind : MemoryKind::kDevice, stream);
  }
  return result;
}

}  // namespace
}  // namespace orion::interpose

using orion::contract::MemoryKind;
using orion::interpose::CurrentRegistration;
using orion::interpose::GuardedAlloc;
using orion::interpose::GuardedFree;
using orion::interpose::Registration;

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  ORION_REAL_OR_RETURN(cuMemAlloc_v2)
  return GuardedAlloc(__func__, dptr, bytes, MemoryKind::kDevice, nullptr, [&] { return real(dptr, bytes); });
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  ORION_REAL_OR_RETURN(cuMemAllocManaged)
  return GuardedAlloc(__func__, dptr, bytes, MemoryKind::kManaged, nullptr,
                      [&] { return real(dptr, bytes, flags); });
}

#define ORION_ALLOC_ASYNC_HOOK(name)                                        \
  CUresult CUDAAPI name(CUdeviceptr* dptr, size_t bytes, CUstream stream) { \
    ORION_REAL_OR_RETURN(name)                                              \
    return GuardedAlloc(__func__, dptr, bytes, MemoryKind::kAsync, stream,            \
                        [&] { return real(dptr, bytes, stream); });         \
  }
ORION_ALLOC_ASYNC_HOOK(cuMemAllocAsync)
ORION_ALLOC_ASYNC_HOOK(cuMemAllocAsync_ptsz)

#define ORION_ALLOC_POOL_HOOK(name)                                                            \
  CUresult CUDAAPI name(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream) { \
    ORION_REAL_OR_RETURN(name)                                                                 \
    return GuardedAlloc(__func__, dptr, bytes, MemoryKind::kPool, stream,                                \
                        [&] { return real(dptr, bytes, pool, stream); });                      \
  }
ORION_ALLOC_POOL_HOOK(cuMemAllocFromPoolAsync)
ORION_ALLOC_POOL_HOOK(cuMemAllocFromPoolAsync_ptsz)

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                    unsigned int elem) {
  ORION_REAL_OR_RETURN(cuMemAllocPitch_v2)
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return real(dptr, pitch, width, height, elem);
  using orion::interpose::Unreserve;
  // Reserve the unpadded size first, then settle on pitch * height once the driver chose it.
  const uint64_t estimate = static_cast<uint64_t>(width) * height;
  if (!orion::interpose::Reserve(reg, estimate, MemoryKind::kPitch)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = real(dptr, pitch, width, height, elem);
  if (result != CUDA_SUCCESS || dptr == nullptr || pitch == nullptr) {
    Unreserve(reg->area->counters.memory_used_bytes, estimate);
    return result;
  }
  const uint64_t actual = static_cast<uint64_t>(*pitch) * height;
  if (actual > estimate && !orion::interpose::Reserve(reg, actual - estimate, MemoryKind::kPitch)) {
    if (auto free_fn = ORION_REAL(cuMemFree_v2); free_fn != nullptr) free_fn(*dptr);
    Unreserve(reg->area->counters.memory_used_bytes, estimate);
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const uint64_t counted = actual > estimate ? actual : estimate;
  if (!orion::interpose::g_allocations.Insert(*dptr, counted, MemoryKind::kPitch)) {
    Unreserve(reg->area->counters.memory_used_bytes, counted);
  }
  orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemAlloc, *dptr, counted,
                                    MemoryKind::kPitch, nullptr);
  return result;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  ORION_REAL_OR_RETURN(cuMemFree_v2)
  return GuardedFree(__func__, dptr, nullptr, [&] { return real(dptr); });
}

#define ORION_FREE_ASYNC_HOOK(name)                                       \
  CUresult CUDAAPI name(CUdeviceptr dptr, CUstream stream) {              \
    ORION_REAL_OR_RETURN(name)                                            \
    return GuardedFree(__func__, dptr, stream, [&] { return real(dptr, stream); }); \
  }
ORION_FREE_ASYNC_HOOK(cuMemFreeAsync)
ORION_FREE_ASYNC_HOOK(cuMemFreeAsync_ptsz)

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                             const CUmemAllocationProp* prop, unsigned long long flags) {
  ORION_REAL_OR_RETURN(cuMemCreate)
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return real(handle, bytes, prop, flags);
  if (!orion::interpose::Reserve(reg, bytes, MemoryKind::kVmmCreate)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = real(handle, bytes, prop, flags);
  if (result != CUDA_SUCCESS || handle == nullptr) {
    orion::interpose::Unreserve(reg->area->counters.memory_used_bytes, bytes);
    return result;
  }
  if (!orion::interpose::g_vmm_handles.Insert(*handle, bytes, MemoryKind::kVmmCreate)) {
    orion::interpose::Unreserve(reg->area->counters.memory_used_bytes, bytes);
  }
  orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemAlloc, *handle, bytes,
                                    MemoryKind::kVmmCreate, nullptr);
  return result;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  ORION_REAL_OR_RETURN(cuMemRelease)
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return real(handle);
  const CUresult result = real(handle);
  orion::interpose::AllocationTable<16384>::Entry entry{};
  if (result == CUDA_SUCCESS && orion::interpose::g_vmm_handles.Remove(handle, &entry)) {
    orion::interpose::Unreserve(reg->area->counters.memory_used_bytes, entry.bytes);
    orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemFree, handle,
                                      entry.bytes, MemoryKind::kVmmCreate, nullptr);
  }
  return result;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t bytes, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  ORION_REAL_OR_RETURN(cuMemMap)
  const CUresult result = real(ptr, bytes, offset, handle, flags);
  CUcontext ctx = nullptr;
  Registration* reg = result == CUDA_SUCCESS ? CurrentRegistration(&ctx) : nullptr;
  // Timeline only: the bytes were counted when the handle was created.
  if (reg != nullptr) {
    orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemAlloc, ptr, bytes,
                                      MemoryKind::kVmmMap, nullptr);
  }
  return result;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t bytes) {
  ORION_REAL_OR_RETURN(cuMemUnmap)
  const CUresult result = real(ptr, bytes);
  CUcontext ctx = nullptr;
  Registration* reg = result == CUDA_SUCCESS ? CurrentRegistration(&ctx) : nullptr;
  if (reg != nullptr) {
    orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemFree, ptr, bytes,
                                      MemoryKind::kVmmMap, nullptr);
  }
  return result;
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  ORION_REAL_OR_RETURN(cuMemGetInfo_v2)
  const CUresult result = real(free_bytes, total_bytes);
  if (result != CUDA_SUCCESS) return result;
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return result;
  const orion::contract::ClientSlot& slot = *reg->slot;
  orion::interpose::VirtualizeMemInfo(slot.memory_limit_bytes.load(std::memory_order_relaxed),
                                      reg->area->counters.memory_used_bytes.load(
                                          std::memory_order_relaxed),
                                      free_bytes, total_bytes);
  return result;
}
