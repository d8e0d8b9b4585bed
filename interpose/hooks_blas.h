// What the rest of the interposer asks of the cuBLAS hooks (hooks_blas.cc).
#pragma once

#include "interpose/cuda_abi.h"
#include "interpose/glibc_compat.h"

namespace orion::interpose {

// A timed GEMM call's start event, recorded on its stream before cuBLAS runs, is recorded again
// right before the call's first kernel goes to the driver (RestartGemmTiming, in the launch
// hook): after the gate's wait on the CPU and behind the hold's wait on the GPU, so that neither
// reads as the GEMM's duration. Set on the calling thread between the two records.
struct GemmStartToRedo {
  CUevent event = nullptr;
  CUstream stream = nullptr;
};
extern constinit thread_local GemmStartToRedo t_gemm_start ORION_INITIAL_EXEC_TLS;
void RedoGemmStart();
// Before a kernel launch goes to the driver on `stream`.
inline void RestartGemmTiming(CUstream stream) {
  if (t_gemm_start.event != nullptr && t_gemm_start.stream == stream) [[unlikely]] {
    RedoGemmStart();
  }
}

// In a fork child (OnForkChild): the shape table's lock anew, no timed call in flight.
void ResetGemmSplitAfterFork();

}  // namespace orion::interpose
