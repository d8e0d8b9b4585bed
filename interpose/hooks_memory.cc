// Memory hooks: the memory quota, per pod (allocations that would take the pod's processes
// together past its limit fail with CUDA_ERROR_OUT_OF_MEMORY before reaching the driver), exact used/peak counters, allocation
// events, and cuMemGetInfo virtualised to the quota. Device memory, VMM handles, CUDA arrays
// and the device-side malloc heap are all counted. Under a limit, an allocation the fixed-size
// tables cannot remember is refused (it could never be given back, so counting it would leak
// quota and not counting it would escape the quota); without a limit it goes uncounted.
#include "interpose/glibc_compat.h"

#include <sys/mman.h>

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

// Reserves `bytes` in the client's own counters and in the pod's quota (the quota area every
// process of the pod draws from), each against the limit the server put on our read-only slot;
// on refusal reports kAllocDenied. The own count is held to the limit too: any process of the
// pod may write over the pod's counter, and rewritten to small values while this process
// allocates it alone let it hold 7 chunks of 16 MiB under a 64 MiB limit (pod_quota_test).
bool Reserve(Registration* reg, uint64_t bytes, MemoryKind kind) {
  const uint64_t limit = reg->slot->memory_limit_bytes.load(std::memory_order_relaxed);
  contract::ClientArea::Counters& own = reg->area->counters;
  if (TryReserve(own.memory_used_bytes, own.memory_peak_bytes, limit, bytes)) {
    contract::QuotaArea::Counters& pod = reg->quota->counters;
    if (TryReserve(pod.used_bytes, pod.peak_bytes, limit, bytes)) return true;
    Unreserve(own.memory_used_bytes, bytes);
  }
  PushMemoryEvent(reg, EventKind::kAllocDenied, 0, bytes, kind, nullptr);
  return false;
}

// Gives back what Reserve took.
void Refund(Registration* reg, uint64_t bytes) {
  Unreserve(reg->quota->counters.used_bytes, bytes);
  Unreserve(reg->area->counters.memory_used_bytes, bytes);
}

// Under a limit, a full table refuses: the allocation could not be accounted for at free time.
bool TableRefuses(Registration* reg, bool table_full, uint64_t bytes, MemoryKind kind) {
  if (!table_full || reg->slot->memory_limit_bytes.load(std::memory_order_relaxed) == 0) {
    return false;
  }
  PushMemoryEvent(reg, EventKind::kAllocDenied, 0, bytes, kind, nullptr);
  return true;
}

// Gives back an allocation the table had no room for (a race at the table's boundary).
void ReleaseUntracked(CUdeviceptr ptr, MemoryKind kind, CUstream stream) {
  if (kind == MemoryKind::kAsync || kind == MemoryKind::kPool) {
    if (auto free_async = ORION_REAL(cuMemFreeAsync); free_async != nullptr) {
      free_async(ptr, stream);
    }
  } else if (auto free_fn = ORION_REAL(cuMemFree_v2); free_fn != nullptr) {
    free_fn(ptr);
  }
}

