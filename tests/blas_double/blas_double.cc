// cuBLAS and cuBLASLt test double: liborion_blas_double.so, the GEMM entry points that the
// interposer hooks (interpose/blas_abi.h) and what its hooks look up by name (handles, streams,
// cuBLASLt descriptors and layouts, cublasLtMatmulAlgoCheck), for machines without a GPU.
//
// A GEMM computes on HOST memory (the pointers are malloc'd by the caller), float only
// (CUDA_R_32F; anything else is CUBLAS_STATUS_NOT_SUPPORTED): op N/T, leading dimensions, strided
// batches, alpha and beta on the host, and for cuBLASLt the epilogues DEFAULT, RELU, BIAS,
// RELU_BIAS, GELU and GELU_BIAS (a bias: one float per row of D). Every element sums its k
// products in order, so a call over a slice of the output computes the slice's elements bit for
// bit as the whole call does, as the same kernel does on a GPU.
//
// Each call, once the product is computed, launches the CUDA driver test double's spin kernel
// (samples/spin_kernel.h) on the handle's stream (cuBLASLt: the call's), 2 * m * n * k * batch /
// 1000 ns long (at least 1 us), so that events around it time it (the host's work comes before
// the kernel, as a real call's does), and appends "api m n k" to a log kept in memory:
// orion_blas_double_take_calls() hands it over (and empties it).
//
// ORION_BLAS_DOUBLE_LT_FAIL_BELOW_N=N: a cublasLtMatmul of fewer than N columns fails
// (CUBLAS_STATUS_NOT_SUPPORTED) though cublasLtMatmulAlgoCheck passes it: a split call's later,
// narrower piece that fails.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "interpose/blas_abi.h"
#include "samples/spin_kernel.h"

namespace blas = orion::interpose::blas;

struct cublasContext {
  CUstream stream = nullptr;
};
struct cublasLtContext {
  int unused = 0;
};

namespace {

constexpr cublasStatus_t kExecutionFailed = 13;  // CUBLAS_STATUS_EXECUTION_FAILED

// Attributes of a descriptor or a layout: the known ones with their size and value.
struct Attributes {
  std::map<int, std::vector<unsigned char>> values;

  template <typename T>
  void Init(int attr, T value) {
    std::vector<unsigned char>& v = values[attr];
    v.resize(sizeof(T));
    memcpy(v.data(), &value, sizeof(T));
  }
  template <typename T>
  T Value(int attr) const {
    T out{};
    auto it = values.find(attr);
    if (it != values.end() && it->second.size() == sizeof(T)) {
      memcpy(&out, it->second.data(), sizeof(T));
    }
    return out;
  }
  // As cuBLASLt: an unknown attribute or a size that is not the attribute's is INVALID_VALUE.
  cublasStatus_t Set(int attr, const void* buf, size_t size) {
    auto it = values.find(attr);
    if (it == values.end() || buf == nullptr || size != it->second.size()) {
      return blas::kInvalidValue;
    }
    memcpy(it->second.data(), buf, size);
    return blas::kSuccess;
  }
  cublasStatus_t Get(int attr, void* buf, size_t size, size_t* written) const {
    auto it = values.find(attr);
    if (it == values.end()) return blas::kInvalidValue;
    const size_t need = it->second.size();
    if (size == 0) {
      if (written == nullptr) return blas::kInvalidValue;
      *written = need;
      return blas::kSuccess;
    }
    if (buf == nullptr || size != need) return blas::kInvalidValue;
    memcpy(buf, it->second.data(), need);
    if (written != nullptr) *written = need;
    return blas::kSuccess;
  }
};

}  // namespace

struct cublasLtMatmulDescOpaque_t {
  Attributes attrs;
};
struct cublasLtMatrixLayoutOpaque_t {
  Attributes attrs;
};

