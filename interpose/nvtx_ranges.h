// NVTX ranges (training steps, requests) captured by the interposer as an NVTX tool.
//
// Applications that use NVTX (torch.cuda.nvtx, most frameworks) load their tool from
// NVTX_INJECTION64_PATH; orion-run and the device plugin point it at this library (only where
// the pod has not chosen another tool) and the library answers InitializeInjectionNvtx2 by
// filling in the core range calls: nvtxRangePushA/W/Ex, nvtxRangePop, nvtxRangeStartA/W/Ex and
// nvtxRangeEnd. Each closed range nested less than ORION_NVTX_DEPTH deep is reported to the
// server (a kRange event) with its CPU times and, when the thread has launched work before, its
// GPU times: a timing event recorded at the push on the thread's last stream (the GPU reached
// the range's start) and one at the pop (its work before the pop was done), placed on the host
// clock by the completion poller. Without a server, log mode writes ranges to the call log.
//
// Usage (the launch hook, just before the real launch):
//   NoteLaunchStream(ctx, stream, per_thread_stream);
#pragma once

#include <stdint.h>

#include "interpose/cuda_abi.h"
#include "interpose/thread_launch.h"

namespace orion::interpose {

// The ranges of this thread waiting for its first launch start on `stream` (NoteLaunchStream).
void StartWaitingRanges(CUcontext ctx, CUstream stream, bool per_thread_stream);

// Remembers the calling thread's stream: ranges it opens later start there, and a range opened
// before the thread's first launch starts at this launch. A few thread-local stores, inline.
inline void NoteLaunchStream(CUcontext ctx, CUstream stream, bool per_thread_stream) {
  ThreadStream& ts = t_launch.stream;
  ts.ctx = ctx;
  ts.stream = stream;
  ts.per_thread_stream = per_thread_stream;
  ts.has_stream = true;
  if (ts.waiting != 0) StartWaitingRanges(ctx, stream, per_thread_stream);
}

// Reports an NVTX range to `reg`'s ring as a kRange event: CPU times always; GPU times (host
// clock) when both are known (gpu_start_ns != 0). A closed range without a GPU start, and the
// completion poller for one with (completion_pipeline.cc).
void ReportRange(Registration* reg, const char* name, uint32_t depth, uint64_t cpu_start_ns,
                 uint64_t cpu_end_ns, uint64_t gpu_start_ns, uint64_t gpu_end_ns, uint64_t stream);

// In a fork child: the calling thread's open ranges refer to records the child does not have.
void ResetNvtxAfterFork();

}  // namespace orion::interpose
