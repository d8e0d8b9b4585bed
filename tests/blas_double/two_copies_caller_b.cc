// liborion_blas_caller_b.so: a library linked against copy B of the cuBLAS test double
// (liborion_blas_double_b.so, symbols versioned ORION_BLAS_B), as a framework's extension
// module linked against its own cuBLAS. orion_blas_two_copies_probe, linked against copy A,
// opens it with RTLD_LOCAL: the loader binds this library's cuBLAS references to copy B (copy A's
// definitions carry another version), and an unversioned hook in front of both captures them.
//
// Its handle is created through copy B's cublasCreate_v2 and its GEMM goes to cublasGemmEx from
// here, so that a hook resolving the real function for this call site must find copy B.
#include "interpose/blas_abi.h"

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, CUstream stream);
}

namespace {
cublasHandle_t g_handle = nullptr;
}  // namespace

// C (m x n, column-major, leading dimension ldc) = alpha * A (m x k) * B (k x n) + beta * C, all
// float on the host (the double's convention), on `stream`. Returns the cuBLAS status.
extern "C" __attribute__((visibility("default"))) int orion_caller_b_gemm(
    CUstream stream, int m, int n, int k, const float* alpha, const float* a, int lda,
    const float* b, int ldb, const float* beta, float* c, int ldc) {
  if (g_handle == nullptr) {
    const cublasStatus_t status = cublasCreate_v2(&g_handle);
    if (status != 0) return status;
  }
  const cublasStatus_t status = cublasSetStream_v2(g_handle, stream);
  if (status != 0) return status;
  return cublasGemmEx(g_handle, orion::interpose::blas::kOpN, orion::interpose::blas::kOpN, m, n,
                      k, alpha, a, orion::interpose::blas::kDataR32F, lda, b,
                      orion::interpose::blas::kDataR32F, ldb, beta, c,
                      orion::interpose::blas::kDataR32F, ldc, /*CUBLAS_COMPUTE_32F=*/68,
                      /*CUBLAS_GEMM_DEFAULT=*/-1);
}