namespace {

// cublasLtMatmulDescAttributes_t kept (cublasLt.h), beyond those blas_abi.h names.
constexpr int kDescComputeType = 0;
constexpr int kDescScaleType = 1;
constexpr int kDescFillMode = 6;
constexpr int kDescBiasPointer = 8;
constexpr int kDescBiasBatchStride = 10;

// ---- the call log ------------------------------------------------------------------------------

std::mutex g_log_mu;
std::string g_log;
size_t g_log_calls = 0;

void LogCall(const char* api, int64_t m, int64_t n, int64_t k) {
  char line[128];
  snprintf(line, sizeof(line), "%s %lld %lld %lld\n", api, static_cast<long long>(m),
           static_cast<long long>(n), static_cast<long long>(k));
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_log += line;
  ++g_log_calls;
}

// ---- the simulated kernel ----------------------------------------------------------------------

std::mutex g_spin_mu;
std::map<CUcontext, CUfunction> g_spin;  // the spin kernel, loaded once per context

// Occupies the simulated GPU for the call's work on `stream`.
bool LaunchSpin(CUstream stream, int64_t m, int64_t n, int64_t k, int64_t batch) {
  CUcontext ctx = nullptr;
  if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return false;
  CUfunction spin = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_spin_mu);
    auto it = g_spin.find(ctx);
    if (it == g_spin.end()) {
      CUmodule module = nullptr;
      if (cuModuleLoadData(&module, orion::samples::kSpinKernelPtx) != CUDA_SUCCESS ||
          cuModuleGetFunction(&spin, module, orion::samples::kSpinKernelName) != CUDA_SUCCESS) {
        return false;
      }
      g_spin[ctx] = spin;
    } else {
      spin = it->second;
    }
  }
  const double work = 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                      static_cast<double>(k) * static_cast<double>(batch) / 1000.0;
  unsigned long long ns = work < 1000.0 ? 1000ull : static_cast<unsigned long long>(work);
  void* args[] = {&ns};
  return cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr) == CUDA_SUCCESS;
}

// ---- the GEMM on the host ----------------------------------------------------------------------

enum class Epilogue { kNone, kRelu, kGelu };

struct HostGemm {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const float* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const float* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  const float* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  float* d = nullptr;
  int64_t ldd = 0, stride_d = 0;
  int64_t batch = 1;
  const float* bias = nullptr;  // one per row of D
  Epilogue epilogue = Epilogue::kNone;
};

float Gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}

// op(A) is copied k-major so that a column of D sums over k at once; every element sums its
// products in order of k whatever slice of D a call computes. C may be D (in place).
void Compute(const HostGemm& g) {
  std::vector<float> a_op(static_cast<size_t>(g.k * g.m)), acc(static_cast<size_t>(g.m));
  for (int64_t q = 0; q < g.batch; ++q) {
    const float* a = g.a + q * g.stride_a;
    const float* b = g.b + q * g.stride_b;
    const float* c = g.c != nullptr ? g.c + q * g.stride_c : nullptr;
    float* d = g.d + q * g.stride_d;
    for (int64_t p = 0; p < g.k; ++p) {
      float* row = &a_op[static_cast<size_t>(p * g.m)];
      for (int64_t i = 0; i < g.m; ++i) row[i] = g.ta ? a[p + i * g.lda] : a[i + p * g.lda];
    }
    for (int64_t j = 0; j < g.n; ++j) {
      float* __restrict sum = acc.data();
      for (int64_t i = 0; i < g.m; ++i) sum[i] = 0.0f;
      for (int64_t p = 0; p < g.k; ++p) {
        const float y = g.tb ? b[j + p * g.ldb] : b[p + j * g.ldb];
        const float* __restrict x = &a_op[static_cast<size_t>(p * g.m)];
        for (int64_t i = 0; i < g.m; ++i) sum[i] += x[i] * y;
      }
      for (int64_t i = 0; i < g.m; ++i) {
        float v = g.alpha * sum[i];
        if (g.beta != 0.0f) v += g.beta * c[i + j * g.ldc];
        if (g.bias != nullptr) v += g.bias[i];
        if (g.epilogue == Epilogue::kRelu) v = v > 0.0f ? v : 0.0f;
        if (g.epilogue == Epilogue::kGelu) v = Gelu(v);
        d[i + j * g.ldd] = v;
      }
    }
  }
}

bool Transposed(cublasOperation_t op) { return op != blas::kOpN; }

