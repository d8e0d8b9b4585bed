// orion_gemm_split_probe: runs each GEMM entry point the interposer hooks (interpose/blas_abi.h)
// on the cuBLAS test double (liborion_blas_double.so) and the CUDA driver test double, the same
// call `calls` times with its stream synchronized in between (so that the interposer's timing
// events complete and it learns the call's duration), and prints one line per case:
//
//   case=NAME first_calls=F last_calls=L axis=whole|columns|rows cover=0|1 equal=0|1
//     all_equal=0|1 padding=0|1 hash=H
//
// first_calls, last_calls: how many calls the double received for the first and the last call
// (more than one: the call ran in pieces); axis: how the last call was cut; cover: its pieces
// are the whole call's k and cover its m x n exactly; equal: the first and last call's outputs
// are bitwise equal; all_equal: every call's output is bitwise the first's; padding: nothing
// outside the output (rows past m, gaps between the batch's matrices) changed; hash: FNV-1a of
// the last output's bytes (equal across runs of the probe with and without the interposer where
// the pieces are exact);
//
// and, where the driver double says, "double stream_waits=W kernel_launches=K".
//
// Usage: orion_gemm_split_probe [calls]   (default 8)
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/blas_double/probe_common.h"
#include "tests/cuda_double/double_counts.h"

extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, int attr,
                                              const void* buf, size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, int attr,
                                                const void* buf, size_t size);
}

namespace blas = orion::interpose::blas;

