// cuBLAS and cuBLASLt GEMM hooks (blas_functions.def): while a high-priority client shares its
// GPU, a best-effort client's GEMM predicted to run longer than the GPU's best-effort budget runs
// as several calls over slices of its output (gemm_split.h). Each piece is a kernel launch of its
// own that the gate may hold, so a request that arrives waits for one piece, not for a GEMM of
// milliseconds. A shape's duration is learned by timing some of its calls with two events on
// their stream. Everything else goes straight to the real library (the next one that defines the
// symbol: RTLD_NEXT); a call inside a hook's own calls (cuBLAS calling cuBLASLt) too.
#include "interpose/glibc_compat.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "interpose/blas_abi.h"
#include "interpose/client_state.h"
#include "interpose/gemm_split.h"
#include "interpose/launch_gate.h"
#include "interpose/real_driver.h"

namespace orion::interpose {
namespace {

// ---- the real library --------------------------------------------------------------------------

using GetStreamFn = cublasStatus_t (*)(cublasHandle_t, CUstream*);
using LayoutGetFn = cublasStatus_t (*)(cublasLtMatrixLayout_t, int, void*, size_t, size_t*);
using LayoutSetFn = cublasStatus_t (*)(cublasLtMatrixLayout_t, int, const void*, size_t);
using LayoutCreateFn = cublasStatus_t (*)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t,
                                          uint64_t, int64_t);
using LayoutDestroyFn = cublasStatus_t (*)(cublasLtMatrixLayout_t);
using DescGetFn = cublasStatus_t (*)(cublasLtMatmulDesc_t, int, void*, size_t, size_t*);
using AlgoCheckFn = cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                       const cublasLtMatmulAlgo_t*,
                                       cublasLtMatmulHeuristicResult_t*);

enum RealBlasId {
  kGemmEx, kGemmStridedBatchedEx, kSgemm, kSgemmStridedBatched, kLtMatmul, kGetStream,
  kLayoutGet, kLayoutSet, kLayoutCreate, kLayoutDestroy, kDescGet, kAlgoCheck, kRealBlasCount
};
constexpr const char* kRealBlasNames[kRealBlasCount] = {
    "cublasGemmEx", "cublasGemmStridedBatchedEx", "cublasSgemm_v2", "cublasSgemmStridedBatched",
    "cublasLtMatmul", "cublasGetStream_v2", "cublasLtMatrixLayoutGetAttribute",
    "cublasLtMatrixLayoutSetAttribute", "cublasLtMatrixLayoutCreate",
    "cublasLtMatrixLayoutDestroy", "cublasLtMatmulDescGetAttribute", "cublasLtMatmulAlgoCheck"};
std::atomic<void*> g_real_blas[kRealBlasCount];

// `name` in a loaded library whose file name starts with `prefix` (libcublas.so.13, or .12):
// one that a library dlopen'ed with RTLD_LOCAL loaded (PyTorch's libtorch_cuda.so loads cuBLAS
// so) is not in the global scope that RTLD_NEXT searches, though its callers reach our hooks.
struct LoadedLookup {
  const char* prefix;
  char path[512] = {};
};

int FindLoaded(dl_phdr_info* info, size_t, void* data) {
  auto* look = static_cast<LoadedLookup*>(data);
  const char* path = info->dlpi_name;
  if (path == nullptr || path[0] == '\0' || strlen(path) >= sizeof(look->path)) return 0;
  const char* base = strrchr(path, '/');
  base = base != nullptr ? base + 1 : path;
  if (strncmp(base, look->prefix, strlen(look->prefix)) != 0) return 0;
  memcpy(look->path, path, strlen(path) + 1);
  return 1;
}