// The classic API: checks, the log line, the product, the kernel on the handle's stream.
cublasStatus_t Classic(const char* api, cublasHandle_t handle, cublasOperation_t transa,
                       cublasOperation_t transb, int m, int n, int k, const void* alpha,
                       const void* A, cudaDataType atype, int lda, long long stride_a,
                       const void* B, cudaDataType btype, int ldb, long long stride_b,
                       const void* beta, void* C, cudaDataType ctype, int ldc,
                       long long stride_c, int batch) {
  if (handle == nullptr) return blas::kNotInitialized;
  if (atype != blas::kDataR32F || btype != blas::kDataR32F || ctype != blas::kDataR32F) {
    return blas::kNotSupported;
  }
  const bool ta = Transposed(transa), tb = Transposed(transb);
  if (m < 0 || n < 0 || k < 0 || batch < 0 || alpha == nullptr || beta == nullptr ||
      A == nullptr || B == nullptr || C == nullptr ||
      lda < (ta ? k : m) || lda < 1 || ldb < (tb ? n : k) || ldb < 1 || ldc < m || ldc < 1) {
    return blas::kInvalidValue;
  }
  LogCall(api, m, n, k);
  if (m == 0 || n == 0 || batch == 0) return blas::kSuccess;
  HostGemm g;
  g.ta = ta;
  g.tb = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  g.a = static_cast<const float*>(A);
  g.lda = lda;
  g.stride_a = stride_a;
  g.b = static_cast<const float*>(B);
  g.ldb = ldb;
  g.stride_b = stride_b;
  g.c = static_cast<const float*>(C);
  g.ldc = ldc;
  g.stride_c = stride_c;
  g.d = static_cast<float*>(C);
  g.ldd = ldc;
  g.stride_d = stride_c;
  g.batch = batch;
  Compute(g);
  return LaunchSpin(handle->stream, m, n, k, batch) ? blas::kSuccess : kExecutionFailed;
}

// ---- cuBLASLt ----------------------------------------------------------------------------------

struct Layout {
  uint32_t type;
  int32_t order;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride;
  int64_t plane;
  uint32_t mode;
};

bool ReadLayout(cublasLtMatrixLayout_t l, Layout* out) {
  if (l == nullptr) return false;
  const Attributes& a = l->attrs;
  out->type = a.Value<uint32_t>(blas::kLayoutType);
  out->order = a.Value<int32_t>(blas::kLayoutOrder);
  out->rows = a.Value<uint64_t>(blas::kLayoutRows);
  out->cols = a.Value<uint64_t>(blas::kLayoutCols);
  out->ld = a.Value<int64_t>(blas::kLayoutLd);
  out->batch = a.Value<int32_t>(blas::kLayoutBatchCount);
  out->stride = a.Value<int64_t>(blas::kLayoutBatchStride);
  out->plane = a.Value<int64_t>(blas::kLayoutPlaneOffset);
  out->mode = a.Value<uint32_t>(blas::kLayoutBatchMode);
  return true;
}

// The call a descriptor and four layouts describe, or a status saying why not.
cublasStatus_t LtGemm(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t adesc,
                      cublasLtMatrixLayout_t bdesc, cublasLtMatrixLayout_t cdesc,
                      cublasLtMatrixLayout_t ddesc, HostGemm* g) {
  Layout a, b, c, d;
  if (desc == nullptr || !ReadLayout(adesc, &a) || !ReadLayout(bdesc, &b) ||
      !ReadLayout(cdesc, &c) || !ReadLayout(ddesc, &d)) {
    return blas::kInvalidValue;
  }
  const Attributes& attrs = desc->attrs;
  for (const Layout* l : {&a, &b, &c, &d}) {
    if (l->type != blas::kDataR32F || l->order != 0 || l->plane != 0 || l->mode != 0) {
      return blas::kNotSupported;
    }
  }
  if (attrs.Value<int32_t>(blas::kDescPointerMode) != 0 ||
      attrs.Value<int32_t>(blas::kDescTransC) != blas::kOpN ||
      attrs.Value<void*>(blas::kDescAmaxD) != nullptr) {
    return blas::kNotSupported;
  }
  g->ta = Transposed(attrs.Value<int32_t>(blas::kDescTransA));
  g->tb = Transposed(attrs.Value<int32_t>(blas::kDescTransB));
  g->m = static_cast<int64_t>(d.rows);
  g->n = static_cast<int64_t>(d.cols);
  g->k = static_cast<int64_t>(g->ta ? a.rows : a.cols);
  const uint64_t am = g->ta ? a.cols : a.rows;
  const uint64_t bk = g->tb ? b.cols : b.rows, bn = g->tb ? b.rows : b.cols;
  if (am != d.rows || bk != static_cast<uint64_t>(g->k) || bn != d.cols || c.rows != d.rows ||
      c.cols != d.cols || d.batch < 1 || c.batch != d.batch ||
      (a.batch != d.batch && a.batch != 1) || (b.batch != d.batch && b.batch != 1)) {
    return blas::kInvalidValue;
  }
  for (const Layout* l : {&a, &b, &c, &d}) {
    if (l->ld < static_cast<int64_t>(l->rows) || l->ld < 1) return blas::kInvalidValue;
  }
  g->lda = a.ld;
  g->stride_a = a.batch == 1 ? 0 : a.stride;
  g->ldb = b.ld;
  g->stride_b = b.batch == 1 ? 0 : b.stride;
  g->ldc = c.ld;
  g->stride_c = c.stride;
  g->ldd = d.ld;
  g->stride_d = d.stride;
  g->batch = d.batch;
  switch (attrs.Value<uint32_t>(blas::kDescEpilogue)) {
    case 1: break;
    case 2: g->epilogue = Epilogue::kRelu; break;
    case 4: g->bias = static_cast<const float*>(attrs.Value<void*>(kDescBiasPointer)); break;
    case 6:
      g->epilogue = Epilogue::kRelu;
      g->bias = static_cast<const float*>(attrs.Value<void*>(kDescBiasPointer));
      break;
    case 32: g->epilogue = Epilogue::kGelu; break;
    case 36:
      g->epilogue = Epilogue::kGelu;
      g->bias = static_cast<const float*>(attrs.Value<void*>(kDescBiasPointer));
      break;
    default: return blas::kNotSupported;
  }
  const uint32_t e = attrs.Value<uint32_t>(blas::kDescEpilogue);
  if ((e & 4) != 0 && g->bias == nullptr) return blas::kInvalidValue;
  return blas::kSuccess;
}

}  // namespace