namespace {

constexpr int kOpT = 1;                // CUBLAS_OP_T
constexpr int kComputeFloat = 68;      // CUBLAS_COMPUTE_32F
constexpr int kGemmDefault = -1;       // CUBLAS_GEMM_DEFAULT
constexpr int kDescBiasPointer = 8;    // CUBLASLT_MATMUL_DESC_BIAS_POINTER
constexpr uint32_t kEpilogueGeluBias = 36;

using orion::testing::Received;
using orion::testing::TakeCallsFn;
using orion::testing::Values;

TakeCallsFn g_take = nullptr;

uint64_t Fnv1a(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= static_cast<const unsigned char*>(data)[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// One case: a call writing `out` (m x n per matrix, leading dimension ldd, `batch` matrices
// `stride` apart), which starts as `initial` before every call.
struct Case {
  std::string name;
  int64_t m = 0, n = 0, k = 0;
  int64_t ldd = 0, stride = 0, batch = 1;
  std::vector<float> out, initial;
  std::function<cublasStatus_t()> call;
};

Received Take() { return orion::testing::Take(g_take); }

// How the call was cut ("whole", "columns", "rows") and whether its pieces cover it exactly.
void Pieces(const Case& c, const Received& r, const char** axis, bool* cover) {
  std::istringstream lines(r.log);
  std::string api;
  long long m = 0, n = 0, k = 0;
  int64_t sum_m = 0, sum_n = 0;
  bool all_m = true, all_n = true, all_k = true, all_api = true;
  size_t count = 0;
  while (lines >> api >> m >> n >> k) {
    ++count;
    all_api = all_api && c.name.rfind(api, 0) == 0;
    all_m = all_m && m == c.m;
    all_n = all_n && n == c.n;
    all_k = all_k && k == c.k;
    sum_m += m;
    sum_n += n;
  }
  *axis = count <= 1 ? "whole" : all_m ? "columns" : all_n ? "rows" : "mixed";
  *cover = count == r.calls && count >= 1 && all_api && all_k &&
           ((all_m && sum_n == c.n) || (all_n && sum_m == c.m));
}

bool PaddingKept(const Case& c) {
  for (size_t i = 0; i < c.out.size(); ++i) {
    const int64_t q = static_cast<int64_t>(i) / c.stride, at = static_cast<int64_t>(i) % c.stride;
    const bool output = q < c.batch && at / c.ldd < c.n && at % c.ldd < c.m;
    if (!output && memcmp(&c.out[i], &c.initial[i], sizeof(float)) != 0) return false;
  }
  return true;
}

void Run(Case& c, int calls, CUstream stream) {
  std::vector<float> first;
  Received first_got, last_got;
  bool all_equal = true, last_equal = false;
  for (int i = 0; i < calls; ++i) {
    c.out = c.initial;
    Take();
    const cublasStatus_t status = c.call();
    if (status != 0) {
      fprintf(stderr, "probe: %s call %d failed: %d\n", c.name.c_str(), i, status);
      exit(1);
    }
    PROBE_CU(cuStreamSynchronize(stream));
    const Received got = Take();
    if (i == 0) {
      first = c.out;
      first_got = got;
    }
    last_equal = memcmp(first.data(), c.out.data(), first.size() * sizeof(float)) == 0;
    all_equal = all_equal && last_equal;
    if (i == calls - 1) last_got = got;
  }
  const char* axis = "";
  bool cover = false;
  Pieces(c, last_got, &axis, &cover);
  printf("case=%s first_calls=%zu last_calls=%zu axis=%s cover=%d equal=%d all_equal=%d "
         "padding=%d hash=%016llx\n",
         c.name.c_str(), first_got.calls, last_got.calls, axis, cover ? 1 : 0,
         last_equal ? 1 : 0, all_equal ? 1 : 0, PaddingKept(c) ? 1 : 0,
         static_cast<unsigned long long>(Fnv1a(c.out.data(), c.out.size() * sizeof(float))));
  fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? atoi(argv[1]) : 8;
  if (calls < 1) return 2;
  g_take = reinterpret_cast<TakeCallsFn>(dlsym(RTLD_DEFAULT, "orion_blas_double_take_calls"));
  if (g_take == nullptr) {
    fprintf(stderr, "probe: orion_blas_double_take_calls not found\n");
    return 1;
  }
  CUdevice device;
  CUcontext ctx;
  CUstream stream;
  PROBE_CU(cuInit(0));
  PROBE_CU(cuDeviceGet(&device, 0));
  PROBE_CU(cuDevicePrimaryCtxRetain(&ctx, device));
  PROBE_CU(cuCtxSetCurrent(ctx));
  PROBE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  cublasHandle_t handle;
  cublasLtHandle_t lt;
  PROBE_BLAS(cublasCreate_v2(&handle));
  PROBE_BLAS(cublasSetStream_v2(handle, stream));
  PROBE_BLAS(cublasLtCreate(&lt));

  const float alpha = 0.75f, beta = -0.5f;
  std::vector<Case> cases;
  cases.reserve(10);  // the calls hold pointers to their cases

  // Classic cuBLAS, in place (C is D): m x n x k, op(A), op(B), batch.
  struct Classic {
    const char* name;
    int api;  // 0 GemmEx, 1 GemmStridedBatchedEx, 2 Sgemm, 3 SgemmStridedBatched
    bool ta, tb;
    int m, n, k, batch;
  };
  const Classic classic[] = {
      {"cublasGemmEx", 0, false, false, 512, 2053, 256, 1},
      {"cublasGemmStridedBatchedEx", 1, true, false, 256, 2053, 160, 3},
      {"cublasSgemm_v2", 2, true, true, 512, 2053, 256, 1},
      {"cublasSgemmStridedBatched", 3, false, true, 256, 2053, 160, 3},
      // n narrower than two granules and m wide: cut by rows.
      {"cublasSgemm_v2_rows", 2, false, false, 2053, 200, 512, 1},
  };
  // Inputs outlive the cases.
  static std::vector<std::vector<float>> inputs;
  inputs.reserve(16);
  for (const Classic& cl : classic) {
    const int lda = (cl.ta ? cl.k : cl.m) + 3, ldb = (cl.tb ? cl.n : cl.k) + 5, ldc = cl.m + 9;
    const long long sa = static_cast<long long>(lda) * (cl.ta ? cl.m : cl.k) + 7;
    const long long sb = static_cast<long long>(ldb) * (cl.tb ? cl.k : cl.n) + 11;
    const long long sc = static_cast<long long>(ldc) * cl.n + 13;
    inputs.push_back(Values(static_cast<size_t>(sa * cl.batch), 1));
    const float* a = inputs.back().data();
    inputs.push_back(Values(static_cast<size_t>(sb * cl.batch), 2));
    const float* b = inputs.back().data();
    Case& c = cases.emplace_back();
    c.name = cl.name;
    c.m = cl.m;
    c.n = cl.n;
    c.k = cl.k;
    c.ldd = ldc;
    c.stride = sc;
    c.batch = cl.batch;
    c.initial = Values(static_cast<size_t>(sc * cl.batch), 3);
    Case* cp = &c;
    const int ta = cl.ta ? kOpT : blas::kOpN, tb = cl.tb ? kOpT : blas::kOpN;
    switch (cl.api) {
      case 0:
        c.call = [=, &alpha, &beta] {
          return cublasGemmEx(handle, ta, tb, cl.m, cl.n, cl.k, &alpha, a, blas::kDataR32F, lda,
                              b, blas::kDataR32F, ldb, &beta, cp->out.data(), blas::kDataR32F,
                              ldc, kComputeFloat, kGemmDefault);
        };
        break;
      case 1:
        c.call = [=, &alpha, &beta] {
          return cublasGemmStridedBatchedEx(handle, ta, tb, cl.m, cl.n, cl.k, &alpha, a,
                                            blas::kDataR32F, lda, sa, b, blas::kDataR32F, ldb,
                                            sb, &beta, cp->out.data(), blas::kDataR32F, ldc, sc,
                                            cl.batch, kComputeFloat, kGemmDefault);
        };
        break;
      case 2:
        c.call = [=, &alpha, &beta] {
          return cublasSgemm_v2(handle, ta, tb, cl.m, cl.n, cl.k, &alpha, a, lda, b, ldb, &beta,
                                cp->out.data(), ldc);
        };
        break;
      default:
        c.call = [=, &alpha, &beta] {
          return cublasSgemmStridedBatched(handle, ta, tb, cl.m, cl.n, cl.k, &alpha, a, lda, sa,
                                           b, ldb, sb, &beta, cp->out.data(), ldc, sc,
                                           cl.batch);
        };
        break;
    }
  }

  // cuBLASLt: GELU over a bias per row, op(B) = B^T, C and D apart, a batch of 2; again with D
  // synchronized in chunks with another kernel (CUDA 12's atomic sync), which goes whole.
  for (const int32_t sync_chunks : {0, 2}) {
    const int64_t m = 512, n = 2053, k = 128, batch = 2;
    const int64_t lda = m + 6, ldb = n + 2, ldc = m + 3, ldd = m + 8;
    const int64_t sa = lda * k + 5, sb = ldb * k + 7, sc = ldc * n + 9, sd = ldd * n + 11;
    inputs.push_back(Values(static_cast<size_t>(sa * batch), 4));
    const float* a = inputs.back().data();
    inputs.push_back(Values(static_cast<size_t>(sb * batch), 5));
    const float* b = inputs.back().data();
    inputs.push_back(Values(static_cast<size_t>(sc * batch), 6));
    const float* c_in = inputs.back().data();
    inputs.push_back(Values(static_cast<size_t>(m), 7));
    const float* bias = inputs.back().data();
    cublasLtMatmulDesc_t desc;
    PROBE_BLAS(cublasLtMatmulDescCreate(&desc, kComputeFloat, blas::kDataR32F));
    const int32_t transb = kOpT;
    const uint32_t epilogue = kEpilogueGeluBias;
    PROBE_BLAS(cublasLtMatmulDescSetAttribute(desc, blas::kDescTransB, &transb, sizeof(transb)));
    PROBE_BLAS(
        cublasLtMatmulDescSetAttribute(desc, blas::kDescEpilogue, &epilogue, sizeof(epilogue)));
    PROBE_BLAS(cublasLtMatmulDescSetAttribute(desc, kDescBiasPointer, &bias, sizeof(bias)));
    if (sync_chunks != 0) {
      PROBE_BLAS(cublasLtMatmulDescSetAttribute(desc, blas::kDescAtomicSyncChunksRows,
                                                &sync_chunks, sizeof(sync_chunks)));
    }
    auto layout = [&](uint64_t rows, uint64_t cols, int64_t ld, int64_t stride) {
      cublasLtMatrixLayout_t l;
      const int32_t count = static_cast<int32_t>(batch);
      PROBE_BLAS(cublasLtMatrixLayoutCreate(&l, blas::kDataR32F, rows, cols, ld));
      PROBE_BLAS(cublasLtMatrixLayoutSetAttribute(l, blas::kLayoutBatchCount, &count,
                                                  sizeof(count)));
      PROBE_BLAS(cublasLtMatrixLayoutSetAttribute(l, blas::kLayoutBatchStride, &stride,
                                                  sizeof(stride)));
      return l;
    };
    cublasLtMatrixLayout_t adesc = layout(m, k, lda, sa), bdesc = layout(n, k, ldb, sb),
                           cdesc = layout(m, n, ldc, sc), ddesc = layout(m, n, ldd, sd);
    static const cublasLtMatmulAlgo_t algo{};  // as chosen for the whole call
    static const float lt_beta = 0.25f;
    Case& c = cases.emplace_back();
    c.name = sync_chunks == 0 ? "cublasLtMatmul" : "cublasLtMatmul_atomic_sync";
    c.m = m;
    c.n = n;
    c.k = k;
    c.ldd = ldd;
    c.stride = sd;
    c.batch = batch;
    c.initial.assign(static_cast<size_t>(sd * batch), -7.0f);
    Case* cp = &c;
    c.call = [=, &alpha] {
      return cublasLtMatmul(lt, desc, &alpha, a, adesc, b, bdesc, &lt_beta, c_in, cdesc,
                            cp->out.data(), ddesc, &algo, nullptr, 0, stream);
    };
  }

  // cuBLASLt in place: C is D (one layout), beta 0.25, op(B) = B^T, no epilogue. A piece that
  // fails once part of D is written cannot send the call whole again.
  {
    const int64_t m = 512, n = 2053, k = 256, lda = m + 6, ldb = n + 2, ldd = m + 8;
    inputs.push_back(Values(static_cast<size_t>(lda * k), 8));
    const float* a = inputs.back().data();
    inputs.push_back(Values(static_cast<size_t>(ldb * k), 9));
    const float* b = inputs.back().data();
    cublasLtMatmulDesc_t desc;
    PROBE_BLAS(cublasLtMatmulDescCreate(&desc, kComputeFloat, blas::kDataR32F));
    const int32_t transb = kOpT;
    PROBE_BLAS(cublasLtMatmulDescSetAttribute(desc, blas::kDescTransB, &transb, sizeof(transb)));
    cublasLtMatrixLayout_t adesc, bdesc, cddesc;
    PROBE_BLAS(cublasLtMatrixLayoutCreate(&adesc, blas::kDataR32F, m, k, lda));
    PROBE_BLAS(cublasLtMatrixLayoutCreate(&bdesc, blas::kDataR32F, n, k, ldb));
    PROBE_BLAS(cublasLtMatrixLayoutCreate(&cddesc, blas::kDataR32F, m, n, ldd));
    static const cublasLtMatmulAlgo_t algo{};
    static const float in_place_beta = 0.25f;
    Case& c = cases.emplace_back();
    c.name = "cublasLtMatmul_in_place";
    c.m = m;
    c.n = n;
    c.k = k;
    c.ldd = ldd;
    c.stride = ldd * n;
    c.initial = Values(static_cast<size_t>(ldd * n), 10);
    Case* cp = &c;
    c.call = [=, &alpha] {
      return cublasLtMatmul(lt, desc, &alpha, a, adesc, b, bdesc, &in_place_beta, cp->out.data(),
                            cddesc, cp->out.data(), cddesc, &algo, nullptr, 0, stream);
    };
  }

  for (Case& c : cases) Run(c, calls, stream);
  // The driver double's counts: the stream waits on host memory the process queued (the GPU
  // hold's, interpose/gpu_hold.h) and the kernels it launched.
  unsigned long long waits = 0, kernels = 0;
  if (orion::testing::ReadDoubleCount("stream_waits", &waits) &&
      orion::testing::ReadDoubleCount("kernel_launches", &kernels)) {
    printf("double stream_waits=%llu kernel_launches=%llu\n", waits, kernels);
  }
  PROBE_BLAS(cublasLtDestroy(lt));
  PROBE_BLAS(cublasDestroy_v2(handle));
  PROBE_CU(cuStreamDestroy(stream));
  return 0;
}