// Remembers what an allocation cost, or, when the table has no room: under a limit gives the
// allocation back with `release` and returns false (refused); without one leaves it uncounted.
template <size_t kCapacity, typename Release>
bool Remember(Registration* reg, AllocationTable<kCapacity>& table, uint64_t key, uint64_t bytes,
              MemoryKind kind, uint32_t count, uint64_t link, Release release) {
  if (table.Insert(key, bytes, kind, count, link)) return true;
  Refund(reg, bytes);
  if (reg->slot->memory_limit_bytes.load(std::memory_order_relaxed) == 0) return true;
  release();
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
  if (TableRefuses(reg, g_allocations.full(), bytes, kind)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!Reserve(reg, bytes, kind)) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult result = allocate();
  if (result != CUDA_SUCCESS || dptr == nullptr) {
    Refund(reg, bytes);
    return result;
  }
  const CUdeviceptr ptr = *dptr;
  if (!Remember(reg, g_allocations, ptr, bytes, kind, 0, 0,
                [&] { ReleaseUntracked(ptr, kind, stream); })) {
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  PushMemoryEvent(reg, EventKind::kMemAlloc, *dptr, bytes, kind, stream);
  return result;
}

template <typename Free>
CUresult GuardedFree(const char* call, CUdeviceptr dptr, CUstream stream, Free release) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return CallLogActive() ? LoggedCall(call, nullptr, 0, release) : release();
  decltype(g_allocations)::Entry entry{};
  const bool known = g_allocations.Find(dptr, &entry);
  const CUresult result = release();
  if (result == CUDA_SUCCESS && known && g_allocations.Remove(dptr, &entry)) {
    Refund(reg, entry.bytes);
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
  // Reserve the unpadded size first, then settle on pitch * height once the driver chose it.
  const uint64_t estimate = static_cast<uint64_t>(width) * height;
  if (orion::interpose::TableRefuses(reg, orion::interpose::g_allocations.full(), estimate,
                                     MemoryKind::kPitch) ||
      !orion::interpose::Reserve(reg, estimate, MemoryKind::kPitch)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = real(dptr, pitch, width, height, elem);
  if (result != CUDA_SUCCESS || dptr == nullptr || pitch == nullptr) {
    orion::interpose::Refund(reg, estimate);
    return result;
  }
  const uint64_t actual = static_cast<uint64_t>(*pitch) * height;
  if (actual > estimate && !orion::interpose::Reserve(reg, actual - estimate, MemoryKind::kPitch)) {
    if (auto free_fn = ORION_REAL(cuMemFree_v2); free_fn != nullptr) free_fn(*dptr);
    orion::interpose::Refund(reg, estimate);
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const uint64_t counted = actual > estimate ? actual : estimate;
  const CUdeviceptr ptr = *dptr;
  if (!orion::interpose::Remember(reg, orion::interpose::g_allocations, ptr, counted,
                                  MemoryKind::kPitch, 0, 0, [&] {
                                    orion::interpose::ReleaseUntracked(ptr, MemoryKind::kPitch,
                                                                       nullptr);
                                  })) {
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
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

// VMM: a handle's physical memory lives until it is released and its last mapping is gone
// (releasing right after mapping is the documented pattern; PyTorch's expandable segments do
// it). So a handle's bytes stay counted from cuMemCreate until both: its entry counts its live
// mappings and its references (creation and cuMemRetainAllocationHandle, less cuMemRelease),
// and each mapping remembers its handle.
CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                             const CUmemAllocationProp* prop, unsigned long long flags) {
  ORION_REAL_OR_RETURN(cuMemCreate)
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return real(handle, bytes, prop, flags);
  if (orion::interpose::TableRefuses(reg, orion::interpose::g_vmm_handles.full(), bytes,
                                     MemoryKind::kVmmCreate) ||
      !orion::interpose::Reserve(reg, bytes, MemoryKind::kVmmCreate)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = real(handle, bytes, prop, flags);
  if (result != CUDA_SUCCESS || handle == nullptr) {
    orion::interpose::Refund(reg, bytes);
    return result;
  }
  const CUmemGenericAllocationHandle created = *handle;
  if (!orion::interpose::Remember(reg, orion::interpose::g_vmm_handles, created, bytes,
                                  MemoryKind::kVmmCreate, /*mappings=*/0, /*references=*/1,
                                  [&] {
                                    if (auto release = ORION_REAL(cuMemRelease)) release(created);
                                  })) {
    *handle = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemAlloc, *handle, bytes,
                                    MemoryKind::kVmmCreate, nullptr);
  return result;
}

namespace orion::interpose {
namespace {

// Changes a handle's mappings and references by the deltas, and adds `bytes` to what it counts
// (an imported handle's, counted as they are mapped); once it is released and unmapped its bytes
// are given back to `reg` (none: they stay counted, the safe side).
void ChangeVmmHandle(Registration* reg, CUmemGenericAllocationHandle handle, int mappings,
                     int references, uint64_t bytes = 0) {
  AllocationTable<16384>::Entry entry{};
  const bool gone = g_vmm_handles.Change(
                        handle,
                        [&](AllocationTable<16384>::Entry& e) {
                          e.bytes += bytes;
                          e.count = mappings < 0 && e.count == 0 ? 0 : e.count + mappings;
                          e.link = references < 0 && e.link == 0 ? 0 : e.link + references;
                          return e.count == 0 && e.link == 0;
                        },
                        &entry) &&
                    entry.count == 0 && entry.link == 0;
  if (gone && reg != nullptr) {
    Refund(reg, entry.bytes);
    PushMemoryEvent(reg, EventKind::kMemFree, handle, entry.bytes, MemoryKind::kVmmCreate,
                    nullptr);
  }
}

}  // namespace
}  // namespace orion::interpose

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  ORION_REAL_OR_RETURN(cuMemRelease)
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return real(handle);
  const CUresult result = real(handle);
  if (result == CUDA_SUCCESS) orion::interpose::ChangeVmmHandle(reg, handle, 0, -1);
  return result;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  ORION_REAL_OR_RETURN(cuMemRetainAllocationHandle)
  const CUresult result = real(handle, addr);
  if (result == CUDA_SUCCESS && handle != nullptr) {
    CUcontext ctx = nullptr;
    orion::interpose::ChangeVmmHandle(CurrentRegistration(&ctx), *handle, 0, +1);
  }
  return result;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t bytes, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  ORION_REAL_OR_RETURN(cuMemMap)
  const CUresult result = real(ptr, bytes, offset, handle, flags);
  CUcontext ctx = nullptr;
  Registration* reg = result == CUDA_SUCCESS ? CurrentRegistration(&ctx) : nullptr;
  if (reg == nullptr) return result;
  // A counted handle's mapping keeps its bytes counted until it is unmapped; an imported
  // handle's bytes (its size unknown until now) are counted as it is mapped. Under a limit, a
  // mapping past it, or one the table cannot remember, is undone and refused: unremembered, its
  // handle's bytes could never be given back.
  orion::interpose::AllocationTable<16384>::Entry counted{};
  if (orion::interpose::g_vmm_handles.Find(handle, &counted)) {
    const bool imported = counted.kind == MemoryKind::kVmmMap;
    const bool limited = reg->slot->memory_limit_bytes.load(std::memory_order_relaxed) != 0;
    auto refuse = [&] {
      if (auto unmap = ORION_REAL(cuMemUnmap)) unmap(ptr, bytes);
      orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kAllocDenied, 0, bytes,
                                        MemoryKind::kVmmMap, nullptr);
      return CUDA_ERROR_OUT_OF_MEMORY;
    };
    if (imported && !orion::interpose::Reserve(reg, bytes, MemoryKind::kVmmMap)) return refuse();
    if (!orion::interpose::g_vmm_mappings.Insert(ptr, bytes, MemoryKind::kVmmMap, 0, handle)) {
      if (imported) orion::interpose::Refund(reg, bytes);
      if (limited) return refuse();
    } else {
      orion::interpose::ChangeVmmHandle(reg, handle, +1, 0, imported ? bytes : 0);
    }
  }
  // The mapping on the timeline (its bytes are its handle's, counted at cuMemCreate).
  orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemAlloc, ptr, bytes,
                                    MemoryKind::kVmmMap, nullptr);
  return result;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t bytes) {
  ORION_REAL_OR_RETURN(cuMemUnmap)
  const CUresult result = real(ptr, bytes);
  CUcontext ctx = nullptr;
  Registration* reg = result == CUDA_SUCCESS ? CurrentRegistration(&ctx) : nullptr;
  if (result != CUDA_SUCCESS) return result;
  // The range may cover several adjacent mappings: each is looked up at its start (no scan),
  // at most as many as the table holds.
  uint64_t cursor = ptr;
  for (size_t i = 0; cursor < ptr + bytes && i < orion::interpose::g_vmm_mappings.capacity();
       ++i) {
    orion::interpose::AllocationTable<16384>::Entry mapping{};
    if (!orion::interpose::g_vmm_mappings.Remove(cursor, &mapping) || mapping.bytes == 0) break;
    orion::interpose::ChangeVmmHandle(reg, mapping.link, -1, 0);
    cursor += mapping.bytes;
  }
  if (reg != nullptr) {
    orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemFree, ptr, bytes,
                                      MemoryKind::kVmmMap, nullptr);
  }
  return result;
}

// ---- Memory of another process ----
//
// IPC (cuIpcOpenMemHandle), a pool's exported pointer (cuMemPoolImportPointer) and a shareable
// VMM handle (cuMemImportFromShareableHandle) hand this process memory that another allocated.
// It stays alive while this process holds it, whatever its exporter does, so it counts here too,
// at its size, until cuIpcCloseMemHandle / cuMemFree* / its release and last unmap: processes of
// one pod that share memory are charged for it twice (the safe side: passing handles between
// its processes does not take a pod past its limit).

namespace orion::interpose {
namespace {

// An imported pointer: `import` is the driver's call; counted at the size the driver gives its
// allocation, or undone with `undo` and refused (past the limit, or its size unknown under one).
template <typename Import, typename Undo>
CUresult GuardedImport(CUdeviceptr* dptr, MemoryKind kind, Import import, Undo undo) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  const CUresult result = import();
  if (reg == nullptr || result != CUDA_SUCCESS || dptr == nullptr) return result;
  const CUdeviceptr ptr = *dptr;
  CUdeviceptr base = 0;
  size_t bytes = 0;
  auto range = ORION_DRIVER(cuMemGetAddressRange_v2);
  const bool sized = range != nullptr && range(&base, &bytes, ptr) == CUDA_SUCCESS && bytes != 0;
  const bool limited = reg->slot->memory_limit_bytes.load(std::memory_order_relaxed) != 0;
  auto refuse = [&] {
    undo(ptr);
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  };
  if (!sized) {
    if (!limited) return result;
    PushMemoryEvent(reg, EventKind::kAllocDenied, 0, 0, kind, nullptr);
    return refuse();
  }
  if (TableRefuses(reg, g_allocations.full(), bytes, kind) || !Reserve(reg, bytes, kind)) {
    return refuse();
  }
  if (!Remember(reg, g_allocations, ptr, bytes, kind, 0, 0, [&] { undo(ptr); })) {
    *dptr = 0;  // undone: under a limit it could never be given back
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  PushMemoryEvent(reg, EventKind::kMemAlloc, ptr, bytes, kind, nullptr);
  return result;
}

}  // namespace
}  // namespace orion::interpose

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle,
                                       unsigned int flags) {
  ORION_REAL_OR_RETURN(cuIpcOpenMemHandle_v2)
  return orion::interpose::GuardedImport(
      dptr, MemoryKind::kDevice, [&] { return real(dptr, handle, flags); },
      [](CUdeviceptr ptr) {
        if (auto close = ORION_REAL(cuIpcCloseMemHandle)) close(ptr);
      });
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  ORION_REAL_OR_RETURN(cuIpcCloseMemHandle)
  return GuardedFree(__func__, dptr, nullptr, [&] { return real(dptr); });
}

