// Tests of the CUDA driver test double (the libcuda.so.1 stand-in used on machines without a
// GPU): kernel serialisation across processes, stream and event timing, memory capacity,
// graph capture, handle checking and cuGetProcAddress look-ups.
#include <cuda.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "samples/spin_kernel.h"

namespace {

constexpr uint64_t kMs = 1'000'000;

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Every test runs against its own simulated machine: a private state folder and capacity, set
// before the double first touches them.
class CudaDoubleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static char dir[] = "/tmp/orion-sim-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    setenv("ORION_SIM_DIR", dir, 1);
    setenv("ORION_SIM_MEMORY", "1Gi", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  }

  void SetUp() override {
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleLoadData(&module_, orion::samples::kSpinKernelPtx), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&spin_, module_, "orion_spin"), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }

  void TearDown() override {
    EXPECT_EQ(cuStreamDestroy(stream_), CUDA_SUCCESS);
    EXPECT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  }

  CUresult Spin(uint64_t ns, CUstream stream) {
    unsigned long long arg = ns;
    void* args[] = {&arg};
    return cuLaunchKernel(spin_, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
  }

  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction spin_ = nullptr;
  CUstream stream_ = nullptr;
};

TEST_F(CudaDoubleTest, DeviceLooksLikeAnH100) {
  int count = 0, sms = 0, version = 0;
  EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, 13000);
  EXPECT_EQ(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0), CUDA_SUCCESS);
  EXPECT_EQ(sms, 132);
  CUuuid a{}, b{};
  EXPECT_EQ(cuDeviceGetUuid(&a, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGetUuid_v2(&b, 0), CUDA_SUCCESS);
  EXPECT_EQ(memcmp(a.bytes, b.bytes, sizeof(a.bytes)), 0);
  EXPECT_EQ(cuDeviceGetUuid(&a, 1), CUDA_ERROR_INVALID_DEVICE);
  size_t total = 0;
  EXPECT_EQ(cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
  EXPECT_EQ(total, 1ull << 30);
  CUdevice dev = -1;
  EXPECT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
}

TEST_F(CudaDoubleTest, LaunchIsAsyncAndSynchronizeWaits) {
  const uint64_t start = NowNs();
  // A kernel long enough that only a launch that waits for it comes close (a loaded or
  // sanitized test machine may deschedule this thread for tens of milliseconds).
  ASSERT_EQ(Spin(600 * kMs, stream_), CUDA_SUCCESS);
  EXPECT_LT(NowNs() - start, 300 * kMs);  // returned long before the kernel ends
  EXPECT_EQ(cuStreamQuery(stream_), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuStreamSynchronize(stream_), CUDA_SUCCESS);
  EXPECT_GE(NowNs() - start, 600 * kMs);
  EXPECT_EQ(cuStreamQuery(stream_), CUDA_SUCCESS);
}

TEST_F(CudaDoubleTest, EventsMeasureSimulatedTime) {
  CUevent begin = nullptr, end = nullptr;
  ASSERT_EQ(cuEventCreate(&begin, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&end, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(begin, stream_), CUDA_SUCCESS);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Spin(10 * kMs, stream_), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(end, stream_), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(end), CUDA_ERROR_NOT_READY);
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime(&ms, begin, end), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuEventSynchronize(end), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(end), CUDA_SUCCESS);
  ASSERT_EQ(cuEventElapsedTime(&ms, begin, end), CUDA_SUCCESS);
  EXPECT_GE(ms, 39.9f);
  EXPECT_LT(ms, 500.0f);  // only a descheduled test thread makes it longer
  EXPECT_EQ(cuEventDestroy(begin), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(end), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(end), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(CudaDoubleTest, StreamsOfOneProcessShareTheDevice) {
  CUstream other = nullptr;
  ASSERT_EQ(cuStreamCreate(&other, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  const uint64_t start = NowNs();
  ASSERT_EQ(Spin(20 * kMs, stream_), CUDA_SUCCESS);
  ASSERT_EQ(Spin(20 * kMs, other), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(other), CUDA_SUCCESS);
  EXPECT_GE(NowNs() - start, 40 * kMs);  // second kernel queued behind the first
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(other), CUDA_SUCCESS);
}

// Two processes launching at once take twice as long as one: the simulated device runs kernels
// one at a time across processes, like time-slicing.
TEST_F(CudaDoubleTest, KernelsOfTwoProcessesAreSerialised) {
  constexpr int kKernels = 10;
  constexpr uint64_t kKernelNs = 15 * kMs;
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char byte = 0;
    if (read(go[0], &byte, 1) != 1) _exit(3);
    CUstream stream = nullptr;
    if (cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) _exit(4);
    for (int i = 0; i < kKernels; ++i) {
      if (Spin(kKernelNs, stream) != CUDA_SUCCESS) _exit(5);
    }
    _exit(cuStreamSynchronize(stream) == CUDA_SUCCESS ? 0 : 6);
  }
  const uint64_t start = NowNs();
  ASSERT_EQ(write(go[1], "g", 1), 1);
  for (int i = 0; i < kKernels; ++i) ASSERT_EQ(Spin(kKernelNs, stream_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream_), CUDA_SUCCESS);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const uint64_t both_done = NowNs() - start;
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_GE(both_done, 2 * kKernels * kKernelNs);
  close(go[0]);
  close(go[1]);
}

TEST_F(CudaDoubleTest, MemoryHasCapacityAndRealBacking) {
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cuMemGetInfo(&free_before, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 1ull << 30);
  CUdeviceptr a = 0, b = 0, c = 0;
  ASSERT_EQ(cuMemAlloc(&a, 600ull << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&b, 600ull << 20), CUDA_ERROR_OUT_OF_MEMORY);
  size_t free_now = 0;
  ASSERT_EQ(cuMemGetInfo(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_before - free_now, 600ull << 20);
  ASSERT_EQ(cuMemAllocAsync(&c, 1 << 20, stream_), CUDA_SUCCESS);

  std::vector<uint32_t> host(256, 7), back(256, 0);
  ASSERT_EQ(cuMemcpyHtoD(c, host.data(), 1024), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32(c + 1024, 0xABCDu, 256), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoD(a, c, 2048), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH(back.data(), a, 1024), CUDA_SUCCESS);
  EXPECT_EQ(back, host);
  ASSERT_EQ(cuMemcpyDtoHAsync(back.data(), a + 1024, 1024, stream_), CUDA_SUCCESS);
  EXPECT_EQ(back[255], 0xABCDu);
  EXPECT_EQ(cuMemcpyDtoH(back.data(), c + (1 << 20) - 512, 1024), CUDA_ERROR_INVALID_VALUE);

  EXPECT_EQ(cuMemFreeAsync(c, stream_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemGetInfo(&free_now, &total), CUDA_SUCCESS);
  EXPECT_EQ(free_now, free_before);
}

TEST_F(CudaDoubleTest, CapacityIsSharedWithOtherProcesses) {
  CUdeviceptr held = 0;
  ASSERT_EQ(cuMemAlloc(&held, 700ull << 20), CUDA_SUCCESS);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CUdeviceptr p = 0;
    size_t free_bytes = 0, total = 0;
    if (cuMemGetInfo(&free_bytes, &total) != CUDA_SUCCESS) _exit(3);
    if (free_bytes > (324ull << 20)) _exit(4);
    if (cuMemAlloc(&p, 400ull << 20) != CUDA_ERROR_OUT_OF_MEMORY) _exit(5);
    _exit(cuMemAlloc(&p, 200ull << 20) == CUDA_SUCCESS ? 0 : 6);  // exit gives it back
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  CUdeviceptr more = 0;
  EXPECT_EQ(cuMemAlloc(&more, 300ull << 20), CUDA_SUCCESS);  // the dead child's memory is free
  EXPECT_EQ(cuMemFree(more), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(held), CUDA_SUCCESS);
}

TEST_F(CudaDoubleTest, VirtualMemoryMapsRealPages) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t granularity = 0;
  ASSERT_EQ(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  const size_t size = 4 * granularity;
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_EQ(cuMemCreate(&handle, size, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(va % granularity, 0u);
  ASSERT_EQ(cuMemMap(va, size, 0, handle, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cuMemSetAccess(va, size, &access, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8(va, 0x5A, size), CUDA_SUCCESS);
  unsigned char byte = 0;
  ASSERT_EQ(cuMemcpyDtoH(&byte, va + size - 1, 1), CUDA_SUCCESS);
  EXPECT_EQ(byte, 0x5A);
  EXPECT_EQ(cuMemRelease(handle), CUDA_SUCCESS);  // still mapped: stays alive
  EXPECT_EQ(cuMemAddressFree(va, size), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(va, size), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, size), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemCreate(&handle, granularity + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(CudaDoubleTest, PoolsAllocateOnTheirDevice) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = nullptr;
  ASSERT_EQ(cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAllocFromPoolAsync(&p, 4096, pool, stream_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(p, stream_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemPoolDestroy(pool), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAllocFromPoolAsync(&p, 4096, pool, stream_), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(CudaDoubleTest, CapturedGraphHasKernelNodesAndReplaysThem) {
  CUdeviceptr buffer = 0;
  ASSERT_EQ(cuMemAlloc(&buffer, 64), CUDA_SUCCESS);
  const uint32_t pattern[4] = {1, 2, 3, 4};
  ASSERT_EQ(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_EQ(cuStreamIsCapturing(stream_, &capturing), CUDA_SUCCESS);
  EXPECT_EQ(capturing, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  const uint64_t start = NowNs();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Spin(40 * kMs, stream_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoDAsync(buffer, pattern, sizeof(pattern), stream_), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(stream_), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream_), CUDA_SUCCESS);
  EXPECT_LT(NowNs() - start, 100 * kMs);  // captured, not run (run, it would take 120 ms)

  size_t count = 0;
  ASSERT_EQ(cuGraphGetNodes(graph, nullptr, &count), CUDA_SUCCESS);
  ASSERT_EQ(count, 4u);
  std::vector<CUgraphNode> nodes(count);
  ASSERT_EQ(cuGraphGetNodes(graph, nodes.data(), &count), CUDA_SUCCESS);
  int kernels = 0;
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type;
    ASSERT_EQ(cuGraphNodeGetType(node, &type), CUDA_SUCCESS);
    if (type == CU_GRAPH_NODE_TYPE_KERNEL) ++kernels;
  }
  EXPECT_EQ(kernels, 3);

  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  CUgraphNodeType type;
  EXPECT_EQ(cuGraphNodeGetType(nodes[0], &type), CUDA_ERROR_INVALID_HANDLE);
  const uint64_t launch = NowNs();
  ASSERT_EQ(cuGraphLaunch(exec, stream_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream_), CUDA_SUCCESS);
  EXPECT_GE(NowNs() - launch, 120 * kMs);
  uint32_t back[4] = {};
  ASSERT_EQ(cuMemcpyDtoH(back, buffer, sizeof(back)), CUDA_SUCCESS);
  EXPECT_EQ(memcmp(back, pattern, sizeof(back)), 0);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphLaunch(exec, stream_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuMemFree(buffer), CUDA_SUCCESS);
}

TEST_F(CudaDoubleTest, CapturedMemsetsAndUnifiedCopiesReplay) {
  CUdeviceptr buffer = 0;
  ASSERT_EQ(cuMemAlloc(&buffer, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32Async(buffer, 0x01020304u, 1024, stream_), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  uint32_t word = 0;
  ASSERT_EQ(cuMemcpy(reinterpret_cast<CUdeviceptr>(&word), buffer, sizeof(word)), CUDA_SUCCESS);
  EXPECT_EQ(word, 0u);  // captured, not run
  CUgraphExec exec = nullptr;
  CUDA_GRAPH_INSTANTIATE_PARAMS params{};
  ASSERT_EQ(cuGraphInstantiateWithParams(&exec, graph, &params), CUDA_SUCCESS);
  EXPECT_EQ(params.result_out, CUDA_GRAPH_INSTANTIATE_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, stream_), CUDA_SUCCESS);
  ASSERT_EQ(
      cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(&word), buffer + 4092, sizeof(word), stream_),
      CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream_), CUDA_SUCCESS);
  EXPECT_EQ(word, 0x01020304u);
  ASSERT_EQ(cuMemsetD8Async(buffer, 0xFF, 4096, stream_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpy(reinterpret_cast<CUdeviceptr>(&word), buffer + 4094, sizeof(word)),
            CUDA_ERROR_INVALID_VALUE);  // runs off the end of the allocation
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(buffer), CUDA_SUCCESS);
}

TEST_F(CudaDoubleTest, BadHandlesAreErrorsNotCrashes) {
  int junk = 0;
  auto* forged = reinterpret_cast<void*>(&junk);
  EXPECT_EQ(cuStreamSynchronize(static_cast<CUstream>(forged)), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuLaunchKernel(static_cast<CUfunction>(forged), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr,
                           nullptr),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventRecord(static_cast<CUevent>(forged), stream_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuCtxSetCurrent(static_cast<CUcontext>(forged)), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuGraphLaunch(static_cast<CUgraphExec>(forged), stream_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuMemFree(0x1234), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Spin(1, static_cast<CUstream>(forged)), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuLaunchKernel(spin_, 0, 1, 1, 1, 1, 1, 0, stream_, nullptr, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  CUfunction missing = nullptr;
  EXPECT_EQ(cuModuleGetFunction(&missing, module_, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
  const char* name = nullptr;
  EXPECT_EQ(cuFuncGetName(&name, spin_), CUDA_SUCCESS);
  EXPECT_STREQ(name, "orion_spin");

  // Without a current context, context-bound calls say so.
  ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(Spin(1, nullptr), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);

  CUcontext own = nullptr;
  ASSERT_EQ(cuCtxCreate(&own, nullptr, 0, 0), CUDA_SUCCESS);
  CUcontext current = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, own);
  EXPECT_EQ(cuCtxDestroy(own), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy(own), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
}

// A context's ID is its own: a context created after another was destroyed (at its address, or
// not) has a new one; the null context is the current one.
TEST_F(CudaDoubleTest, ContextIdsAreNeverReused) {
  unsigned long long primary = 0, current = 0, first = 0, second = 0;
  ASSERT_EQ(cuCtxGetId(ctx_, &primary), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxGetId(nullptr, &current), CUDA_SUCCESS);
  EXPECT_EQ(current, primary);
  CUcontext own = nullptr;
  ASSERT_EQ(cuCtxCreate(&own, nullptr, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxGetId(own, &first), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy(own), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxGetId(own, &second), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(cuCtxCreate(&own, nullptr, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxGetId(own, &second), CUDA_SUCCESS);
  EXPECT_NE(first, primary);
  EXPECT_NE(second, first);
  EXPECT_NE(second, primary);
  ASSERT_EQ(cuCtxDestroy(own), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
}

TEST_F(CudaDoubleTest, ErrorNamesAndStrings) {
  const char* text = nullptr;
  ASSERT_EQ(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "CUDA_ERROR_OUT_OF_MEMORY");
  ASSERT_EQ(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "out of memory");
  EXPECT_EQ(cuGetErrorName(static_cast<CUresult>(123456), &text), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(CudaDoubleTest, GetProcAddressFindsVersionedAndPerThreadSymbols) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_EQ(cuGetProcAddress("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(&cuMemAlloc_v2));

  // The per-thread flag selects the _ptsz twin; the plain one otherwise.
  void* plain = nullptr;
  void* per_thread = nullptr;
  ASSERT_EQ(cuGetProcAddress("cuLaunchKernel", &plain, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_SUCCESS);
  ASSERT_EQ(cuGetProcAddress("cuLaunchKernel", &per_thread, 12000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
            CUDA_SUCCESS);
  EXPECT_NE(plain, per_thread);

  // The 4-argument legacy entry point, and version selection.
  void* elapsed = nullptr;
  using GetProc4 = CUresult (*)(const char*, void**, int, cuuint64_t);
  void* legacy = nullptr;
  ASSERT_EQ(cuGetProcAddress("cuGetProcAddress", &legacy, 11030, 0, &status), CUDA_SUCCESS);
  ASSERT_NE(legacy, nullptr);
  ASSERT_EQ(reinterpret_cast<GetProc4>(legacy)("cuEventElapsedTime", &elapsed, 12000, 0),
            CUDA_SUCCESS);
  void* elapsed_v2 = nullptr;
  ASSERT_EQ(cuGetProcAddress("cuEventElapsedTime", &elapsed_v2, 13000, 0, &status), CUDA_SUCCESS);
  EXPECT_NE(elapsed, elapsed_v2);
  EXPECT_EQ(elapsed_v2, reinterpret_cast<void*>(&cuEventElapsedTime_v2));

  // Launching through the looked-up pointer works like the direct call.
  using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, unsigned, CUstream, void**, void**);
  unsigned long long ns = 1000;
  void* args[] = {&ns};
  EXPECT_EQ(
      reinterpret_cast<LaunchFn>(per_thread)(spin_, 1, 1, 1, 1, 1, 1, 0, stream_, args, nullptr),
      CUDA_SUCCESS);

  fn = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(cuGetProcAddress("cuNoSuchCall", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(cuGetProcAddress("cuMemAllocAsync", &fn, 11000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

// As the NVIDIA runtime shows a container only the GPUs of its NVIDIA_VISIBLE_DEVICES, the
// double shows a process only its own GPUs named there, in that order, with their UUIDs; any
// other value leaves every simulated device visible. The variable is read once, so each case
// runs in a fresh process (this test binary again, in child mode).
TEST(CudaDoubleVisibleDevices, OnlyTheGpusNvidiaVisibleDevicesNames) {
  if (const char* want = getenv("ORION_DOUBLE_VISIBLE_CHILD")) {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    int count = -1;
    ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    std::string seen;
    for (int i = 0; i < count; ++i) {
      CUuuid u{};
      ASSERT_EQ(cuDeviceGetUuid(&u, i), CUDA_SUCCESS);
      seen += std::to_string(static_cast<int>(u.bytes[15]));
    }
    EXPECT_EQ(seen, want);  // the last UUID byte of each visible ordinal
    return;
  }
  static char dir[] = "/tmp/orion-sim-visible-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string g0 = "GPU-6f72696f-6e2d-7369-6d00-000000000000";
  const std::string g1 = "GPU-6f72696f-6e2d-7369-6d00-000000000001";
  struct Case {
    std::string visible, want;
  };
  for (const Case& c : std::vector<Case>{{g1, "1"},
                                         {g1 + "," + g0, "10"},
                                         {"all", "012"},
                                         {g1 + ",GPU-0b1c2d3e-7777-8888-9999-aaaabbbbcccc", "012"}}) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("NVIDIA_VISIBLE_DEVICES", c.visible.c_str(), 1);
      setenv("ORION_SIM_DEVICES", "3", 1);
      setenv("ORION_SIM_DIR", dir, 1);
      setenv("ORION_DOUBLE_VISIBLE_CHILD", c.want.c_str(), 1);
      execl("/proc/self/exe", "cuda_double_test",
            "--gtest_filter=CudaDoubleVisibleDevices.OnlyTheGpusNvidiaVisibleDevicesNames",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "NVIDIA_VISIBLE_DEVICES=" << c.visible << " should show " << c.want;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
