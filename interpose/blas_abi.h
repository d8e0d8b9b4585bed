// The cuBLAS and cuBLASLt ABI as the interposer (and the test double, tests/blas_double) sees
// it: opaque handles, the enum values it reads (cublas_api.h, cublasLt.h and library_types.h of
// CUDA 12 and 13, where they are the same) and the prototypes of the GEMM entry points it hooks.
// Declared here rather than included, so that the interposer builds without the cuBLAS headers
// and reads exactly the values it names.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "interpose/cuda_abi.h"

extern "C" {
typedef struct cublasContext* cublasHandle_t;
typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  int state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;
typedef int cublasStatus_t;
typedef int cublasOperation_t;
typedef int cudaDataType;
typedef int cublasComputeType_t;
typedef int cublasGemmAlgo_t;
typedef int cublasLtMatrixLayoutAttribute_t;
typedef int cublasLtMatmulDescAttributes_t;
}

namespace orion::interpose::blas {

inline constexpr cublasStatus_t kSuccess = 0;        // CUBLAS_STATUS_SUCCESS
inline constexpr cublasStatus_t kNotInitialized = 1;  // CUBLAS_STATUS_NOT_INITIALIZED
inline constexpr cublasStatus_t kInvalidValue = 7;    // CUBLAS_STATUS_INVALID_VALUE
inline constexpr cublasStatus_t kNotSupported = 15;   // CUBLAS_STATUS_NOT_SUPPORTED
inline constexpr cublasOperation_t kOpN = 0;           // CUBLAS_OP_N (T = 1, C = 2)
inline constexpr int kDataR32F = 0;                    // CUDA_R_32F

// cublasLtMatrixLayoutAttribute_t
inline constexpr int kLayoutType = 0;          // uint32_t (cudaDataType)
inline constexpr int kLayoutOrder = 1;         // int32_t, 0 = CUBLASLT_ORDER_COL
inline constexpr int kLayoutRows = 2;          // uint64_t
inline constexpr int kLayoutCols = 3;          // uint64_t
inline constexpr int kLayoutLd = 4;            // int64_t
inline constexpr int kLayoutBatchCount = 5;    // int32_t
inline constexpr int kLayoutBatchStride = 6;   // int64_t (STRIDED_BATCH_OFFSET)
inline constexpr int kLayoutPlaneOffset = 7;   // int64_t
inline constexpr int kLayoutBatchMode = 8;     // uint32_t, 0 = strided

// cublasLtMatmulDescAttributes_t
inline constexpr int kDescComputeType = 0;   // int32_t (cublasComputeType_t)
inline constexpr int kDescScaleType = 1;     // int32_t (cudaDataType)
inline constexpr int kDescPointerMode = 2;   // int32_t: 0 host, 1 device, 2.. vectors
inline constexpr int kDescTransA = 3;        // int32_t
inline constexpr int kDescTransB = 4;        // int32_t
inline constexpr int kDescTransC = 5;        // int32_t
inline constexpr int kDescFillMode = 6;      // int32_t (cublasFillMode_t)
inline constexpr int kFillFull = 2;          // CUBLAS_FILL_MODE_FULL, the default
inline constexpr int kDescEpilogue = 7;      // uint32_t
inline constexpr int kDescAmaxD = 21;        // void*
inline constexpr int kDescAScaleMode = 31;   // int32_t, 0 = one scalar
inline constexpr int kDescBScaleMode = 32;
inline constexpr int kDescCScaleMode = 33;
inline constexpr int kDescDScaleMode = 34;
inline constexpr int kDescDOutScaleMode = 37;
// CUDA 12's atomic synchronization of D in chunks with another kernel (gone from CUDA 13):
inline constexpr int kDescAtomicSyncChunksRows = 27;   // int32_t, 0 = off
inline constexpr int kDescAtomicSyncChunksCols = 28;   // int32_t, 0 = off
inline constexpr int kDescAtomicSyncInCounters = 29;   // int32_t* (device)
inline constexpr int kDescAtomicSyncOutCounters = 30;  // int32_t* (device)

// cublasLtEpilogue_t values whose pieces are exact over columns: elementwise on D, a bias per
// row of D (DEFAULT, RELU, BIAS, RELU_BIAS, GELU, GELU_BIAS). The others write an auxiliary
// matrix or reduce over the columns (bias gradients).
inline bool EpilogueSlicesByColumns(uint32_t epilogue) {
  return epilogue == 1 || epilogue == 2 || epilogue == 4 || epilogue == 6 || epilogue == 32 ||
         epilogue == 36;
}

}  // namespace orion::interpose::blas

// The hooked entry points (blas_functions.def lists them for the export test).
#define ORION_BLAS_EXPORT extern "C" __attribute__((visibility("default")))
ORION_BLAS_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int m, int n, int k,
                                              const void* alpha, const void* A, cudaDataType Atype,
                                              int lda, const void* B, cudaDataType Btype, int ldb,
                                              const void* beta, void* C, cudaDataType Ctype,
                                              int ldc, cublasComputeType_t computeType,
                                              cublasGemmAlgo_t algo);
ORION_BLAS_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo);
ORION_BLAS_EXPORT cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k,
                                                const float* alpha, const float* A, int lda,
                                                const float* B, int ldb, const float* beta,
                                                float* C, int ldc);
ORION_BLAS_EXPORT cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float* alpha, const float* A, int lda, long long int strideA, const float* B, int ldb,
    long long int strideB, const float* beta, float* C, int ldc, long long int strideC,
    int batchCount);
ORION_BLAS_EXPORT cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
    const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
    size_t workspaceSizeInBytes, CUstream stream);
