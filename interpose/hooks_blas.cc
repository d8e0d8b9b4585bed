// cuBLAS and cuBLASLt GEMM hooks (blas_functions.def): while a high-priority client shares its
// GPU, a best-effort client's GEMM that runs longer than 1 ms (and than the GPU's best-effort
// budget) runs as several calls over slices of its output, each within the budget
// (gemm_split.h); not in a rank of a multi-GPU job. Each piece is a kernel launch of its own that
// the gate may hold, so a request that arrives waits for one piece, not for a GEMM of
// milliseconds. A shape's duration is learned by timing some of its calls with two events on
// their stream, the start recorded again right before the call's first kernel (hooks_blas.h).
// Everything else goes straight to the real library (the next one that defines the symbol:
// RTLD_NEXT); a call inside a hook's own calls (cuBLAS calling cuBLASLt) too.
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
#include "interpose/hooks_blas.h"
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
  kGemmEx, kGemmStridedBatchedEx, kSgemm, kSgemmStridedBatched, kLtMatmul,  // hooked
  kGetStream, kLayoutGet, kLayoutSet, kLayoutCreate, kLayoutDestroy, kDescGet, kAlgoCheck,
  kRealBlasCount
};
constexpr int kHookedBlas = kLtMatmul + 1;
constexpr const char* kRealBlasNames[kRealBlasCount] = {
    "cublasGemmEx", "cublasGemmStridedBatchedEx", "cublasSgemm_v2", "cublasSgemmStridedBatched",
    "cublasLtMatmul", "cublasGetStream_v2", "cublasLtMatrixLayoutGetAttribute",
    "cublasLtMatrixLayoutSetAttribute", "cublasLtMatrixLayoutCreate",
    "cublasLtMatrixLayoutDestroy", "cublasLtMatmulDescGetAttribute", "cublasLtMatmulAlgoCheck"};

// Which cuBLAS a call goes to depends on who calls: a process may hold two (one framework's in
// the global scope, another's opened with RTLD_LOCAL), the loader binds each caller to its own,
// and cuBLAS's symbols are versioned while ours are not. So the real function is resolved per
// call site (the hook's return address), once:
//  1. in the calling object's own scope, itself and its dependencies (what the loader would
//     have bound it to; a library with cuBLAS linked in finds its own copy);
//  2. else the next definition behind this library in the global scope (RTLD_NEXT);
//  3. else in a loaded libcublas / libcublasLt (PyTorch's libtorch_cuda.so, opened with
//     RTLD_LOCAL, brings its cuBLAS out of RTLD_NEXT's reach).
// The helpers a hook calls (the handle's stream, layouts, the algorithm check) come from the
// library that defines the resolved GEMM function.
// Not like the loader: a library opened with RTLD_LOCAL that carries a renamed copy of the very
// cuBLAS version the global scope holds was bound by the loader to the global copy, and step 1
// sends it to its own.
// A resolution holds while no object has been unloaded since it was made (the loader's count of
// unloads, dl_phdr_info::dlpi_subs, read in about 8 ns): a caller or a cuBLAS copy closed and
// opened again, its old place now someone else's, resolves afresh instead of calling into it.

bool IsOurHook(const void* fn);

// `name` in the scope of the loaded object `path` (RTLD_NOLOAD: never loads anything).
void* LookInObject(const char* path, const char* name) {
  void* handle = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* fn = RealDlsym(handle, name);
  dlclose(handle);  // RTLD_NOLOAD took a reference; the object stays loaded by its owner
  return IsOurHook(fn) ? nullptr : fn;
}

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
void* LookInLoaded(const char* name) {
  LoadedLookup look{strncmp(name, "cublasLt", 8) == 0 ? "libcublasLt.so" : "libcublas.so"};
  if (dl_iterate_phdr(FindLoaded, &look) == 0) return nullptr;
  return LookInObject(look.path, name);
}

void* ResolveForCaller(RealBlasId id, const void* caller) {
  const char* name = kRealBlasNames[id];
  Dl_info info{};
  void* fn = nullptr;
  // The main program (its name empty, or argv[0] which RTLD_NOLOAD does not find) binds in the
  // global scope: step 2.
  if (caller != nullptr && dladdr(caller, &info) != 0 && info.dli_fname != nullptr &&
      info.dli_fname[0] != '\0') {
    fn = LookInObject(info.dli_fname, name);
  }
  if (fn == nullptr) {
    fn = RealDlsym(RTLD_NEXT, name);
    if (IsOurHook(fn)) fn = nullptr;
  }
  return fn != nullptr ? fn : LookInLoaded(name);
}