// ---- exports -----------------------------------------------------------------------------------

// The calls received since the last take, one "api m n k" line each, into buf (cut to size - 1
// characters, always terminated where size > 0); returns how many calls they were.
ORION_BLAS_EXPORT size_t orion_blas_double_take_calls(char* buf, size_t size) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  if (buf != nullptr && size > 0) {
    const size_t n = g_log.size() < size - 1 ? g_log.size() : size - 1;
    memcpy(buf, g_log.data(), n);
    buf[n] = '\0';
  }
  const size_t calls = g_log_calls;
  g_log.clear();
  g_log_calls = 0;
  return calls;
}

ORION_BLAS_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return blas::kInvalidValue;
  *handle = new cublasContext;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr) return blas::kNotInitialized;
  delete handle;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, CUstream stream) {
  if (handle == nullptr) return blas::kNotInitialized;
  handle->stream = stream;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, CUstream* stream) {
  if (handle == nullptr) return blas::kNotInitialized;
  if (stream == nullptr) return blas::kInvalidValue;
  *stream = handle->stream;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int m, int n, int k,
                                              const void* alpha, const void* A, cudaDataType Atype,
                                              int lda, const void* B, cudaDataType Btype, int ldb,
                                              const void* beta, void* C, cudaDataType Ctype,
                                              int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
  return Classic("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B,
                 Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1);
}

ORION_BLAS_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount, cublasComputeType_t,
    cublasGemmAlgo_t) {
  return Classic("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype,
                 lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount);
}

ORION_BLAS_EXPORT cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k,
                                                const float* alpha, const float* A, int lda,
                                                const float* B, int ldb, const float* beta,
                                                float* C, int ldc) {
  return Classic("cublasSgemm_v2", handle, transa, transb, m, n, k, alpha, A, blas::kDataR32F,
                 lda, 0, B, blas::kDataR32F, ldb, 0, beta, C, blas::kDataR32F, ldc, 0, 1);
}

