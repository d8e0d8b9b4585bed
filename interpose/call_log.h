// Log mode: with ORION_LOG_DIR set and no orion-server to register with, the interposer keeps its
// own record of the process's CUDA work instead of only passing calls through, so a job can be
// looked at without any server (`orion-ctl timeline --from-log DIR --trace out.json`).
//
// Files, in ORION_LOG_DIR, one pair per process:
//   timeline.<pid>.log  a header line "# orion-call-log 1 pid=<pid> process=<name>", then one
//                       line per call, tab-separated:
//                         start_unix_ns  duration_ns  call  name  bytes  copy_kind
//                       duration: the driver call on the CPU (a launch's enqueue, a synchronous
//                       copy's whole transfer); name: the kernel's for launches, else "-";
//                       copy_kind: h2d, d2h, d2d, h2h, unknown, or "-" for non-copies.
//   metrics.<pid>.log   "call count total_ns" per driver call, rewritten at each flush and at exit.
// Lines are buffered (64 KiB) and written with write(2); a full disk or a vanished folder turns
// the log off with one line on stderr, never an error for the application.
//
// Usage (in a hook, when CurrentRegistration() is null):
//   if (CallLogActive()) return LoggedCall("cuMemAlloc_v2", nullptr, bytes, [&] { return real(...); });
#pragma once

#include <stdint.h>

#include "contract/orion_contract.h"
#include "interpose/cuda_abi.h"

namespace orion::interpose {

// True once log mode is on for this process (set by StartCallLog; one relaxed load).
bool CallLogActive();

// Turns log mode on (after a failed registration, when ORION_LOG_DIR is set): creates the
// folder's files for this process. False (and says why once on stderr) if it cannot.
bool StartCallLog(const char* dir, const char* process_name, bool quiet);

// Records one call. `name` and `call` must outlive the process (string literals or driver-owned
// kernel names), or be copied before return (they are: the line is formatted at once).
void LogCall(const char* call, const char* name, uint64_t start_unix_ns, uint64_t duration_ns,
             uint64_t bytes, contract::CopyDirection direction, bool is_copy);

// CLOCK_REALTIME in ns (the log's clock, so that several hosts' logs share an axis).
uint64_t RealtimeNs();

// Runs `real_call` (a driver call) and, when it succeeds, logs it with its CPU duration.
template <typename Call>
CUresult LoggedCall(const char* call, const char* name, uint64_t bytes, Call real_call) {
  const uint64_t t0 = RealtimeNs();
  const CUresult result = real_call();
  if (result == CUDA_SUCCESS) {
    LogCall(call, name, t0, RealtimeNs() - t0, bytes, contract::CopyDirection::kUnknown,
            /*is_copy=*/false);
  }
  return result;
}

// Writes what is buffered (and the metrics file). Called at exit; safe to call any time.
void FlushCallLog();

// In a fork child: the parent's files are not ours; the child starts its own on its next call.
void ResetCallLogAfterFork();

}  // namespace orion::interpose
