// orion_interpose_probe: a small CUDA driver-API program for the interposer's end-to-end test.
// It launches kernels by every lookup path (direct symbol, cuLaunchKernelEx, cuGetProcAddress,
// dlsym), replays a captured graph, allocates against the quota, and prints what it saw as
// key=value lines on stdout for the test to check. Runs on the CUDA driver test double.
//
// Usage: orion_interpose_probe [launches]
//                              [fork|bench|escapes|vmm|imports|contexts|threads|capture-beside|
//                               paced]
//   fork: after the memory checks a child process makes driver calls of its own and exits.
//   bench: also times 100000 back-to-back launches of an empty kernel (launch_ns=, CPU side).
//   escapes: only the memory quota's former escapes: live allocations up to one past the
//     interposer's table, CUDA arrays (2D, 3D, mipmapped) and the device malloc heap, each
//     printed with the quota's used bytes (total - free of cuMemGetInfo) after it.
//   vmm: VMM handles mapped and released at once, counted until their last unmap (RunVmm).
//   imports: memory of another process (IPC, shareable VMM handles) counted while held.
//   capture-beside: a launch on one stream while a capture of another is open (global mode).
//   paced: the launches 10 ms apart, then a wait for them (RunPaced); prints stream_waits.
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string.h>
#include <time.h>

#include <chrono>
#include <thread>
#include <vector>

#include "samples/spin_kernel.h"
#include "tests/cuda_double/double_counts.h"