// How many objects the loader has unloaded in this process so far.
uint64_t LoaderUnloads() {
  uint64_t unloads = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) {
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
          *static_cast<uint64_t*>(data) = info->dlpi_subs;
        }
        return 1;  // the count is the same in every entry: the first one is enough
      },
      &unloads);
  return unloads;
}

// A function resolved for a key (a call site, or a GEMM function for its helpers), valid while
// the loader's unload count is the one it was resolved at. Readers take no lock: the unload
// count is read before and after the function (a writer sets it to kResolving around its
// store); writers, on the slow path only, take g_resolved_mutex.
constexpr uint64_t kResolving = ~uint64_t{0};
pthread_mutex_t g_resolved_mutex = PTHREAD_MUTEX_INITIALIZER;

struct Resolved {
  std::atomic<const void*> key{nullptr};
  std::atomic<void*> fn{nullptr};
  std::atomic<uint64_t> unloads{kResolving};

  void* ValidAt(uint64_t now_unloads) const {
    const uint64_t before = unloads.load(std::memory_order_seq_cst);
    void* f = fn.load(std::memory_order_seq_cst);
    return before == now_unloads && unloads.load(std::memory_order_seq_cst) == before ? f
                                                                                       : nullptr;
  }
  void Set(void* f, uint64_t at_unloads) {
    pthread_mutex_lock(&g_resolved_mutex);
    unloads.store(kResolving, std::memory_order_seq_cst);
    fn.store(f, std::memory_order_seq_cst);
    unloads.store(at_unloads, std::memory_order_seq_cst);
    pthread_mutex_unlock(&g_resolved_mutex);
  }
};

