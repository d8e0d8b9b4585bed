// orion-sample-alloc: grabs device memory in --chunk pieces until an allocation fails or --max
// bytes are held, and reports what cuMemGetInfo said before and after and which CUresult the
// failing call returned. This is how a memory quota (or its absence) looks to a program.
// Modes: cuMemAlloc (default), --async (cuMemAllocAsync on a stream), --vmm (cuMemCreate,
// cuMemAddressReserve, cuMemMap, cuMemSetAccess; with --release-mapped each handle is released
// right after it is mapped, the documented VMM pattern: the memory lives until it is unmapped).
// Everything is freed at the end.
//
// Last line (machine-readable):
//   result mode=.. chunks=N bytes=.. free_before=.. free_after=.. total=.. failure=<CUresult|none>
#include <cinttypes>

#include "samples/sample_common.h"

namespace {

struct Chunk {
  CUdeviceptr address = 0;
  CUmemGenericAllocationHandle handle = 0;  // --vmm only
};

// One allocation of `bytes` in the chosen mode. Returns the failing CUresult and sets *call to
// the failing call's name, instead of exiting: running out is the expected outcome.
CUresult AllocateChunk(bool async, bool vmm, bool release_mapped, int device, CUstream stream,
                       size_t bytes, Chunk* chunk, const char** call) {
  if (async) {
    *call = "cuMemAllocAsync";
    const CUresult r = cuMemAllocAsync(&chunk->address, bytes, stream);
    if (r != CUDA_SUCCESS) return r;
    *call = "cuStreamSynchronize";
    return cuStreamSynchronize(stream);
  }
  if (!vmm) {
    *call = "cuMemAlloc";
    return cuMemAlloc(&chunk->address, bytes);
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  *call = "cuMemCreate";
  CUresult r = cuMemCreate(&chunk->handle, bytes, &prop, 0);
  if (r != CUDA_SUCCESS) return r;
  *call = "cuMemAddressReserve";
  r = cuMemAddressReserve(&chunk->address, bytes, 0, 0, 0);
  if (r == CUDA_SUCCESS) {
    *call = "cuMemMap";
    r = cuMemMap(chunk->address, bytes, 0, chunk->handle, 0);
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      *call = "cuMemSetAccess";
      r = cuMemSetAccess(chunk->address, bytes, &access, 1);
      if (r == CUDA_SUCCESS && release_mapped) {
        *call = "cuMemRelease";
        r = cuMemRelease(chunk->handle);
        chunk->handle = 0;  // the mapping holds the memory now
      }
      if (r == CUDA_SUCCESS) return r;
      cuMemUnmap(chunk->address, bytes);
    }
    cuMemAddressFree(chunk->address, bytes);
  }
  cuMemRelease(chunk->handle);
  return r;
}

void FreeChunk(bool async, bool vmm, CUstream stream, size_t bytes, const Chunk& chunk) {
  if (async) {
    ORION_CHECK_CU(cuMemFreeAsync(chunk.address, stream));
  } else if (vmm) {
    ORION_CHECK_CU(cuMemUnmap(chunk.address, bytes));
    ORION_CHECK_CU(cuMemAddressFree(chunk.address, bytes));
    if (chunk.handle != 0) ORION_CHECK_CU(cuMemRelease(chunk.handle));
  } else {
    ORION_CHECK_CU(cuMemFree(chunk.address));
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t chunk_bytes = 256ull << 20;
  uint64_t max_bytes = 0;
  bool async = false;
  bool vmm = false;
  bool release_mapped = false;
  bool touch = false;
  double hold_s = 0;
  orion::samples::Flags flags("orion-sample-alloc",
                              "allocate --chunk pieces until failure or --max, report, free");
  flags.AddBytes("chunk", &chunk_bytes, "bytes per allocation, e.g. 256Mi (256Mi)");
  flags.AddBytes("max", &max_bytes, "stop after this many bytes; 0 = until failure (0)");
  flags.AddBool("async", &async, "use cuMemAllocAsync / cuMemFreeAsync");
  flags.AddBool("vmm", &vmm, "use cuMemCreate + cuMemMap (chunk must be a granularity multiple)");
  flags.AddBool("release-mapped", &release_mapped,
                "--vmm: release each handle as soon as it is mapped (freed at its unmap)");
  flags.AddBool("touch", &touch, "cuMemsetD8 every chunk so it is really resident");
  flags.AddDouble("hold", &hold_s, "seconds to hold the memory before freeing it (0)");
  flags.Parse(argc, argv);
  if (chunk_bytes == 0) flags.Usage(1, "--chunk must be > 0");
  if (async && vmm) flags.Usage(1, "--async and --vmm exclude each other");
  if (release_mapped && !vmm) flags.Usage(1, "--release-mapped needs --vmm");
  const char* mode = async ? "async" : vmm ? "vmm" : "alloc";

  orion::samples::Gpu gpu = orion::samples::OpenGpu();
  CUstream stream = nullptr;
  ORION_CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  size_t free_before = 0, total = 0;
  ORION_CHECK_CU(cuMemGetInfo(&free_before, &total));
  printf("orion-sample-alloc: gpu=\"%s\" mode=%s chunk=%" PRIu64 " before free=%zu total=%zu\n",
         gpu.name, mode, chunk_bytes, free_before, total);
  fflush(stdout);

  std::vector<Chunk> chunks;
  const char* failure = "none";
  const char* failed_call = "";
  for (;;) {
    if (max_bytes != 0 && (chunks.size() + 1) * chunk_bytes > max_bytes) break;
    Chunk chunk;
    const CUresult r =
        AllocateChunk(async, vmm, release_mapped, gpu.device, stream, chunk_bytes, &chunk,
                      &failed_call);
    if (r != CUDA_SUCCESS) {
      failure = orion::samples::ResultName(r);
      printf("%s failed after %zu chunks: %s\n", failed_call, chunks.size(), failure);
      break;
    }
    if (touch) ORION_CHECK_CU(cuMemsetD8(chunk.address, 0xA5, chunk_bytes));
    chunks.push_back(chunk);
  }
  size_t free_after = 0;
  ORION_CHECK_CU(cuMemGetInfo(&free_after, &total));
  printf("after %zu chunks: free=%zu total=%zu\n", chunks.size(), free_after, total);
  fflush(stdout);
  if (hold_s > 0) {
    orion::samples::SleepUntilNs(orion::samples::NowNs() + static_cast<uint64_t>(hold_s * 1e9));
  }

  for (const Chunk& chunk : chunks) {
    FreeChunk(async, vmm, stream, chunk_bytes, chunk);
  }
  ORION_CHECK_CU(cuStreamSynchronize(stream));
  size_t free_end = 0;
  ORION_CHECK_CU(cuMemGetInfo(&free_end, &total));
  printf("result mode=%s chunks=%zu bytes=%" PRIu64
         " free_before=%zu free_after=%zu"
         " free_end=%zu total=%zu failure=%s failed_call=%s\n",
         mode, chunks.size(), static_cast<uint64_t>(chunks.size()) * chunk_bytes, free_before,
         free_after, free_end, total, failure, *failed_call ? failed_call : "none");

  ORION_CHECK_CU(cuStreamDestroy(stream));
  orion::samples::CloseGpu(gpu);
  return 0;
}