namespace {

#define PROBE_CHECK(call)                                             \
  do {                                                                \
    const CUresult probe_result = (call);                             \
    if (probe_result != CUDA_SUCCESS) {                               \
      fprintf(stderr, "probe: %s failed: %d\n", #call, probe_result); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

bool FromInterposer(void* fn) {
  Dl_info info;
  return fn != nullptr && dladdr(fn, &info) != 0 && info.dli_fname != nullptr &&
         strstr(info.dli_fname, "orion_interpose") != nullptr;
}

// Device `d`'s primary context made current, and the spin kernel loaded in it.
int LoadSpinKernel(int d, CUcontext* ctx, CUfunction* spin) {
  CUdevice device;
  CUmodule module;
  PROBE_CHECK(cuDeviceGet(&device, d));
  PROBE_CHECK(cuDevicePrimaryCtxRetain(ctx, device));
  PROBE_CHECK(cuCtxSetCurrent(*ctx));
  PROBE_CHECK(cuModuleLoadData(&module, orion::samples::kSpinKernelPtx));
  PROBE_CHECK(cuModuleGetFunction(spin, module, orion::samples::kSpinKernelName));
  return 0;
}

int Run(int launches, bool fork_child, bool bench) {
  CUcontext context;
  CUfunction spin;
  CUstream stream;
  PROBE_CHECK(cuInit(0));
  if (LoadSpinKernel(0, &context, &spin) != 0) return 1;
  PROBE_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  unsigned long long ns = 100'000;
  void* args[] = {&ns};
  for (int i = 0; i < launches; ++i) {
    PROBE_CHECK(cuLaunchKernel(spin, 1000, 1, 1, 128, 1, 1, 0, stream, args, nullptr));
  }
  CUlaunchConfig config;
  memset(&config, 0, sizeof(config));
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 64;
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream;
  PROBE_CHECK(cuLaunchKernelEx(&config, spin, args, nullptr));

  void* by_proc = nullptr;
  CUdriverProcAddressQueryResult status;
  PROBE_CHECK(
      cuGetProcAddress("cuLaunchKernel", &by_proc, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  printf("proc_hook=%d\n", FromInterposer(by_proc) ? 1 : 0);
  PROBE_CHECK(reinterpret_cast<decltype(&cuLaunchKernel)>(by_proc)(spin, 1, 1, 1, 32, 1, 1, 0,
                                                                   stream, args, nullptr));
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void* by_dlsym = libcuda != nullptr ? dlsym(libcuda, "cuLaunchKernel") : nullptr;
  printf("dlsym_hook=%d\n", FromInterposer(by_dlsym) ? 1 : 0);
  printf("dlsym_other_real=%d\n",
         libcuda != nullptr && !FromInterposer(dlsym(libcuda, "cuStreamCreate")) ? 1 : 0);
  if (by_dlsym != nullptr) {
    PROBE_CHECK(reinterpret_cast<decltype(&cuLaunchKernel)>(by_dlsym)(spin, 1, 1, 1, 32, 1, 1, 0,
                                                                      stream, args, nullptr));
  }

  // A graph of three kernels, replayed once.
  CUgraph graph;
  CUgraphExec exec;
  PROBE_CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  for (int i = 0; i < 3; ++i) {
    PROBE_CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
  }
  PROBE_CHECK(cuStreamEndCapture(stream, &graph));
  PROBE_CHECK(cuGraphInstantiate(&exec, graph, 0));
  PROBE_CHECK(cuGraphLaunch(exec, stream));
  PROBE_CHECK(cuStreamSynchronize(stream));

  // Memory against the quota the test registrar hands out.
  CUdeviceptr a = 0, b = 0;
  printf("alloc32=%d\n", static_cast<int>(cuMemAlloc(&a, 32ull << 20)));
  printf("alloc48=%d\n", static_cast<int>(cuMemAlloc(&b, 48ull << 20)));
  size_t free_bytes = 0, total_bytes = 0;
  PROBE_CHECK(cuMemGetInfo(&free_bytes, &total_bytes));
  printf("meminfo_free=%zu\nmeminfo_total=%zu\n", free_bytes, total_bytes);
  if (a != 0) PROBE_CHECK(cuMemFree(a));
  if (b != 0) PROBE_CHECK(cuMemFree(b));

  if (fork_child) {
    const pid_t child = fork();
    if (child == 0) {
      // The inherited registration is the parent's; the interposer must not write into its slot.
      size_t f = 0, t = 0;
      const CUresult r = cuMemGetInfo(&f, &t);
      (void)r;  // CUDA may refuse in a fork child; not crashing is what counts
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("fork_child=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    PROBE_CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
  }

  if (bench) {
    unsigned long long zero = 0;
    void* zero_args[] = {&zero};
    constexpr int kBenchLaunches = 100000;
    timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < kBenchLaunches; ++i) {
      PROBE_CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, stream, zero_args, nullptr));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("launch_ns=%.1f\n", ns / kBenchLaunches);
  }

  PROBE_CHECK(cuCtxSynchronize());
  // Let the interposer's completion poller observe the last events before exit.
  timespec settle{0, 50'000'000};
  nanosleep(&settle, nullptr);
  // The driver test double counts the stream waits on host memory this process queued, the
  // kernels it launched to run, and the process's questions for its current context.
  for (const char* name : {"stream_waits", "kernel_launches", "context_queries"}) {
    if (unsigned long long count = 0; orion::testing::ReadDoubleCount(name, &count)) {
      printf("%s=%llu\n", name, count);
    }
  }
  // And when each of its first launches entered the driver.
  using DoubleEntered = unsigned long long (*)(unsigned long long);
  if (auto entered = reinterpret_cast<DoubleEntered>(
          dlsym(RTLD_DEFAULT, "orion_double_launch_entered_ns"))) {
    for (unsigned long long i = 0, ns = 0; i < 64 && (ns = entered(i)) != 0; ++i) {
      printf("launch_entered_%llu=%llu\n", i, ns);
    }
  }
  printf("done=1\n");
  fflush(stdout);
  return 0;
}

// Bytes counted against the quota: cuMemGetInfo reports total = limit, free = limit - used.
size_t QuotaUsed() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cuMemGetInfo(&free_bytes, &total_bytes) != CUDA_SUCCESS) return ~size_t{0};
  return total_bytes - free_bytes;
}

// Device 0's primary context, current on this thread.
CUresult UseDeviceZero() {
  CUdevice device;
  CUcontext context;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&device, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&context, device);
  return r == CUDA_SUCCESS ? cuCtxSetCurrent(context) : r;
}

// Pinned VMM memory on device 0.
CUmemAllocationProp DeviceZeroVmmProp() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}

int RunEscapes() {
  PROBE_CHECK(UseDeviceZero());

  // Live allocations until the first refusal: the interposer's table holds 114,688 (7/8 of its
  // 131,072 slots); one more must be refused, not left uncounted.
  std::vector<CUdeviceptr> ptrs;
  ptrs.reserve(200000);
  CUresult refused = CUDA_SUCCESS;
  while (ptrs.size() < 200000) {
    CUdeviceptr p = 0;
    refused = cuMemAlloc(&p, 256);
    if (refused != CUDA_SUCCESS) break;
    ptrs.push_back(p);
  }
  printf("table_fill=%zu\n", ptrs.size());
  printf("table_overflow=%d\n", static_cast<int>(refused));
  printf("table_used=%zu\n", QuotaUsed());
  for (auto p : ptrs) PROBE_CHECK(cuMemFree(p));
  printf("table_used_after_free=%zu\n", QuotaUsed());

  CUDA_ARRAY_DESCRIPTOR d2;
  memset(&d2, 0, sizeof(d2));
  d2.Format = CU_AD_FORMAT_FLOAT;
  d2.NumChannels = 4;
  d2.Width = d2.Height = 4096;  // 256 MiB
  CUarray big = nullptr, small = nullptr;
  printf("array_big=%d\n", static_cast<int>(cuArrayCreate(&big, &d2)));
  d2.Width = d2.Height = 1024;  // 16 MiB
  printf("array_small=%d\n", static_cast<int>(cuArrayCreate(&small, &d2)));
  printf("array_used=%zu\n", QuotaUsed());

  CUDA_ARRAY3D_DESCRIPTOR d3;
  memset(&d3, 0, sizeof(d3));
  d3.Format = CU_AD_FORMAT_FLOAT;
  d3.NumChannels = 1;
  d3.Width = d3.Height = d3.Depth = 512;  // 512 MiB
  CUarray big3 = nullptr, small3 = nullptr;
  printf("array3d_big=%d\n", static_cast<int>(cuArray3DCreate(&big3, &d3)));
  d3.NumChannels = 4;
  d3.Width = d3.Height = d3.Depth = 64;  // 4 MiB
  printf("array3d_small=%d\n", static_cast<int>(cuArray3DCreate(&small3, &d3)));
  printf("array3d_used=%zu\n", QuotaUsed());

  CUDA_ARRAY3D_DESCRIPTOR dm;
  memset(&dm, 0, sizeof(dm));
  dm.Format = CU_AD_FORMAT_FLOAT;
  dm.NumChannels = 1;
  dm.Width = dm.Height = 4096;  // 64 MiB at level 0, about 85 MiB in all
  CUmipmappedArray big_mip = nullptr, small_mip = nullptr;
  printf("mip_big=%d\n", static_cast<int>(cuMipmappedArrayCreate(&big_mip, &dm, 13)));
  dm.Width = dm.Height = 1024;  // 4 MiB at level 0, 11 levels down to 1x1
  printf("mip_small=%d\n", static_cast<int>(cuMipmappedArrayCreate(&small_mip, &dm, 11)));
  printf("mip_used=%zu\n", QuotaUsed());
  if (small != nullptr) PROBE_CHECK(cuArrayDestroy(small));
  if (small3 != nullptr) PROBE_CHECK(cuArrayDestroy(small3));
  if (small_mip != nullptr) PROBE_CHECK(cuMipmappedArrayDestroy(small_mip));
  printf("arrays_used_after_destroy=%zu\n", QuotaUsed());

  printf("heap_big=%d\n", static_cast<int>(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 128u << 20)));
  printf("heap_16=%d\n", static_cast<int>(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 16u << 20)));
  printf("heap_16_used=%zu\n", QuotaUsed());
  printf("heap_4=%d\n", static_cast<int>(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 4u << 20)));
  printf("heap_4_used=%zu\n", QuotaUsed());
  size_t heap = 0;
  PROBE_CHECK(cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE));
  printf("heap_driver=%zu\n", heap);

  // Graph memory-allocation nodes: counted when added; one freed by a free node of the graph
  // comes back with the graph, one left allocated at cuMemFree of its address.
  CUgraph graph = nullptr;
  PROBE_CHECK(cuGraphCreate(&graph, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS alloc;
  memset(&alloc, 0, sizeof(alloc));
  alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  alloc.poolProps.location.id = 0;
  CUgraphNode node = nullptr;
  alloc.bytesize = 128u << 20;
  printf("graph_big=%d\n", static_cast<int>(cuGraphAddMemAllocNode(&node, graph, nullptr, 0,
                                                                     &alloc)));
  alloc.bytesize = 16u << 20;
  printf("graph_16=%d\n", static_cast<int>(cuGraphAddMemAllocNode(&node, graph, nullptr, 0,
                                                                    &alloc)));
  const CUdeviceptr kept = alloc.dptr;
  alloc.bytesize = 8u << 20;
  printf("graph_8=%d\n", static_cast<int>(cuGraphAddMemAllocNode(&node, graph, nullptr, 0,
                                                                   &alloc)));
  CUgraphNode free_node = nullptr;
  PROBE_CHECK(cuGraphAddMemFreeNode(&free_node, graph, &node, 1, alloc.dptr));
  printf("graph_used=%zu\n", QuotaUsed());
  // The generic cuGraphAddNode (the _v2 symbol cuda.h names it) counts the same way.
  CUgraphNodeParams generic;
  memset(&generic, 0, sizeof(generic));
  generic.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  generic.alloc.poolProps = alloc.poolProps;
  generic.alloc.bytesize = 64u << 20;
  CUgraphNode generic_node = nullptr;
  printf("graph_generic_big=%d\n",
         static_cast<int>(cuGraphAddNode(&generic_node, graph, nullptr, nullptr, 0, &generic)));
  generic.alloc.bytesize = 2u << 20;
  printf("graph_generic_2=%d\n",
         static_cast<int>(cuGraphAddNode(&generic_node, graph, nullptr, nullptr, 0, &generic)));
  printf("graph_used_generic=%zu\n", QuotaUsed());
  PROBE_CHECK(cuGraphAddMemFreeNode(&free_node, graph, &generic_node, 1, generic.alloc.dptr));
  PROBE_CHECK(cuGraphDestroy(graph));
  printf("graph_used_after_destroy=%zu\n", QuotaUsed());
  PROBE_CHECK(cuMemFree(kept));
  printf("graph_used_after_free=%zu\n", QuotaUsed());
  printf("done=1\n");
  fflush(stdout);
  return 0;
}

// The VMM pattern under a 64 MiB quota: reserve, create, map, release at once (as PyTorch's
// expandable segments do). The driver frees a released handle's memory only at its last unmap,
// so its bytes stay counted until then: 2 x 32 MiB fit, the third create is refused, and the
// bytes come back only as the mappings go. A retained handle (cuMemRetainAllocationHandle)
// keeps the memory counted past the unmap until it is released too.
int RunVmm() {
  PROBE_CHECK(UseDeviceZero());
  CUmemAllocationProp prop = DeviceZeroVmmProp();
  const size_t chunk = 32ull << 20;
  CUdeviceptr base = 0;
  PROBE_CHECK(cuMemAddressReserve(&base, 8 * chunk, 0, 0, 0));
  int mapped = 0;
  for (int round = 0; round < 8; ++round) {  // one growing segment, chunk by chunk
    CUmemGenericAllocationHandle handle = 0;
    const CUresult created = cuMemCreate(&handle, chunk, &prop, 0);
    printf("vmm_create_%d=%d\n", round, static_cast<int>(created));
    if (created != CUDA_SUCCESS) continue;
    PROBE_CHECK(cuMemMap(base + mapped * chunk, chunk, 0, handle, 0));
    PROBE_CHECK(cuMemRelease(handle));
    ++mapped;
  }
  printf("vmm_mapped=%d\nvmm_used_mapped=%zu\n", mapped, QuotaUsed());
  PROBE_CHECK(cuMemUnmap(base + chunk, chunk));  // the second chunk's mapping goes
  printf("vmm_used_one_unmapped=%zu\n", QuotaUsed());
  // The first chunk's handle retained, then its mapping gone: still counted until released.
  CUmemGenericAllocationHandle retained = 0;
  PROBE_CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(base)));
  PROBE_CHECK(cuMemUnmap(base, chunk));
  printf("vmm_used_retained=%zu\n", QuotaUsed());
  PROBE_CHECK(cuMemRelease(retained));
  printf("vmm_used_end=%zu\n", QuotaUsed());
  PROBE_CHECK(cuMemAddressFree(base, 8 * chunk));
  printf("done=1\n");
  fflush(stdout);
  return 0;
}