// The loader's lock is held while dl_iterate_phdr runs: the library is opened after it.
void* LookInLoaded(const char* prefix, const char* name) {
  LoadedLookup look{prefix};
  if (dl_iterate_phdr(FindLoaded, &look) == 0) return nullptr;
  void* handle = dlopen(look.path, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* fn = RealDlsym(handle, name);
  dlclose(handle);  // RTLD_NOLOAD took a reference; the library stays loaded by its owner
  return fn;
}

// The object that called the hook (set by each exported hook): a library that links cuBLAS
// statically and exports its symbols finds its own definition there.
constinit thread_local const void* t_caller ORION_INITIAL_EXEC_TLS = nullptr;

void* LookInCaller(const char* name) {
  Dl_info info{};
  if (t_caller == nullptr || dladdr(t_caller, &info) == 0 || info.dli_fname == nullptr) {
    return nullptr;
  }
  void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* fn = RealDlsym(handle, name);  // the caller's own scope: never this library
  dlclose(handle);
  return fn;
}

// The real entry point behind ours: the next definition in the global scope, else the loaded
// cuBLAS library's, else the calling object's own; null where none defines it.
template <typename Fn>
Fn RealBlas(RealBlasId id) {
  void* fn = g_real_blas[id].load(std::memory_order_acquire);
  if (fn == nullptr) {
    const char* name = kRealBlasNames[id];
    fn = RealDlsym(RTLD_NEXT, name);
    if (fn == nullptr) {
      fn = LookInLoaded(strncmp(name, "cublasLt", 8) == 0 ? "libcublasLt.so" : "libcublas.so",
                        name);
    }
    if (fn == nullptr) fn = LookInCaller(name);
    g_real_blas[id].store(fn, std::memory_order_release);
  }
  return reinterpret_cast<Fn>(fn);
}

// Set on a thread while a hook calls the real library: what that call calls goes straight on.
constinit thread_local bool t_inside ORION_INITIAL_EXEC_TLS = false;
struct Inside {
  bool outer = !t_inside;
  Inside() { t_inside = true; }
  ~Inside() { t_inside = !outer; }
};

// ---- what was split (ORION_GEMM_SPLIT_REPORT=1 prints it at exit) ------------------------------

std::atomic<uint64_t> g_split_calls{0};
std::atomic<uint64_t> g_split_pieces{0};
std::atomic<uint64_t> g_looked_at{0};

// ---- the bound ---------------------------------------------------------------------------------

uint64_t BoundNow() {
  if (!EnsureProcessInit()) return 0;
  const EnvConfig& config = Config();
  if (config.disabled) return 0;
  GemmSplitView view;
  view.forced_ns = config.gemm_split_force_ns;
  view.enabled = config.gemm_split;
  if (view.forced_ns == 0 && view.enabled) {
    CUcontext ctx = nullptr;
    if (Registration* reg = CurrentRegistration(&ctx); reg != nullptr) {
      const contract::GpuState& gpu = *reg->gpu;
      view.registered = true;
      view.best_effort = reg->slot->priority.load(std::memory_order_relaxed) !=
                         static_cast<uint32_t>(contract::Priority::kHigh);
      view.gate_on = gpu.mode.load(std::memory_order_relaxed) !=
                     static_cast<uint32_t>(contract::GateMode::kPassThrough);
      view.high_present = HighPriorityPresent(gpu, reg->slot_index);
      view.budget_ns = gpu.be_budget_ns.load(std::memory_order_relaxed);
    }
  }
  return GemmSplitBoundNs(view);
}

// A stream being captured into a graph runs nothing now: its GEMMs go whole (a graph replay is
// gated as one launch).
bool StreamCapturing(CUstream stream) {
  if (g_process.open_captures.load(std::memory_order_relaxed) <= 0) return false;
  auto is_capturing = ORION_DRIVER(cuStreamIsCapturing);
  if (is_capturing == nullptr) return true;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return is_capturing(stream, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// ---- shapes and their durations ----------------------------------------------------------------

struct ShapeKey {
  uint64_t words[8] = {};
  bool operator==(const ShapeKey& o) const { return memcmp(words, o.words, sizeof(words)) == 0; }
  uint64_t Hash() const {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (uint64_t w : words) h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
  }
};

enum class Timing : uint8_t { kIdle, kRunning, kRecorded };

struct ShapeEntry {
  bool used = false;
  bool refused = false;  // a piece failed once, or cuBLASLt's algorithm does not take the slices
  int8_t lt_checked = 0;  // cuBLASLt: 1 the algorithm takes the slices, -1 it does not
  Timing timing = Timing::kIdle;
  ShapeKey key;
  uint64_t calls = 0;
  GemmDuration duration;
  CUevent start = nullptr;
  CUevent end = nullptr;
};

constexpr uint32_t kShapes = 512;  // a full table: new shapes go whole
ShapeEntry g_shapes[kShapes];
pthread_mutex_t g_shapes_lock = PTHREAD_MUTEX_INITIALIZER;

struct LockShapes {
  LockShapes() { pthread_mutex_lock(&g_shapes_lock); }
  ~LockShapes() { pthread_mutex_unlock(&g_shapes_lock); }
};

ShapeEntry* FindShape(const ShapeKey& key) {
  const uint64_t h = key.Hash();
  for (uint32_t i = 0; i < kShapes; ++i) {
    ShapeEntry& e = g_shapes[(h + i) % kShapes];
    if (!e.used) {
      e.used = true;
      e.key = key;
      return &e;
    }
    if (e.key == key) return &e;
  }
  return nullptr;
}

// Takes in the shape's timed call once its end event has completed (lock held).
void CollectSample(ShapeEntry& e) {
  if (e.timing != Timing::kRecorded) return;
  auto query = ORION_DRIVER(cuEventQuery);
  auto elapsed = ORION_DRIVER(cuEventElapsedTime_v2);
  const CUresult done = query != nullptr ? query(e.end) : CUDA_ERROR_NOT_FOUND;
  if (done == CUDA_ERROR_NOT_READY) return;
  float ms = 0;
  if (done == CUDA_SUCCESS && elapsed != nullptr && elapsed(&ms, e.start, e.end) == CUDA_SUCCESS &&
      ms > 0) {
    e.duration.Add(static_cast<uint64_t>(static_cast<double>(ms) * 1e6));
  }
  e.timing = Timing::kIdle;
}

struct CallPlan {
  ShapeEntry* entry = nullptr;
  GemmPlan plan;
  bool timed = false;
};

CallPlan PlanCall(const ShapeKey& key, int64_t m, int64_t n, uint64_t bound_ns, bool rows) {
  CallPlan call;
  LockShapes lock;
  ShapeEntry* e = FindShape(key);
  if (e == nullptr) return call;
  call.entry = e;
  CollectSample(*e);
  const uint64_t index = e->calls++;
  if (e->timing == Timing::kIdle && GemmCallTimed(index)) {
    e->timing = Timing::kRunning;  // this call owns the events until it recorded both
    call.timed = true;
  }
  if (!e->refused && e->lt_checked >= 0) {
    call.plan = PlanGemmSplit(m, n, e->duration.EstimateNs(), bound_ns, rows);
  }
  return call;
}

void Refuse(ShapeEntry* e) {
  LockShapes lock;
  e->refused = true;
}

// Records the timed call's start (before its first piece) or end (after its last) on `stream`.
void RecordTiming(ShapeEntry* e, CUstream stream, bool start) {
  auto create = ORION_DRIVER(cuEventCreate);
  auto record = ORION_DRIVER(cuEventRecord);
  bool ok = create != nullptr && record != nullptr;
  if (ok && e->start == nullptr) ok = create(&e->start, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
  if (ok && e->end == nullptr) ok = create(&e->end, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
  ok = ok && record(start ? e->start : e->end, stream) == CUDA_SUCCESS;
  if (!ok || !start) {
    LockShapes lock;
    e->timing = ok ? Timing::kRecorded : Timing::kIdle;
  }
}

uint64_t CurrentContextWord() {
  CUcontext ctx = nullptr;
  if (auto get = g_process.ctx_get_current; get != nullptr) get(&ctx);
  return reinterpret_cast<uint64_t>(ctx);
}

// Runs `pieces` of a plan through `piece(slice, shift)`; a first piece that fails leaves the
// output untouched: the shape is refused and the call goes whole.
template <typename Piece, typename Whole>
cublasStatus_t RunPieces(const CallPlan& call, const GemmOperands& operands, int64_t m,
                         int64_t n, Piece piece, Whole whole) {
  for (uint32_t i = 0; i < call.plan.pieces; ++i) {
    const GemmSlice slice = SliceOf(call.plan, i, m, n);
    const cublasStatus_t status = piece(slice, ShiftOf(operands, call.plan.axis, slice.start));
    if (status != blas::kSuccess) {
      if (i != 0) return status;
      Refuse(call.entry);
      return whole();
    }
  }
  if (!g_process.splits_gemms.load(std::memory_order_relaxed)) {
    g_process.splits_gemms.store(true, std::memory_order_relaxed);
  }
  g_split_calls.fetch_add(1, std::memory_order_relaxed);
  g_split_pieces.fetch_add(call.plan.pieces, std::memory_order_relaxed);
  return blas::kSuccess;
}

template <typename T>
const T* Moved(const T* p, uint64_t bytes) {
  return p == nullptr ? p
                      : reinterpret_cast<const T*>(reinterpret_cast<const char*>(p) + bytes);
}
template <typename T>
T* Moved(T* p, uint64_t bytes) {
  return p == nullptr ? p : reinterpret_cast<T*>(reinterpret_cast<char*>(p) + bytes);
}

// ---- cuBLAS ------------------------------------------------------------------------------------

struct ClassicGemm {
  RealBlasId api;
  cublasHandle_t handle;
  cublasOperation_t transa, transb;
  int m, n, k;
  const void* alpha;
  const void* a;
  cudaDataType atype;
  int lda;
  long long stride_a;
  const void* b;
  cudaDataType btype;
  int ldb;
  long long stride_b;
  const void* beta;
  void* c;
  cudaDataType ctype;
  int ldc;
  long long stride_c;
  int batch;
  cublasComputeType_t compute;
  cublasGemmAlgo_t algo;
};

cublasStatus_t CallReal(const ClassicGemm& g) {
  Inside inside;
  switch (g.api) {
    case kGemmEx:
      if (auto fn = RealBlas<decltype(&cublasGemmEx)>(kGemmEx)) {
        return fn(g.handle, g.transa, g.transb, g.m, g.n, g.k, g.alpha, g.a, g.atype, g.lda, g.b,
                  g.btype, g.ldb, g.beta, g.c, g.ctype, g.ldc, g.compute, g.algo);
      }
      break;
    case kGemmStridedBatchedEx:
      if (auto fn = RealBlas<decltype(&cublasGemmStridedBatchedEx)>(kGemmStridedBatchedEx)) {
        return fn(g.handle, g.transa, g.transb, g.m, g.n, g.k, g.alpha, g.a, g.atype, g.lda,
                  g.stride_a, g.b, g.btype, g.ldb, g.stride_b, g.beta, g.c, g.ctype, g.ldc,
                  g.stride_c, g.batch, g.compute, g.algo);
      }
      break;
    case kSgemm:
      if (auto fn = RealBlas<decltype(&cublasSgemm_v2)>(kSgemm)) {
        return fn(g.handle, g.transa, g.transb, g.m, g.n, g.k,
                  static_cast<const float*>(g.alpha), static_cast<const float*>(g.a), g.lda,
                  static_cast<const float*>(g.b), g.ldb, static_cast<const float*>(g.beta),
                  static_cast<float*>(g.c), g.ldc);
      }
      break;
    case kSgemmStridedBatched:
      if (auto fn = RealBlas<decltype(&cublasSgemmStridedBatched)>(kSgemmStridedBatched)) {
        return fn(g.handle, g.transa, g.transb, g.m, g.n, g.k,
                  static_cast<const float*>(g.alpha), static_cast<const float*>(g.a), g.lda,
                  g.stride_a, static_cast<const float*>(g.b), g.ldb, g.stride_b,
                  static_cast<const float*>(g.beta), static_cast<float*>(g.c), g.ldc, g.stride_c,
                  g.batch);
      }
      break;
    default:
      break;
  }
  return blas::kNotInitialized;  // no cuBLAS behind us: what a missing library would answer
}

cublasStatus_t ClassicHook(const ClassicGemm& g) {
  if (t_inside) return CallReal(g);
  const uint64_t bound = BoundNow();
  if (bound == 0 || !GemmMayExceed(g.m, g.n, g.k, g.batch, bound)) return CallReal(g);
  GemmOperands op;
  op.lda = g.lda;
  op.ldb = g.ldb;
  op.ldc = op.ldd = g.ldc;
  op.a_transposed = g.transa != blas::kOpN;
  op.b_transposed = g.transb != blas::kOpN;
  op.a_bytes = ElementBytes(g.atype);
  op.b_bytes = ElementBytes(g.btype);
  op.c_bytes = op.d_bytes = ElementBytes(g.ctype);
  auto get_stream = RealBlas<GetStreamFn>(kGetStream);
  CUstream stream = nullptr;
  if (op.a_bytes == 0 || op.b_bytes == 0 || op.c_bytes == 0 || get_stream == nullptr ||
      get_stream(g.handle, &stream) != blas::kSuccess || StreamCapturing(stream)) {
    return CallReal(g);
  }
  g_looked_at.fetch_add(1, std::memory_order_relaxed);
  ShapeKey key;
  key.words[0] = static_cast<uint64_t>(g.api) | static_cast<uint64_t>(g.transa) << 8 |
                 static_cast<uint64_t>(g.transb) << 16 | static_cast<uint64_t>(g.atype) << 24 |
                 static_cast<uint64_t>(g.btype) << 32 | static_cast<uint64_t>(g.ctype) << 40;
  key.words[1] = static_cast<uint64_t>(static_cast<uint32_t>(g.m)) << 32 |
                 static_cast<uint32_t>(g.n);
  key.words[2] = static_cast<uint64_t>(static_cast<uint32_t>(g.k)) << 32 |
                 static_cast<uint32_t>(g.batch);
  key.words[3] = static_cast<uint64_t>(static_cast<uint32_t>(g.lda)) << 32 |
                 static_cast<uint32_t>(g.ldb);
  key.words[4] = static_cast<uint64_t>(static_cast<uint32_t>(g.ldc)) << 32 |
                 static_cast<uint32_t>(g.compute);
  key.words[5] = CurrentContextWord();
  key.words[6] = reinterpret_cast<uint64_t>(g.handle);
  const CallPlan call = PlanCall(key, g.m, g.n, bound, /*rows=*/true);
  if (call.timed) RecordTiming(call.entry, stream, /*start=*/true);
  cublasStatus_t status;
  if (call.plan.axis == GemmAxis::kNone) {
    status = CallReal(g);
  } else {
    status = RunPieces(
        call, op, g.m, g.n,
        [&](const GemmSlice& s, const GemmShift& d) {
          ClassicGemm piece = g;
          piece.m = static_cast<int>(s.m);
          piece.n = static_cast<int>(s.n);
          piece.a = Moved(g.a, d.a);
          piece.b = Moved(g.b, d.b);
          piece.c = Moved(g.c, d.c);
          return CallReal(piece);
        },
        [&] { return CallReal(g); });
  }
  if (call.timed) RecordTiming(call.entry, stream, /*start=*/false);
  return status;
}

// ---- cuBLASLt ----------------------------------------------------------------------------------

struct LtLayout {
  uint32_t type = 0;
  int32_t order = 0;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
  int64_t plane = 0;
  uint32_t mode = 0;
};

bool ReadLayout(cublasLtMatrixLayout_t layout, LtLayout* out) {
  auto get = RealBlas<LayoutGetFn>(kLayoutGet);
  if (get == nullptr || layout == nullptr) return false;
  size_t written = 0;
  auto read = [&](int attr, void* buf, size_t size, bool required) {
    return get(layout, attr, buf, size, &written) == blas::kSuccess || !required;
  };
  return read(blas::kLayoutType, &out->type, sizeof(out->type), true) &&
         read(blas::kLayoutOrder, &out->order, sizeof(out->order), true) &&
         read(blas::kLayoutRows, &out->rows, sizeof(out->rows), true) &&
         read(blas::kLayoutCols, &out->cols, sizeof(out->cols), true) &&
         read(blas::kLayoutLd, &out->ld, sizeof(out->ld), true) &&
         read(blas::kLayoutBatchCount, &out->batch, sizeof(out->batch), true) &&
         read(blas::kLayoutBatchStride, &out->stride, sizeof(out->stride), true) &&
         read(blas::kLayoutPlaneOffset, &out->plane, sizeof(out->plane), false) &&
         read(blas::kLayoutBatchMode, &out->mode, sizeof(out->mode), false) &&
         out->order == 0 && out->plane == 0 && out->mode == 0 && out->batch >= 1;
}

// A call as slicing by columns needs it: none of what a column slice would change otherwise
// (an auxiliary output, a reduction over columns, vectors of alpha, block scales, an amax).
struct LtCall {
  LtLayout a, b, c, d;
  int32_t transa = 0, transb = 0;
  int64_t m = 0, n = 0, k = 0;
};

bool ReadLtCall(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t adesc,
                cublasLtMatrixLayout_t bdesc, cublasLtMatrixLayout_t cdesc,
                cublasLtMatrixLayout_t ddesc, LtCall* call) {
  auto get = RealBlas<DescGetFn>(kDescGet);
  if (get == nullptr || desc == nullptr) return false;
  size_t written = 0;
  auto read_int = [&](int attr, int32_t fallback) {
    int32_t v = fallback;
    return get(desc, attr, &v, sizeof(v), &written) == blas::kSuccess ? v : fallback;
  };
  call->transa = read_int(blas::kDescTransA, 0);
  call->transb = read_int(blas::kDescTransB, 0);
  uint32_t epilogue = 1;
  void* amax = nullptr;
  if (get(desc, blas::kDescEpilogue, &epilogue, sizeof(epilogue), &written) != blas::kSuccess ||
      !blas::EpilogueSlicesByColumns(epilogue) || read_int(blas::kDescTransC, 0) != blas::kOpN ||
      static_cast<uint32_t>(read_int(blas::kDescPointerMode, 0)) > 1 ||
      (get(desc, blas::kDescAmaxD, &amax, sizeof(amax), &written) == blas::kSuccess &&
       amax != nullptr)) {
    return false;
  }
  for (int attr : {blas::kDescAScaleMode, blas::kDescBScaleMode, blas::kDescCScaleMode,
                   blas::kDescDScaleMode, blas::kDescDOutScaleMode}) {
    if (read_int(attr, 0) != 0) return false;
  }
  if (!ReadLayout(adesc, &call->a) || !ReadLayout(bdesc, &call->b) ||
      !ReadLayout(cdesc, &call->c) || !ReadLayout(ddesc, &call->d)) {
    return false;
  }
  call->m = static_cast<int64_t>(call->d.rows);
  call->n = static_cast<int64_t>(call->d.cols);
  call->k = static_cast<int64_t>(call->transa == blas::kOpN ? call->a.cols : call->a.rows);
  const bool b_ok = call->transb == blas::kOpN
                        ? call->b.rows == static_cast<uint64_t>(call->k) && call->b.cols == call->d.cols
                        : call->b.cols == static_cast<uint64_t>(call->k) && call->b.rows == call->d.cols;
  return b_ok && call->c.rows == call->d.rows && call->c.cols == call->d.cols &&
         call->c.batch == call->d.batch;
}

// The layouts of one column slice `width` wide: B's, C's and D's (C's is D's where the caller
// passed one layout for both).
struct SliceLayouts {
  cublasLtMatrixLayout_t b = nullptr, c = nullptr, d = nullptr;
  bool shared_cd = false;

  ~SliceLayouts() {
    auto destroy = RealBlas<LayoutDestroyFn>(kLayoutDestroy);
    if (destroy == nullptr) return;
    if (b != nullptr) destroy(b);
    if (d != nullptr) destroy(d);
    if (c != nullptr && !shared_cd) destroy(c);
  }
};

bool MakeLayout(const LtLayout& like, uint64_t rows, uint64_t cols,
                cublasLtMatrixLayout_t* out) {
  auto create = RealBlas<LayoutCreateFn>(kLayoutCreate);
  auto set = RealBlas<LayoutSetFn>(kLayoutSet);
  if (create == nullptr || set == nullptr ||
      create(out, static_cast<cudaDataType>(like.type), rows, cols, like.ld) != blas::kSuccess) {
    *out = nullptr;
    return false;
  }
  return like.batch == 1 ||
         (set(*out, blas::kLayoutBatchCount, &like.batch, sizeof(like.batch)) == blas::kSuccess &&
          set(*out, blas::kLayoutBatchStride, &like.stride, sizeof(like.stride)) ==
              blas::kSuccess);
}

bool MakeSliceLayouts(const LtCall& call, bool shared_cd, int64_t width, SliceLayouts* out) {
  const auto w = static_cast<uint64_t>(width);
  out->shared_cd = shared_cd;
  const bool b_ok = call.transb == blas::kOpN ? MakeLayout(call.b, call.b.rows, w, &out->b)
                                              : MakeLayout(call.b, w, call.b.cols, &out->b);
  if (!b_ok || !MakeLayout(call.d, call.d.rows, w, &out->d)) return false;
  if (shared_cd) {
    out->c = out->d;
    return true;
  }
  return MakeLayout(call.c, call.c.rows, w, &out->c);
}

}  // namespace
}  // namespace orion::interpose

using namespace orion::interpose;  // NOLINT: the exported hooks below

ORION_BLAS_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int m, int n, int k,
                                              const void* alpha, const void* A, cudaDataType Atype,
                                              int lda, const void* B, cudaDataType Btype, int ldb,
                                              const void* beta, void* C, cudaDataType Ctype,
                                              int ldc, cublasComputeType_t computeType,
                                              cublasGemmAlgo_t algo) {
  t_caller = __builtin_return_address(0);
  return ClassicHook({kGemmEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
                      ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo});
}

ORION_BLAS_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  t_caller = __builtin_return_address(0);
  return ClassicHook({kGemmStridedBatchedEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda,
                      strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                      computeType, algo});
}

ORION_BLAS_EXPORT cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k,
                                                const float* alpha, const float* A, int lda,
                                                const float* B, int ldb, const float* beta,
                                                float* C, int ldc) {
  t_caller = __builtin_return_address(0);
  return ClassicHook({kSgemm, handle, transa, transb, m, n, k, alpha, A, blas::kDataR32F, lda, 0, B,
                      blas::kDataR32F, ldb, 0, beta, C, blas::kDataR32F, ldc, 0, 1, 0, 0});
}

