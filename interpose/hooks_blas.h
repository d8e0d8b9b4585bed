// What the rest of the interposer asks of the cuBLAS hooks (hooks_blas.cc).
#pragma once

#include "interpose/cuda_abi.h"
#include "interpose/glibc_compat.h"

namespace orion::interpose {

// A timed GEMM call's start event, recorded on its stream before cuBLAS runs, is recorded again
// right before the call's first kernel goes to the driver (RestartGemmTiming, in the launch
// hook): after the gate's wait on the CPU and behind the hold's wait on the GPU, so that neither
// reads as the GEMM's duration (the waits of its later kernels still do). Set on the calling
// thread between the two records.
struct GemmStartToRedo {
  CUevent event = nullptr;
  CUstream stream = nullptr;
};
extern constinit thread_local GemmStartToRedo t_gemm_start ORION_INITIAL_EXEC_TLS;

// The one stream a handle names: null is the legacy default stream, or the thread's own default
// stream through a per-thread (_ptsz) entry point; CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name
// them from anywhere. cuBLAS's stream is a runtime handle (null: the legacy stream).
inline CUstream CanonicalStream(CUstream stream, bool per_thread_stream) {
  if (stream != nullptr) return stream;
  return per_thread_stream ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
}

// At the call's first kernel launch, on `stream` (canonical): the start event to record again,
// null where that launch is on another stream (the first record stands: work before it on the
// call's stream would drop out of the sample). Taken either way.
inline CUevent TakeGemmStart(GemmStartToRedo& pending, CUstream stream) {
  const GemmStartToRedo taken = pending;
  pending = {};
  return CanonicalStream(taken.stream, false) == stream ? taken.event : nullptr;
}
void RedoGemmStart(CUstream stream);
// Before a kernel launch goes to the driver on `stream` (through a per-thread entry point or not).
inline void RestartGemmTiming(CUstream stream, bool per_thread_stream) {
  if (t_gemm_start.event != nullptr) [[unlikely]] {
    RedoGemmStart(CanonicalStream(stream, per_thread_stream));
  }
}

// In a fork child (OnForkChild): the shape table's lock anew, no timed call in flight.
void ResetGemmSplitAfterFork();

}  // namespace orion::interpose