// Memory of another process under a 64 MiB quota (the double's IPC opens a fresh allocation of
// the exported size; its shareable handles are memfds): counted in the importer while held.
int RunImports() {
  PROBE_CHECK(UseDeviceZero());
  CUdeviceptr exported = 0;
  PROBE_CHECK(cuMemAlloc(&exported, 24ull << 20));
  CUipcMemHandle ipc;
  PROBE_CHECK(cuIpcGetMemHandle(&ipc, exported));
  CUdeviceptr opened = 0, again = 0;
  printf("ipc_open=%d\n", static_cast<int>(cuIpcOpenMemHandle(&opened, ipc, 0)));
  printf("ipc_used=%zu\n", QuotaUsed());
  printf("ipc_open_again=%d\n", static_cast<int>(cuIpcOpenMemHandle(&again, ipc, 0)));
  PROBE_CHECK(cuIpcCloseMemHandle(opened));
  printf("ipc_used_closed=%zu\n", QuotaUsed());
  PROBE_CHECK(cuMemFree(exported));

  CUmemAllocationProp prop = DeviceZeroVmmProp();
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const size_t chunk = 32ull << 20;
  CUmemGenericAllocationHandle created = 0, imported = 0, imported_again = 0;
  PROBE_CHECK(cuMemCreate(&created, chunk, &prop, 0));
  int fd = -1;
  PROBE_CHECK(cuMemExportToShareableHandle(&fd, created, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                           0));
  PROBE_CHECK(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(
                                                 static_cast<intptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  PROBE_CHECK(cuMemImportFromShareableHandle(&imported_again, reinterpret_cast<void*>(
                                                 static_cast<intptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  printf("shared_used_imported=%zu\n", QuotaUsed());  // the creator's chunk only
  CUdeviceptr base = 0;
  PROBE_CHECK(cuMemAddressReserve(&base, 2 * chunk, 0, 0, 0));
  printf("shared_map=%d\n", static_cast<int>(cuMemMap(base, chunk, 0, imported, 0)));
  printf("shared_used_mapped=%zu\n", QuotaUsed());
  printf("shared_map_again=%d\n",
         static_cast<int>(cuMemMap(base + chunk, chunk, 0, imported_again, 0)));
  PROBE_CHECK(cuMemRelease(created));  // the creator lets go: the import holds the memory
  PROBE_CHECK(cuMemRelease(imported));
  PROBE_CHECK(cuMemRelease(imported_again));
  printf("shared_used_released=%zu\n", QuotaUsed());
  PROBE_CHECK(cuMemUnmap(base, chunk));
  printf("shared_used_end=%zu\n", QuotaUsed());
  PROBE_CHECK(cuMemAddressFree(base, 2 * chunk));
  close(fd);
  printf("done=1\n");
  fflush(stdout);
  return 0;
}

// Two devices, their contexts made current in turn (set, and push/pop), 100 rounds: each
// launch must be reported to the registration of the device whose context was current, however
// the context became current.
int RunContexts() {
  CUcontext ctx[2];
  CUfunction spin[2];
  PROBE_CHECK(cuInit(0));
  for (int d = 0; d < 2; ++d) {
    if (LoadSpinKernel(d, &ctx[d], &spin[d]) != 0) return 1;
  }
  unsigned long long ns = 0;
  void* args[] = {&ns};
  for (int round = 0; round < 100; ++round) {
    PROBE_CHECK(cuCtxSetCurrent(ctx[0]));
    for (int i = 0; i < 3; ++i) {
      PROBE_CHECK(cuLaunchKernel(spin[0], 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
    }
    PROBE_CHECK(cuCtxPushCurrent(ctx[1]));
    PROBE_CHECK(cuLaunchKernel(spin[1], 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
    CUcontext popped = nullptr;
    PROBE_CHECK(cuCtxPopCurrent(&popped));
    PROBE_CHECK(cuLaunchKernel(spin[0], 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
    PROBE_CHECK(cuCtxSetCurrent(ctx[1]));
    PROBE_CHECK(cuLaunchKernel(spin[1], 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  }
  PROBE_CHECK(cuCtxSynchronize());
  printf("done=1\n");
  fflush(stdout);
  return 0;
}

// Launches from a thread that exits before the process does, and from the main thread: each
// thread's launch tally (interpose/client_state.h, CountLaunch) reaches the counter, at the
// thread's exit and at the process's.
int RunThreads() {
  CUcontext ctx;
  CUfunction spin;
  PROBE_CHECK(cuInit(0));
  if (LoadSpinKernel(0, &ctx, &spin) != 0) return 1;
  unsigned long long ns = 0;
  void* args[] = {&ns};
  auto launch = [&](int n) {
    for (int i = 0; i < n; ++i) {
      PROBE_CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
    }
    return 0;
  };
  launch(5);
  int thread_result = -1;
  std::thread other([&] {
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return;
    thread_result = launch(7);
  });
  other.join();
  if (thread_result != 0) return 1;
  launch(3);
  PROBE_CHECK(cuCtxSynchronize());
  printf("done=1\n");
  fflush(stdout);
  return 0;
}

// A capture (global mode) of one stream is open while the process's first real launch goes on
// another; prints the capture's end (capture_end=CUresult) and the launch's (launch=CUresult).
int RunCaptureBeside() {
  CUcontext ctx;
  CUfunction spin;
  PROBE_CHECK(cuInit(0));
  if (LoadSpinKernel(0, &ctx, &spin) != 0) return 1;
  CUstream captured, other;
  PROBE_CHECK(cuStreamCreate(&captured, CU_STREAM_NON_BLOCKING));
  PROBE_CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  unsigned long long ns = 1'000;
  void* args[] = {&ns};
  PROBE_CHECK(cuStreamBeginCapture(captured, CU_STREAM_CAPTURE_MODE_GLOBAL));
  PROBE_CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, captured, args, nullptr));
  printf("launch=%d\n", static_cast<int>(
                            cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, other, args, nullptr)));
  CUgraph graph = nullptr;
  printf("capture_end=%d\n", static_cast<int>(cuStreamEndCapture(captured, &graph)));
  PROBE_CHECK(cuStreamSynchronize(other));
  fflush(stdout);
  return 0;
}

// `launches` launches of a short kernel 10 ms apart, then a wait for them: launches that meet
// the gate (or a hold) at different moments of one run.
int RunPaced(int launches) {
  CUcontext ctx;
  CUfunction spin;
  PROBE_CHECK(cuInit(0));
  if (LoadSpinKernel(0, &ctx, &spin) != 0) return 1;
  unsigned long long ns = 1'000;
  void* args[] = {&ns};
  for (int i = 0; i < launches; ++i) {
    PROBE_CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  PROBE_CHECK(cuCtxSynchronize());
  if (unsigned long long count = 0; orion::testing::ReadDoubleCount("stream_waits", &count)) {
    printf("stream_waits=%llu\n", count);
  }
  printf("done=1\n");
  fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int launches = argc > 1 ? atoi(argv[1]) : 5;
  const bool fork_child = argc > 2 && strcmp(argv[2], "fork") == 0;
  const bool bench = argc > 2 && strcmp(argv[2], "bench") == 0;
  if (argc > 2 && strcmp(argv[2], "escapes") == 0) return RunEscapes();
  if (argc > 2 && strcmp(argv[2], "contexts") == 0) return RunContexts();
  if (argc > 2 && strcmp(argv[2], "vmm") == 0) return RunVmm();
  if (argc > 2 && strcmp(argv[2], "imports") == 0) return RunImports();
  if (argc > 2 && strcmp(argv[2], "threads") == 0) return RunThreads();
  if (argc > 2 && strcmp(argv[2], "capture-beside") == 0) return RunCaptureBeside();
  if (argc > 2 && strcmp(argv[2], "paced") == 0) return RunPaced(launches);
  return Run(launches, fork_child, bench);
}