// Freed with cuMemFree / cuMemFreeAsync, which give it back (GuardedFree).
CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr* dptr, CUmemoryPool pool,
                                        CUmemPoolPtrExportData* data) {
  ORION_REAL_OR_RETURN(cuMemPoolImportPointer)
  return orion::interpose::GuardedImport(
      dptr, MemoryKind::kPool, [&] { return real(dptr, pool, data); },
      [](CUdeviceptr ptr) {
        if (auto free_fn = ORION_REAL(cuMemFree_v2)) free_fn(ptr);
      });
}

// Its size is known only as it is mapped: the handle is remembered with no bytes (kind kVmmMap
// marks it imported) and each mapping counts its bytes (cuMemMap).
CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                void* shareable, CUmemAllocationHandleType type) {
  ORION_REAL_OR_RETURN(cuMemImportFromShareableHandle)
  const CUresult result = real(handle, shareable, type);
  CUcontext ctx = nullptr;
  Registration* reg = result == CUDA_SUCCESS && handle != nullptr
                          ? CurrentRegistration(&ctx) : nullptr;
  if (reg == nullptr) return result;
  const CUmemGenericAllocationHandle imported = *handle;
  if (!orion::interpose::Remember(reg, orion::interpose::g_vmm_handles, imported, 0,
                                  MemoryKind::kVmmMap, /*mappings=*/0, /*references=*/1, [&] {
                                    if (auto release = ORION_REAL(cuMemRelease)) {
                                      release(imported);
                                    }
                                  })) {
    *handle = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
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
                                      reg->quota->counters.used_bytes.load(
                                          std::memory_order_relaxed),
                                      free_bytes, total_bytes);
  return result;
}