ORION_BLAS_EXPORT cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float* alpha, const float* A, int lda, long long int strideA, const float* B, int ldb,
    long long int strideB, const float* beta, float* C, int ldc, long long int strideC,
    int batchCount) {
  return Classic("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A,
                 blas::kDataR32F, lda, strideA, B, blas::kDataR32F, ldb, strideB, beta, C,
                 blas::kDataR32F, ldc, strideC, batchCount);
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return blas::kInvalidValue;
  *handle = new cublasLtContext;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return blas::kNotInitialized;
  delete handle;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc,
                                                          cublasComputeType_t compute_type,
                                                          cudaDataType scale_type) {
  if (desc == nullptr) return blas::kInvalidValue;
  auto* d = new cublasLtMatmulDescOpaque_t;
  Attributes& a = d->attrs;
  a.Init<int32_t>(kDescComputeType, compute_type);
  a.Init<int32_t>(kDescScaleType, scale_type);
  a.Init<int32_t>(blas::kDescPointerMode, 0);
  a.Init<int32_t>(blas::kDescTransA, blas::kOpN);
  a.Init<int32_t>(blas::kDescTransB, blas::kOpN);
  a.Init<int32_t>(blas::kDescTransC, blas::kOpN);
  a.Init<int32_t>(kDescFillMode, 2);  // CUBLAS_FILL_MODE_FULL
  a.Init<uint32_t>(blas::kDescEpilogue, 1);
  a.Init<const void*>(kDescBiasPointer, nullptr);
  a.Init<int64_t>(kDescBiasBatchStride, 0);
  a.Init<void*>(blas::kDescAmaxD, nullptr);
  for (int attr : {blas::kDescAScaleMode, blas::kDescBScaleMode, blas::kDescCScaleMode,
                   blas::kDescDScaleMode, blas::kDescDOutScaleMode,
                   blas::kDescAtomicSyncChunksRows, blas::kDescAtomicSyncChunksCols}) {
    a.Init<int32_t>(attr, 0);  // the atomic sync ones as CUDA 12's cuBLASLt has them
  }
  a.Init<void*>(blas::kDescAtomicSyncInCounters, nullptr);
  a.Init<void*>(blas::kDescAtomicSyncOutCounters, nullptr);
  *desc = d;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                                cublasLtMatmulDescAttributes_t attr,
                                                                const void* buf, size_t size) {
  return desc == nullptr ? blas::kInvalidValue : desc->attrs.Set(attr, buf, size);
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc,
                                                                cublasLtMatmulDescAttributes_t attr,
                                                                void* buf, size_t size,
                                                                size_t* written) {
  return desc == nullptr ? blas::kInvalidValue : desc->attrs.Get(attr, buf, size, written);
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout,
                                                            cudaDataType type, uint64_t rows,
                                                            uint64_t cols, int64_t ld) {
  if (layout == nullptr) return blas::kInvalidValue;
  auto* l = new cublasLtMatrixLayoutOpaque_t;
  Attributes& a = l->attrs;
  a.Init<uint32_t>(blas::kLayoutType, static_cast<uint32_t>(type));
  a.Init<int32_t>(blas::kLayoutOrder, 0);
  a.Init<uint64_t>(blas::kLayoutRows, rows);
  a.Init<uint64_t>(blas::kLayoutCols, cols);
  a.Init<int64_t>(blas::kLayoutLd, ld);
  a.Init<int32_t>(blas::kLayoutBatchCount, 1);
  a.Init<int64_t>(blas::kLayoutBatchStride, 0);
  a.Init<int64_t>(blas::kLayoutPlaneOffset, 0);
  a.Init<uint32_t>(blas::kLayoutBatchMode, 0);
  *layout = l;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(
    cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
    size_t size) {
  return layout == nullptr ? blas::kInvalidValue : layout->attrs.Set(attr, buf, size);
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatrixLayoutGetAttribute(
    cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, void* buf, size_t size,
    size_t* written) {
  return layout == nullptr ? blas::kInvalidValue : layout->attrs.Get(attr, buf, size, written);
}

// Any algorithm runs any shape this double computes, without a workspace.
ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmulAlgoCheck(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t adesc,
    cublasLtMatrixLayout_t bdesc, cublasLtMatrixLayout_t cdesc, cublasLtMatrixLayout_t ddesc,
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  if (handle == nullptr) return blas::kNotInitialized;
  if (algo == nullptr || result == nullptr) return blas::kInvalidValue;
  HostGemm g;
  const cublasStatus_t status = LtGemm(desc, adesc, bdesc, cdesc, ddesc, &g);
  if (status != blas::kSuccess) return status;
  memset(result, 0, sizeof(*result));
  result->algo = *algo;
  result->workspaceSize = 0;
  result->wavesCount = 1.0f;
  return blas::kSuccess;
}

ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
    const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t*, void*, size_t, CUstream stream) {
  if (lightHandle == nullptr) return blas::kNotInitialized;
  if (alpha == nullptr || beta == nullptr || A == nullptr || B == nullptr || D == nullptr) {
    return blas::kInvalidValue;
  }
  HostGemm g;
  const cublasStatus_t status = LtGemm(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &g);
  if (status != blas::kSuccess) return status;
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  if (g.beta != 0.0f && C == nullptr) return blas::kInvalidValue;
  g.a = static_cast<const float*>(A);
  g.b = static_cast<const float*>(B);
  g.c = static_cast<const float*>(C);
  g.d = static_cast<float*>(D);
  LogCall("cublasLtMatmul", g.m, g.n, g.k);
  if (g.m == 0 || g.n == 0) return blas::kSuccess;
  if (const char* below = getenv("ORION_BLAS_DOUBLE_LT_FAIL_BELOW_N");
      below != nullptr && g.n < atoll(below)) {
    return blas::kNotSupported;
  }
  Compute(g);
  return LaunchSpin(stream, g.m, g.n, g.k, g.batch) ? blas::kSuccess : kExecutionFailed;
}