ORION_BLAS_EXPORT cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float* alpha, const float* A, int lda, long long int strideA, const float* B, int ldb,
    long long int strideB, const float* beta, float* C, int ldc, long long int strideC,
    int batchCount) {
  t_caller = __builtin_return_address(0);
  return ClassicHook({kSgemmStridedBatched, handle, transa, transb, m, n, k, alpha, A,
                      blas::kDataR32F, lda, strideA, B, blas::kDataR32F, ldb, strideB, beta, C,
                      blas::kDataR32F, ldc, strideC, batchCount, 0, 0});
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
    const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
    size_t workspaceSizeInBytes, CUstream stream) {
  t_caller = __builtin_return_address(0);
  auto real = RealBlas<decltype(&cublasLtMatmul)>(kLtMatmul);
  if (real == nullptr) return blas::kNotInitialized;
  auto call_real = [&](const void* b, cublasLtMatrixLayout_t bd, const void* c,
                       cublasLtMatrixLayout_t cd, void* d, cublasLtMatrixLayout_t dd) {
    Inside inside;
    return real(lightHandle, computeDesc, alpha, A, Adesc, b, bd, beta, c, cd, d, dd, algo,
                workspace, workspaceSizeInBytes, stream);
  };
  auto whole = [&] { return call_real(B, Bdesc, C, Cdesc, D, Ddesc); };
  if (t_inside) return whole();
  const uint64_t bound = BoundNow();
  if (bound == 0) return whole();
  LtCall lt;
  if (!ReadLtCall(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &lt) ||
      !GemmMayExceed(lt.m, lt.n, lt.k, lt.d.batch, bound) || StreamCapturing(stream)) {
    return whole();
  }
  GemmOperands op;
  op.lda = lt.a.ld;
  op.ldb = lt.b.ld;
  op.ldc = lt.c.ld;
  op.ldd = lt.d.ld;
  op.a_transposed = lt.transa != blas::kOpN;
  op.b_transposed = lt.transb != blas::kOpN;
  op.a_bytes = ElementBytes(static_cast<int>(lt.a.type));
  op.b_bytes = ElementBytes(static_cast<int>(lt.b.type));
  op.c_bytes = ElementBytes(static_cast<int>(lt.c.type));
  op.d_bytes = ElementBytes(static_cast<int>(lt.d.type));
  if (op.a_bytes == 0 || op.b_bytes == 0 || op.c_bytes == 0 || op.d_bytes == 0) return whole();
  g_looked_at.fetch_add(1, std::memory_order_relaxed);
  ShapeKey key;
  key.words[0] = static_cast<uint64_t>(kLtMatmul) | static_cast<uint64_t>(lt.transa) << 8 |
                 static_cast<uint64_t>(lt.transb) << 16 | static_cast<uint64_t>(lt.a.type) << 24 |
                 static_cast<uint64_t>(lt.b.type) << 32 | static_cast<uint64_t>(lt.d.type) << 40;
  key.words[1] = static_cast<uint64_t>(lt.m) << 32 ^ static_cast<uint64_t>(lt.n);
  key.words[2] = static_cast<uint64_t>(lt.k) << 32 ^ static_cast<uint64_t>(lt.d.batch);
  key.words[3] = static_cast<uint64_t>(lt.a.ld) << 32 ^ static_cast<uint64_t>(lt.b.ld);
  key.words[4] = static_cast<uint64_t>(lt.c.ld) << 32 ^ static_cast<uint64_t>(lt.d.ld);
  key.words[5] = CurrentContextWord();
  key.words[6] = reinterpret_cast<uint64_t>(computeDesc);
  if (algo != nullptr) {
    for (uint64_t w : algo->data) key.words[7] = (key.words[7] ^ w) * 0x100000001B3ull;
  }
  CallPlan call = PlanCall(key, lt.m, lt.n, bound, /*rows=*/false);
  const bool shared_cd = Cdesc == Ddesc;
  SliceLayouts full, last;
  if (call.plan.axis == GemmAxis::kColumns) {
    const GemmSlice tail = SliceOf(call.plan, call.plan.pieces - 1, lt.m, lt.n);
    bool ok = MakeSliceLayouts(lt, shared_cd, call.plan.width, &full) &&
              MakeSliceLayouts(lt, shared_cd, tail.n, &last);
    // The caller's algorithm must take the slices (once per shape): it was chosen for the whole.
    if (ok && algo != nullptr && call.entry->lt_checked == 0) {
      auto check = RealBlas<AlgoCheckFn>(kAlgoCheck);
      cublasLtMatmulHeuristicResult_t result{};
      ok = check != nullptr;
      for (const SliceLayouts* s : {&full, &last}) {
        ok = ok && check(lightHandle, computeDesc, Adesc, s->b, s->c, s->d, algo, &result) ==
                       blas::kSuccess &&
             result.workspaceSize <= workspaceSizeInBytes;
      }
      LockShapes lock;
      call.entry->lt_checked = ok ? 1 : -1;
    }
    if (!ok) call.plan = GemmPlan{};
  }
  if (call.timed) RecordTiming(call.entry, stream, /*start=*/true);
  cublasStatus_t status;
  if (call.plan.axis != GemmAxis::kColumns) {
    status = whole();
  } else {
    status = RunPieces(
        call, op, lt.m, lt.n,
        [&](const GemmSlice& s, const GemmShift& d) {
          const SliceLayouts& l = s.n == call.plan.width ? full : last;
          return call_real(Moved(B, d.b), l.b, Moved(C, d.c), l.c, Moved(D, d.d), l.d);
        },
        whole);
  }
  if (call.timed) RecordTiming(call.entry, stream, /*start=*/false);
  return status;
}

// ORION_GEMM_SPLIT_REPORT=1: one line at exit with what was split.
__attribute__((destructor)) static void ReportGemmSplits() {
  const char* report = getenv("ORION_GEMM_SPLIT_REPORT");
  if (report == nullptr || report[0] != '1') return;
  char line[160];
  const int n = snprintf(line, sizeof(line),
                         "orion: gemm split: %llu calls looked at, %llu split into %llu pieces\n",
                         static_cast<unsigned long long>(g_looked_at.load()),
                         static_cast<unsigned long long>(g_split_calls.load()),
                         static_cast<unsigned long long>(g_split_pieces.load()));
  if (n > 0) (void)!write(2, line, static_cast<size_t>(n));
}