// ---- CUDA arrays and the device-side malloc heap ----

namespace orion::interpose {
namespace {

// Bytes of one channel of `format`; formats this list does not know (newer or compressed ones)
// count at 4, at least what the known 4-byte formats take.
uint64_t FormatBytes(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    default:
      return 4;
  }
}

// Creates an array of `bytes` against the quota; `create` performs the real call and `destroy`
// gives the array back when the table has no room for it under a limit.
template <typename Handle, typename Create, typename Destroy>
CUresult GuardedArray(Handle* handle, uint64_t bytes, Create create, Destroy destroy) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return create();
  if (TableRefuses(reg, g_arrays.full(), bytes, MemoryKind::kArray) ||
      !Reserve(reg, bytes, MemoryKind::kArray)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = create();
  if (result != CUDA_SUCCESS || handle == nullptr) {
    Refund(reg, bytes);
    return result;
  }
  const Handle created = *handle;
  const uint64_t key = reinterpret_cast<uint64_t>(created);
  if (!Remember(reg, g_arrays, key, bytes, MemoryKind::kArray, 0, 0,
                [&] { destroy(created); })) {
    *handle = nullptr;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  PushMemoryEvent(reg, EventKind::kMemAlloc, key, bytes, MemoryKind::kArray, nullptr);
  return result;
}

template <typename Destroy>
CUresult GuardedArrayDestroy(uint64_t key, Destroy destroy) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return destroy();
  const CUresult result = destroy();
  AllocationTable<4096>::Entry entry{};
  if (result == CUDA_SUCCESS && g_arrays.Remove(key, &entry)) {
    Refund(reg, entry.bytes);
    PushMemoryEvent(reg, EventKind::kMemFree, key, entry.bytes, MemoryKind::kArray, nullptr);
  }
  return result;
}

}  // namespace
}  // namespace orion::interpose