// The entry of `key` in `table` (claimed for it if free), or null when the table is full (then
// every call resolves: slow, still right).
Resolved* EntryFor(Resolved* table, uint32_t size, const void* key) {
  const uint64_t h = (reinterpret_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> 40;
  for (uint32_t i = 0; i < size; ++i) {
    Resolved& r = table[(h + i) % size];
    const void* seen = r.key.load(std::memory_order_acquire);
    if (seen == nullptr &&
        (r.key.compare_exchange_strong(seen, key, std::memory_order_acq_rel) || seen == key)) {
      return &r;
    }
    if (seen == key) return &r;
  }
  return nullptr;
}

// Call sites resolved so far, per hooked function.
constexpr uint32_t kCallSites = 128;
Resolved g_call_sites[kHookedBlas][kCallSites];

void* RealFor(RealBlasId id, const void* caller) {
  const uint64_t unloads = LoaderUnloads();
  Resolved* entry = EntryFor(g_call_sites[id], kCallSites, caller);
  if (entry != nullptr) {
    if (void* fn = entry->ValidAt(unloads)) return fn;
  }
  void* fn = ResolveForCaller(id, caller);
  if (fn != nullptr && entry != nullptr) entry->Set(fn, unloads);
  return fn;
}

// A helper from the library that defines `real` (a resolved GEMM function), kept by `real`.
constexpr uint32_t kCompanions = 8;  // cuBLAS libraries in one process, and reloads
Resolved g_companions[kRealBlasCount][kCompanions];

// `unloads`: LoaderUnloads(), read once by a caller that looks up several helpers.
void* CompanionOf(const void* real, RealBlasId id, uint64_t unloads) {
  if (real == nullptr) return nullptr;
  Resolved* entry = EntryFor(g_companions[id], kCompanions, real);
  if (entry != nullptr) {
    if (void* fn = entry->ValidAt(unloads)) return fn;
  }
  Dl_info info{};
  void* fn = nullptr;
  if (dladdr(real, &info) != 0 && info.dli_fname != nullptr && info.dli_fname[0] != '\0') {
    fn = LookInObject(info.dli_fname, kRealBlasNames[id]);
  } else {
    fn = RealDlsym(RTLD_DEFAULT, kRealBlasNames[id]);  // linked into the main program
  }
  if (fn != nullptr && entry != nullptr) entry->Set(fn, unloads);
  return fn;
}

template <typename Fn>
Fn Helper(const void* real, RealBlasId id, uint64_t unloads = LoaderUnloads()) {
  return reinterpret_cast<Fn>(CompanionOf(real, id, unloads));
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

// The bound on pieces now (0: every call goes whole) and the least duration of a call that is
// cut (GemmCutAboveNs).
struct GemmLimits {
  uint64_t bound_ns = 0;
  uint64_t cut_above_ns = 0;
};

GemmLimits LimitsNow() {
  if (!EnsureProcessInit()) return {};
  const EnvConfig& config = Config();
  if (config.disabled) return {};
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
      view.job_rank = g_process.runs_collectives.load(std::memory_order_relaxed);
    }
  }
  const uint64_t bound = GemmSplitBoundNs(view);
  return {bound, GemmCutAboveNs(bound, view.forced_ns != 0)};
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

// cuBLASLt: whether the caller's algorithm takes a shape's slices, and for which plan.
struct LtCheck {
  int8_t verdict = 0;  // 1 it takes the slices, -1 it does not (never cut), 0 not checked
  int64_t width = 0, tail = 0;  // verdict 1: the piece widths it was checked for,
  uint64_t workspace = 0;       // and the workspace the call had then
  // Whether the verdict 1 holds for a plan of these widths and this much workspace.
  bool Holds(int64_t w, int64_t t, uint64_t ws) const {
    return verdict == 1 && width == w && tail == t && workspace <= ws;
  }
};

struct ShapeEntry {
  bool used = false;
  bool refused = false;  // a piece failed once, or cuBLASLt's algorithm does not take the slices
  LtCheck lt;
  Timing timing = Timing::kIdle;  // kRunning: one call owns the events until it recorded both
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
  LtCheck lt;  // the shape's, when the plan was made
};

// The shape's plan for this call, and whether this call is timed. While any stream of the
// process captures a graph, no event is queried or recorded: in the global capture mode a query
// from another thread invalidates the capture.
CallPlan PlanCall(const ShapeKey& key, int64_t m, int64_t n, const GemmLimits& limits,
                  bool rows) {
  CallPlan call;
  LockShapes lock;  // read after waiting for it: a capture may have begun meanwhile
  const bool may_time = g_process.open_captures.load(std::memory_order_relaxed) <= 0;
  ShapeEntry* e = FindShape(key);
  if (e == nullptr) return call;
  call.entry = e;
  if (may_time) CollectSample(*e);
  const uint64_t index = e->calls++;
  if (may_time && e->timing == Timing::kIdle && GemmCallTimed(index, e->duration.count)) {
    e->timing = Timing::kRunning;
    call.timed = true;
  }
  call.lt = e->lt;
  if (!e->refused && e->lt.verdict >= 0 && GemmShapeCut(e->duration, limits.cut_above_ns)) {
    call.plan = PlanGemmSplit(m, n, e->duration.EstimateNs(), limits.bound_ns, rows);
  }
  return call;
}

void Refuse(ShapeEntry* e) {
  LockShapes lock;
  e->refused = true;
}

void NoteLtChecked(ShapeEntry* e, bool ok, int64_t width, int64_t tail, uint64_t workspace) {
  LockShapes lock;
  e->lt = {static_cast<int8_t>(ok ? 1 : -1), width, tail, workspace};
}

// Records the timed call's start (before its first piece) or, where the start was recorded,
// its end (after its last) on `stream`. The calling thread owns the entry's events meanwhile
// (kRunning). A failed record gives the entry back with fresh events next time (on a driver
// without context IDs, a context gone and another at the same address leaves the old one's).
bool RecordTiming(ShapeEntry* e, CUstream stream, bool start) {
  t_gemm_start = {};  // an end, or a new start: the last one's kernels went
  auto create = ORION_DRIVER(cuEventCreate);
  auto record = ORION_DRIVER(cuEventRecord);
  bool ok = create != nullptr && record != nullptr;
  if (ok && e->start == nullptr) ok = create(&e->start, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
  if (ok && e->end == nullptr) ok = create(&e->end, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
  ok = ok && record(start ? e->start : e->end, stream) == CUDA_SUCCESS;
  if (!ok) {
    if (auto destroy = ORION_DRIVER(cuEventDestroy_v2)) {
      if (e->start != nullptr) destroy(e->start);
      if (e->end != nullptr) destroy(e->end);
    }
    e->start = e->end = nullptr;
  }
  if (!ok || !start) {
    LockShapes lock;
    e->timing = ok ? Timing::kRecorded : Timing::kIdle;
  }
  if (ok && start) t_gemm_start = {e->start, stream};
  return ok;
}

// Ends a timed call: its end recorded, or where the call failed (it may have launched nothing:
// a sample of a few microseconds, which would stay the shape's least for good) no sample.
void EndTiming(ShapeEntry* e, CUstream stream, bool succeeded) {
  if (succeeded) {
    RecordTiming(e, stream, /*start=*/false);
    return;
  }
  t_gemm_start = {};
  LockShapes lock;
  e->timing = Timing::kIdle;
}

// The current context in a shape's key: its unique ID (CUDA 12 drivers), so that a context
// destroyed and another created at the same address (cudaDeviceReset) starts new shapes, and the
// old ones' events, the dead context's, are never touched again. Its address on older drivers.
uint64_t CurrentContextWord() {
  CUcontext ctx = nullptr;
  if (auto get = g_process.ctx_get_current; get != nullptr) get(&ctx);
  unsigned long long id = 0;
  if (auto get_id = ORION_DRIVER(cuCtxGetId);
      ctx != nullptr && get_id != nullptr && get_id(ctx, &id) == CUDA_SUCCESS) {
    return id | 1ull << 63;  // apart from any address
  }
  return reinterpret_cast<uint64_t>(ctx);
}

// Runs the pieces of a plan through `piece(slice, shift)` (RunGemmPlan: the narrower last piece
// first; a piece that fails sends the call whole, or in place the part of D not yet written as
// one call). A piece that fails refuses the shape: its calls go whole from then on. From its
// first split on, the process is held at the gate on the CPU first (gpu_hold.h, "GEMMs in
// pieces"): set before the first piece goes, so that none of them skips that gate.
template <typename Piece, typename Whole>
cublasStatus_t RunPieces(const CallPlan& call, const GemmOperands& operands, int64_t m,
                         int64_t n, bool redo_whole, Piece piece, Whole whole) {
  if (!g_process.splits_gemms.load(std::memory_order_relaxed)) {
    g_process.first_cut_ns.store(MonotonicNs(), std::memory_order_relaxed);
    g_process.splits_gemms.store(true, std::memory_order_release);
  }
  bool failed = false;
  const cublasStatus_t status = RunGemmPlan(
      call.plan, m, n, redo_whole, blas::kSuccess,
      [&](const GemmSlice& slice) {
        return piece(slice, ShiftOf(operands, call.plan.axis, slice.start));
      },
      whole, &failed);
  if (failed) {
    Refuse(call.entry);
    return status;
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
  void* real;  // the real function for this call site (RealFor), never null here
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
      return reinterpret_cast<decltype(&cublasGemmEx)>(g.real)(
          g.handle, g.transa, g.transb, g.m, g.n, g.k, g.alpha, g.a, g.atype, g.lda, g.b, g.btype,
          g.ldb, g.beta, g.c, g.ctype, g.ldc, g.compute, g.algo);
    case kGemmStridedBatchedEx:
      return reinterpret_cast<decltype(&cublasGemmStridedBatchedEx)>(g.real)(
          g.handle, g.transa, g.transb, g.m, g.n, g.k, g.alpha, g.a, g.atype, g.lda, g.stride_a,
          g.b, g.btype, g.ldb, g.stride_b, g.beta, g.c, g.ctype, g.ldc, g.stride_c, g.batch,
          g.compute, g.algo);
    case kSgemm:
      return reinterpret_cast<decltype(&cublasSgemm_v2)>(g.real)(
          g.handle, g.transa, g.transb, g.m, g.n, g.k, static_cast<const float*>(g.alpha),
          static_cast<const float*>(g.a), g.lda, static_cast<const float*>(g.b), g.ldb,
          static_cast<const float*>(g.beta), static_cast<float*>(g.c), g.ldc);
    case kSgemmStridedBatched:
      return reinterpret_cast<decltype(&cublasSgemmStridedBatched)>(g.real)(
          g.handle, g.transa, g.transb, g.m, g.n, g.k, static_cast<const float*>(g.alpha),
          static_cast<const float*>(g.a), g.lda, g.stride_a, static_cast<const float*>(g.b), g.ldb,
          g.stride_b, static_cast<const float*>(g.beta), static_cast<float*>(g.c), g.ldc,
          g.stride_c, g.batch);
    default:
      return blas::kNotInitialized;
  }
}

cublasStatus_t ClassicHook(const ClassicGemm& g) {
  // No cuBLAS behind us for this caller: what a missing library would answer.
  if (g.real == nullptr) return blas::kNotInitialized;
  if (t_inside) return CallReal(g);
  const GemmLimits limits = LimitsNow();
  if (limits.bound_ns == 0 || !GemmMayExceed(g.m, g.n, g.k, g.batch, limits.cut_above_ns)) {
    return CallReal(g);
  }
  GemmOperands op;
  op.lda = g.lda;
  op.ldb = g.ldb;
  op.ldc = op.ldd = g.ldc;
  op.a_transposed = g.transa != blas::kOpN;
  op.b_transposed = g.transb != blas::kOpN;
  op.a_bytes = ElementBytes(g.atype);
  op.b_bytes = ElementBytes(g.btype);
  op.c_bytes = op.d_bytes = ElementBytes(g.ctype);
  auto get_stream = Helper<GetStreamFn>(g.real, kGetStream);
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
  const CallPlan call = PlanCall(key, g.m, g.n, limits, /*rows=*/true);
  const bool timed = call.timed && RecordTiming(call.entry, stream, /*start=*/true);
  cublasStatus_t status;
  if (call.plan.axis == GemmAxis::kNone) {
    status = CallReal(g);
  } else {
    status = RunPieces(
        call, op, g.m, g.n, /*redo_whole=*/false,  // C is D
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
  if (timed) EndTiming(call.entry, stream, status == blas::kSuccess);
  return status;
}

// ---- cuBLASLt ----------------------------------------------------------------------------------

// The cuBLASLt helpers of the library that defines the call's cublasLtMatmul.
struct LtLibrary {
  LayoutGetFn layout_get = nullptr;
  LayoutSetFn layout_set = nullptr;
  LayoutCreateFn layout_create = nullptr;
  LayoutDestroyFn layout_destroy = nullptr;
  DescGetFn desc_get = nullptr;
  AlgoCheckFn algo_check = nullptr;

  // The loader's unload count is read once for all six.
  explicit LtLibrary(const void* real, uint64_t unloads = LoaderUnloads())
      : layout_get(Helper<LayoutGetFn>(real, kLayoutGet, unloads)),
        layout_set(Helper<LayoutSetFn>(real, kLayoutSet, unloads)),
        layout_create(Helper<LayoutCreateFn>(real, kLayoutCreate, unloads)),
        layout_destroy(Helper<LayoutDestroyFn>(real, kLayoutDestroy, unloads)),
        desc_get(Helper<DescGetFn>(real, kDescGet, unloads)),
        algo_check(Helper<AlgoCheckFn>(real, kAlgoCheck, unloads)) {}
  bool Complete() const {
    return layout_get != nullptr && layout_set != nullptr && layout_create != nullptr &&
           layout_destroy != nullptr && desc_get != nullptr;
  }
};

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

bool ReadLayout(const LtLibrary& lib, cublasLtMatrixLayout_t layout, LtLayout* out) {
  if (layout == nullptr) return false;
  size_t written = 0;
  auto read = [&](int attr, void* buf, size_t size, bool required) {
    return lib.layout_get(layout, attr, buf, size, &written) == blas::kSuccess || !required;
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
// (a triangle of the output, an auxiliary output, a reduction over columns, vectors of alpha,
// block scales, an amax).
struct LtCall {
  LtLayout a, b, c, d;
  int32_t transa = 0, transb = 0;
  uint32_t epilogue = 1;
  int32_t pointer_mode = 0, compute = 0, scale = 0;
  int64_t m = 0, n = 0, k = 0;
};

bool ReadLtCall(const LtLibrary& lib, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t adesc,
                cublasLtMatrixLayout_t bdesc, cublasLtMatrixLayout_t cdesc,
                cublasLtMatrixLayout_t ddesc, LtCall* call) {
  if (desc == nullptr) return false;
  size_t written = 0;
  auto read_int = [&](int attr, int32_t fallback) {
    int32_t v = fallback;
    return lib.desc_get(desc, attr, &v, sizeof(v), &written) == blas::kSuccess ? v : fallback;
  };
  call->transa = read_int(blas::kDescTransA, 0);
  call->transb = read_int(blas::kDescTransB, 0);
  call->pointer_mode = read_int(blas::kDescPointerMode, 0);
  call->compute = read_int(blas::kDescComputeType, -1);
  call->scale = read_int(blas::kDescScaleType, -1);
  void* amax = nullptr;
  if (lib.desc_get(desc, blas::kDescEpilogue, &call->epilogue, sizeof(call->epilogue),
                   &written) != blas::kSuccess ||
      !blas::EpilogueSlicesByColumns(call->epilogue) ||
      read_int(blas::kDescTransC, 0) != blas::kOpN ||
      read_int(blas::kDescFillMode, blas::kFillFull) != blas::kFillFull ||
      static_cast<uint32_t>(call->pointer_mode) > 1 ||
      (lib.desc_get(desc, blas::kDescAmaxD, &amax, sizeof(amax), &written) == blas::kSuccess &&
       amax != nullptr)) {
    return false;
  }
  for (int attr : {blas::kDescAScaleMode, blas::kDescBScaleMode, blas::kDescCScaleMode,
                   blas::kDescDScaleMode, blas::kDescDOutScaleMode,
                   blas::kDescAtomicSyncChunksRows, blas::kDescAtomicSyncChunksCols}) {
    if (read_int(attr, 0) != 0) return false;
  }
  // Counters a kernel signals or waits on per chunk of the whole D: a piece would take its slice
  // for the whole (CUDA 12's cuBLASLt; later ones answer that the attribute is not there).
  for (int attr : {blas::kDescAtomicSyncInCounters, blas::kDescAtomicSyncOutCounters}) {
    void* counters = nullptr;
    if (lib.desc_get(desc, attr, &counters, sizeof(counters), &written) == blas::kSuccess &&
        counters != nullptr) {
      return false;
    }
  }
  if (!ReadLayout(lib, adesc, &call->a) || !ReadLayout(lib, bdesc, &call->b) ||
      !ReadLayout(lib, cdesc, &call->c) || !ReadLayout(lib, ddesc, &call->d)) {
    return false;
  }
  call->m = static_cast<int64_t>(call->d.rows);
  call->n = static_cast<int64_t>(call->d.cols);
  call->k = static_cast<int64_t>(call->transa == blas::kOpN ? call->a.cols : call->a.rows);
  const auto k = static_cast<uint64_t>(call->k);
  const bool b_ok = call->transb == blas::kOpN
                        ? call->b.rows == k && call->b.cols == call->d.cols
                        : call->b.cols == k && call->b.rows == call->d.cols;
  return b_ok && call->c.rows == call->d.rows && call->c.cols == call->d.cols &&
         call->c.batch == call->d.batch;
}

// The layouts of one column slice `width` wide: B's, C's and D's (C's is D's where the caller
// passed one layout for both).
struct SliceLayouts {
  LayoutDestroyFn destroy = nullptr;
  cublasLtMatrixLayout_t b = nullptr, c = nullptr, d = nullptr;
  bool shared_cd = false;

  ~SliceLayouts() {
    if (destroy == nullptr) return;
    if (b != nullptr) destroy(b);
    if (d != nullptr) destroy(d);
    if (c != nullptr && !shared_cd) destroy(c);
  }
};

bool MakeLayout(const LtLibrary& lib, const LtLayout& like, uint64_t rows, uint64_t cols,
                cublasLtMatrixLayout_t* out) {
  if (lib.layout_create(out, static_cast<cudaDataType>(like.type), rows, cols, like.ld) !=
      blas::kSuccess) {
    *out = nullptr;
    return false;
  }
  return like.batch == 1 ||
         (lib.layout_set(*out, blas::kLayoutBatchCount, &like.batch, sizeof(like.batch)) ==
              blas::kSuccess &&
          lib.layout_set(*out, blas::kLayoutBatchStride, &like.stride, sizeof(like.stride)) ==
              blas::kSuccess);
}

bool MakeSliceLayouts(const LtLibrary& lib, const LtCall& call, bool shared_cd, int64_t width,
                      SliceLayouts* out) {
  const auto w = static_cast<uint64_t>(width);
  out->destroy = lib.layout_destroy;
  out->shared_cd = shared_cd;
  const bool b_ok = call.transb == blas::kOpN
                        ? MakeLayout(lib, call.b, call.b.rows, w, &out->b)
                        : MakeLayout(lib, call.b, w, call.b.cols, &out->b);
  if (!b_ok || !MakeLayout(lib, call.d, call.d.rows, w, &out->d)) return false;
  if (shared_cd) {
    out->c = out->d;
    return true;
  }
  return MakeLayout(lib, call.c, call.c.rows, w, &out->c);
}

// Whether `fn` lies in this library (a hook: a "real" function there would call itself). By the
// object, not by the hooks' addresses, which the GOT would give as the global scope's first.
bool IsOurHook(const void* fn) {
  Dl_info theirs{}, ours{};
  return fn != nullptr && dladdr(fn, &theirs) != 0 &&
         dladdr(reinterpret_cast<const void*>(&IsOurHook), &ours) != 0 &&
         theirs.dli_fbase == ours.dli_fbase;
}

}  // namespace

constinit thread_local GemmStartToRedo t_gemm_start ORION_INITIAL_EXEC_TLS;

void RedoGemmStart(CUstream stream) {
  // `stream` is canonical: the legacy and per-thread default streams by their own handles, which
  // the plain entry point takes. A failed record leaves the first one, taken before cuBLAS ran:
  // a sample that may read long.
  if (CUevent event = TakeGemmStart(t_gemm_start, stream); event != nullptr) {
    if (auto record = ORION_DRIVER(cuEventRecord)) record(event, stream);
  }
}

// A fork child forgets the parent's lock and its timed calls in flight (their events are the
// parent's context's); the learned durations stay.
void ResetGemmSplitAfterFork() {
  t_gemm_start = {};
  pthread_mutex_init(&g_shapes_lock, nullptr);
  for (ShapeEntry& e : g_shapes) {
    e.timing = Timing::kIdle;
    e.start = e.end = nullptr;
  }
}

}  // namespace orion::interpose

using namespace orion::interpose;  // NOLINT: the exported hooks below

ORION_BLAS_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int m, int n, int k,
                                              const void* alpha, const void* A, cudaDataType Atype,
                                              int lda, const void* B, cudaDataType Btype, int ldb,
                                              const void* beta, void* C, cudaDataType Ctype,
                                              int ldc, cublasComputeType_t computeType,
                                              cublasGemmAlgo_t algo) {
  return ClassicHook({kGemmEx, RealFor(kGemmEx, __builtin_return_address(0)), handle, transa,
                      transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype,
                      ldc, 0, 1, computeType, algo});
}

ORION_BLAS_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return ClassicHook({kGemmStridedBatchedEx,
                      RealFor(kGemmStridedBatchedEx, __builtin_return_address(0)), handle, transa,
                      transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta,
                      C, Ctype, ldc, strideC, batchCount, computeType, algo});
}

ORION_BLAS_EXPORT cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k,
                                                const float* alpha, const float* A, int lda,
                                                const float* B, int ldb, const float* beta,
                                                float* C, int ldc) {
  return ClassicHook({kSgemm, RealFor(kSgemm, __builtin_return_address(0)), handle, transa, transb,
                      m, n, k, alpha, A, blas::kDataR32F, lda, 0, B, blas::kDataR32F, ldb, 0, beta,
                      C, blas::kDataR32F, ldc, 0, 1, 0, 0});
}

ORION_BLAS_EXPORT cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float* alpha, const float* A, int lda, long long int strideA, const float* B, int ldb,
    long long int strideB, const float* beta, float* C, int ldc, long long int strideC,
    int batchCount) {
  return ClassicHook({kSgemmStridedBatched,
                      RealFor(kSgemmStridedBatched, __builtin_return_address(0)), handle, transa,
                      transb, m, n, k, alpha, A, blas::kDataR32F, lda, strideA, B,
                      blas::kDataR32F, ldb, strideB, beta, C, blas::kDataR32F, ldc, strideC,
                      batchCount, 0, 0});
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
    const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
    size_t workspaceSizeInBytes, CUstream stream) {
  void* const real_fn = RealFor(kLtMatmul, __builtin_return_address(0));
  if (real_fn == nullptr) return blas::kNotInitialized;
  auto real = reinterpret_cast<decltype(&cublasLtMatmul)>(real_fn);
  auto call_real = [&](const void* b, cublasLtMatrixLayout_t bd, const void* c,
                       cublasLtMatrixLayout_t cd, void* d, cublasLtMatrixLayout_t dd) {
    Inside inside;
    return real(lightHandle, computeDesc, alpha, A, Adesc, b, bd, beta, c, cd, d, dd, algo,
                workspace, workspaceSizeInBytes, stream);
  };
  auto whole = [&] { return call_real(B, Bdesc, C, Cdesc, D, Ddesc); };
  if (t_inside) return whole();
  const GemmLimits limits = LimitsNow();
  if (limits.bound_ns == 0) return whole();
  const LtLibrary lib(real_fn);
  LtCall lt;
  if (!lib.Complete() || !ReadLtCall(lib, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &lt) ||
      !GemmMayExceed(lt.m, lt.n, lt.k, lt.d.batch, limits.cut_above_ns) ||
      StreamCapturing(stream)) {
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
  // The shape by what the descriptor says, not by its address (a framework that creates a
  // descriptor per call would make every call a new shape).
  ShapeKey key;
  key.words[0] = static_cast<uint64_t>(kLtMatmul) | static_cast<uint64_t>(lt.transa) << 8 |
                 static_cast<uint64_t>(lt.transb) << 16 | static_cast<uint64_t>(lt.a.type) << 24 |
                 static_cast<uint64_t>(lt.b.type) << 32 | static_cast<uint64_t>(lt.d.type) << 40 |
                 static_cast<uint64_t>(lt.c.type) << 48;
  key.words[1] = static_cast<uint64_t>(lt.m) << 32 ^ static_cast<uint64_t>(lt.n);
  key.words[2] = static_cast<uint64_t>(lt.k) << 32 ^ static_cast<uint64_t>(lt.d.batch);
  key.words[3] = static_cast<uint64_t>(lt.a.ld) << 32 ^ static_cast<uint64_t>(lt.b.ld);
  key.words[4] = static_cast<uint64_t>(lt.c.ld) << 32 ^ static_cast<uint64_t>(lt.d.ld);
  key.words[5] = CurrentContextWord();
  key.words[6] = static_cast<uint64_t>(lt.epilogue) << 32 ^
                 static_cast<uint64_t>(static_cast<uint32_t>(lt.compute)) << 16 ^
                 static_cast<uint64_t>(static_cast<uint32_t>(lt.scale)) << 8 ^
                 static_cast<uint64_t>(static_cast<uint32_t>(lt.pointer_mode));
  if (algo != nullptr) {
    for (uint64_t w : algo->data) key.words[7] = (key.words[7] ^ w) * 0x100000001B3ull;
  }
  CallPlan call = PlanCall(key, lt.m, lt.n, limits, /*rows=*/false);
  const bool shared_cd = Cdesc == Ddesc;
  SliceLayouts full, last;
  GemmSlice tail;
  // Whether the caller's algorithm (chosen for the whole) takes a slice's layouts, within the
  // call's workspace.
  auto algo_takes = [&](const SliceLayouts& sl) {
    cublasLtMatmulHeuristicResult_t result{};
    return lib.algo_check != nullptr &&
           lib.algo_check(lightHandle, computeDesc, Adesc, sl.b, sl.c, sl.d, algo, &result) ==
               blas::kSuccess &&
           result.workspaceSize <= workspaceSizeInBytes;
  };
  if (call.plan.axis == GemmAxis::kColumns) {
    tail = SliceOf(call.plan, call.plan.pieces - 1, lt.m, lt.n);
    bool ok = MakeSliceLayouts(lib, lt, shared_cd, call.plan.width, &full) &&
              MakeSliceLayouts(lib, lt, shared_cd, tail.n, &last);
    // Checked once per shape, and again for a plan of other widths or a call with less
    // workspace.
    if (ok && algo != nullptr && !call.lt.Holds(call.plan.width, tail.n, workspaceSizeInBytes)) {
      ok = algo_takes(full) && algo_takes(last);
      NoteLtChecked(call.entry, ok, call.plan.width, tail.n, workspaceSizeInBytes);
    }
    if (!ok) call.plan = GemmPlan{};
  }
  const bool timed = call.timed && RecordTiming(call.entry, stream, /*start=*/true);
  cublasStatus_t status;
  if (call.plan.axis != GemmAxis::kColumns) {
    status = whole();
  } else {
    status = RunPieces(
        call, op, lt.m, lt.n, /*redo_whole=*/C != D,
        [&](const GemmSlice& sl, const GemmShift& d) {
          // A piece's width, the tail's, or (in place, after a piece failed) the rest's, which
          // the caller's algorithm must take as it took the pieces'.
          SliceLayouts rest;
          const SliceLayouts* l = sl.n == call.plan.width ? &full : sl.n == tail.n ? &last : &rest;
          if (l == &rest && (!MakeSliceLayouts(lib, lt, shared_cd, sl.n, &rest) ||
                             (algo != nullptr && !algo_takes(rest)))) {
            return blas::kNotSupported;
          }
          return call_real(Moved(B, d.b), l->b, Moved(C, d.c), l->c, Moved(D, d.d), l->d);
        },
        whole);
  }
  if (timed) EndTiming(call.entry, stream, status == blas::kSuccess);
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