CUresult CUDAAPI cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  ORION_REAL_OR_RETURN(cuArrayCreate_v2)
  if (desc == nullptr) return real(handle, desc);
  const uint64_t bytes = orion::interpose::ArrayBytes(orion::interpose::FormatBytes(desc->Format),
                                                      desc->NumChannels, desc->Width,
                                                      desc->Height, 1, 1);
  return orion::interpose::GuardedArray(
      handle, bytes, [&] { return real(handle, desc); },
      [](CUarray a) {
        if (auto destroy = ORION_REAL(cuArrayDestroy)) destroy(a);
      });
}

CUresult CUDAAPI cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  ORION_REAL_OR_RETURN(cuArray3DCreate_v2)
  if (desc == nullptr) return real(handle, desc);
  const uint64_t bytes = orion::interpose::ArrayBytes(orion::interpose::FormatBytes(desc->Format),
                                                      desc->NumChannels, desc->Width,
                                                      desc->Height, desc->Depth, 1);
  return orion::interpose::GuardedArray(
      handle, bytes, [&] { return real(handle, desc); },
      [](CUarray a) {
        if (auto destroy = ORION_REAL(cuArrayDestroy)) destroy(a);
      });
}

CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* handle,
                                        const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned int levels) {
  ORION_REAL_OR_RETURN(cuMipmappedArrayCreate)
  if (desc == nullptr) return real(handle, desc, levels);
  const uint64_t bytes = orion::interpose::ArrayBytes(orion::interpose::FormatBytes(desc->Format),
                                                      desc->NumChannels, desc->Width,
                                                      desc->Height, desc->Depth, levels);
  return orion::interpose::GuardedArray(
      handle, bytes, [&] { return real(handle, desc, levels); },
      [](CUmipmappedArray a) {
        if (auto destroy = ORION_REAL(cuMipmappedArrayDestroy)) destroy(a);
      });
}

CUresult CUDAAPI cuArrayDestroy(CUarray handle) {
  ORION_REAL_OR_RETURN(cuArrayDestroy)
  return orion::interpose::GuardedArrayDestroy(reinterpret_cast<uint64_t>(handle),
                                               [&] { return real(handle); });
}

CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  ORION_REAL_OR_RETURN(cuMipmappedArrayDestroy)
  return orion::interpose::GuardedArrayDestroy(reinterpret_cast<uint64_t>(handle),
                                               [&] { return real(handle); });
}

// The device-side malloc heap (kernels' malloc/new) is reserved in GPU memory when a kernel that
// uses it first loads; its size counts against the quota from the moment it is set, per context.
// The driver's default heap (8 MiB), never set, is not counted.
CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  ORION_REAL_OR_RETURN(cuCtxSetLimit)
  if (limit != CU_LIMIT_MALLOC_HEAP_SIZE) return real(limit, value);
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr || ctx == nullptr) return real(limit, value);
  using orion::interpose::g_malloc_heaps;
  const uint64_t key = reinterpret_cast<uint64_t>(ctx);
  orion::interpose::AllocationTable<64>::Entry before{};
  const uint64_t counted = g_malloc_heaps.Find(key, &before) ? before.bytes : 0;
  const uint64_t wanted = value;
  if (wanted > counted) {
    if (orion::interpose::TableRefuses(reg, counted == 0 && g_malloc_heaps.full(),
                                       wanted - counted, MemoryKind::kMallocHeap) ||
        !orion::interpose::Reserve(reg, wanted - counted, MemoryKind::kMallocHeap)) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  const CUresult result = real(limit, value);
  if (result != CUDA_SUCCESS) {
    if (wanted > counted) orion::interpose::Refund(reg, wanted - counted);
    return result;
  }
  if (wanted < counted) orion::interpose::Refund(reg, counted - wanted);
  if (!g_malloc_heaps.Insert(key, wanted, MemoryKind::kMallocHeap) &&
      reg->slot->memory_limit_bytes.load(std::memory_order_relaxed) == 0) {
    // No room to remember it (56 contexts) and no limit to hold: left uncounted. Under a limit
    // (a race past TableRefuses) it stays counted for the process's life, the safe side.
    orion::interpose::Refund(reg, wanted - counted);
  }
  orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemAlloc, key, wanted,
                                    MemoryKind::kMallocHeap, nullptr);
  return result;
}

// ---- Graph memory-allocation nodes ----
//
// A memory-allocation node fixes its allocation's address when it is added; the memory is the
// graph's from its first launch until a free node of the same graph, cuMemFree or cuMemFreeAsync
// frees it. It is counted from the node's creation (the earliest the graph could hold it), keyed
// by its address in the allocation table: cuMemFree / cuMemFreeAsync of the address give it back
// (GuardedFree), and so does destroying the graph for the allocations a free node of the graph
// frees (a graph whose free nodes already ran holds them no more).

namespace orion::interpose {
namespace {

// A graph memory-allocation node of `bytes`: counted before `add` (the driver's call, which
// fixes the address in *dptr) and remembered at its address.
template <typename Add>
CUresult GuardedGraphAlloc(uint64_t bytes, const CUdeviceptr* dptr, Add add) {
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return add();
  if (TableRefuses(reg, g_allocations.full(), bytes, MemoryKind::kGraphAlloc) ||
      !Reserve(reg, bytes, MemoryKind::kGraphAlloc)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = add();
  if (result != CUDA_SUCCESS) {
    Refund(reg, bytes);
    return result;
  }
  // No room to remember it under a limit (a race past TableRefuses): it stays counted for the
  // process's life, the safe side (a node cannot be taken out of a graph with memory nodes).
  if (!g_allocations.Insert(*dptr, bytes, MemoryKind::kGraphAlloc) &&
      reg->slot->memory_limit_bytes.load(std::memory_order_relaxed) == 0) {
    Refund(reg, bytes);
  }
  PushMemoryEvent(reg, EventKind::kMemAlloc, *dptr, bytes, MemoryKind::kGraphAlloc, nullptr);
  return result;
}

bool AddsMemoryAllocation(const CUgraphNodeParams* params) {
  return params != nullptr && params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC;
}

}  // namespace
}  // namespace orion::interpose

CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph graph,
                                        const CUgraphNode* deps, size_t count,
                                        CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  ORION_REAL_OR_RETURN(cuGraphAddMemAllocNode)
  if (params == nullptr) return real(node, graph, deps, count, params);
  return orion::interpose::GuardedGraphAlloc(
      params->bytesize, &params->dptr, [&] { return real(node, graph, deps, count, params); });
}

CUresult CUDAAPI cuGraphAddNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                size_t count, CUgraphNodeParams* params) {
  ORION_REAL_OR_RETURN(cuGraphAddNode)
  if (!orion::interpose::AddsMemoryAllocation(params)) {
    return real(node, graph, deps, count, params);
  }
  return orion::interpose::GuardedGraphAlloc(
      params->alloc.bytesize, &params->alloc.dptr,
      [&] { return real(node, graph, deps, count, params); });
}

CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                   const CUgraphEdgeData* edges, size_t count,
                                   CUgraphNodeParams* params) {
  ORION_REAL_OR_RETURN(cuGraphAddNode_v2)
  if (!orion::interpose::AddsMemoryAllocation(params)) {
    return real(node, graph, deps, edges, count, params);
  }
  return orion::interpose::GuardedGraphAlloc(
      params->alloc.bytesize, &params->alloc.dptr,
      [&] { return real(node, graph, deps, edges, count, params); });
}

namespace orion::interpose {
namespace {

// The addresses the free nodes of `graph` free, at most `max` of them, into `out`; how many.
// The node list goes in a page mapping of its own (no malloc inside a CUDA call).
size_t GraphFreedAddresses(CUgraph graph, CUdeviceptr* out, size_t max) {
  auto get_nodes = ORION_DRIVER(cuGraphGetNodes);
  auto get_type = ORION_DRIVER(cuGraphNodeGetType);
  auto get_freed = ORION_DRIVER(cuGraphMemFreeNodeGetParams);
  if (get_nodes == nullptr || get_type == nullptr || get_freed == nullptr) return 0;
  size_t count = 0;
  if (get_nodes(graph, nullptr, &count) != CUDA_SUCCESS || count == 0) return 0;
  constexpr size_t kMaxNodes = 1u << 20;
  if (count > kMaxNodes) count = kMaxNodes;
  const size_t bytes = count * sizeof(CUgraphNode);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0;
  auto* nodes = static_cast<CUgraphNode*>(mem);
  size_t n = 0;
  size_t got = count;
  if (get_nodes(graph, nodes, &got) == CUDA_SUCCESS) {
    if (got > count) got = count;
    for (size_t i = 0; i < got && n < max; ++i) {
      CUgraphNodeType type;
      CUdeviceptr dptr = 0;
      if (nodes[i] != nullptr && get_type(nodes[i], &type) == CUDA_SUCCESS &&
          type == CU_GRAPH_NODE_TYPE_MEM_FREE && get_freed(nodes[i], &dptr) == CUDA_SUCCESS) {
        out[n++] = dptr;
      }
    }
  }
  munmap(mem, bytes);
  return n;
}

}  // namespace
}  // namespace orion::interpose

CUresult CUDAAPI cuGraphDestroy(CUgraph graph) {
  ORION_REAL_OR_RETURN(cuGraphDestroy)
  CUcontext ctx = nullptr;
  Registration* reg = CurrentRegistration(&ctx);
  if (reg == nullptr) return real(graph);
  // Read before the graph goes; given back once it has gone.
  CUdeviceptr freed[256];
  const size_t n = orion::interpose::GraphFreedAddresses(graph, freed, 256);
  const CUresult result = real(graph);
  if (result != CUDA_SUCCESS) return result;
  for (size_t i = 0; i < n; ++i) {
    decltype(orion::interpose::g_allocations)::Entry entry{};
    if (orion::interpose::g_allocations.Find(freed[i], &entry) &&
        entry.kind == MemoryKind::kGraphAlloc &&
        orion::interpose::g_allocations.Remove(freed[i], &entry)) {
      orion::interpose::Refund(reg, entry.bytes);
      orion::interpose::PushMemoryEvent(reg, orion::contract::EventKind::kMemFree, freed[i],
                                        entry.bytes, MemoryKind::kGraphAlloc, nullptr);
    }
  }
  return result;
}
