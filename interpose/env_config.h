// Parsing of the interposer's environment variables and small formatting functions, kept pure
// (no globals, no allocation, no libstdc++) so they are unit-tested without a GPU.
//
// Usage:
//   uint64_t limit = 0;
//   if (!orion::interpose::ParseByteSize("2Gi", &limit)) { /* ignore the variable */ }
//   char uuid[orion::contract::kGpuUuidBytes];
//   orion::interpose::FormatGpuUuid(raw16, uuid, sizeof(uuid));  // "GPU-xxxxxxxx-...."
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <utility>

#include "contract/gate_rules.h"
#include "contract/orion_contract.h"
#include "interpose/kernel_registry.h"
#include "interpose/sample_timing.h"

namespace orion::interpose {

// `value` is `word` (lower case), case aside.
inline bool IsWord(const char* value, const char* word) {
  auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; };
  size_t i = 0;
  for (; value[i] != '\0' && word[i] != '\0'; ++i) {
    if (lower(value[i]) != word[i]) return false;
  }
  return value[i] == '\0' && word[i] == '\0';
}

// "1", "true", "yes", "on" (any case) -> true. Null or anything else -> false.
inline bool ParseFlag(const char* value) {
  if (value == nullptr) return false;
  return IsWord(value, "1") || IsWord(value, "true") || IsWord(value, "yes") || IsWord(value, "on");
}

// A flag that is on unless it says 0, false, no or off.
inline bool ParseFlagOff(const char* value) {
  if (value == nullptr) return false;
  return IsWord(value, "0") || IsWord(value, "false") || IsWord(value, "no") || IsWord(value, "off");
}

// "high" -> kHigh; "best-effort", "besteffort", "be", "low" -> kBestEffort; else kNoValue32.
inline uint32_t ParsePriority(const char* value) {
  if (value == nullptr) return contract::kNoValue32;
  char buf[16];
  size_t n = 0;
  for (; value[n] != '\0'; ++n) {
    if (n + 1 >= sizeof(buf)) return contract::kNoValue32;
    char c = value[n];
    buf[n] = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  buf[n] = '\0';
  auto is = [&](const char* word) {
    size_t i = 0;
    for (; buf[i] != '\0' && word[i] != '\0'; ++i) {
      if (buf[i] != word[i]) return false;
    }
    return buf[i] == word[i];
  };
  if (is("high") || is("hp") || is("latency-critical")) {
    return static_cast<uint32_t>(contract::Priority::kHigh);
  }
  if (is("best-effort") || is("besteffort") || is("best_effort") || is("be") || is("low")) {
    return static_cast<uint32_t>(contract::Priority::kBestEffort);
  }
  return contract::kNoValue32;
}

// Kubernetes-style quantities: "1073741824", "512Mi", "2Gi", "1Ti", "500M", "2G", "64Ki", "64k".
// Returns false (and leaves *out alone) on junk, overflow or an empty string.
inline bool ParseByteSize(const char* value, uint64_t* out) {
  if (value == nullptr || out == nullptr) return false;
  const char* p = value;
  while (*p == ' ') ++p;
  if (*p < '0' || *p > '9') return false;
  uint64_t number = 0;
  for (; *p >= '0' && *p <= '9'; ++p) {
    const uint64_t digit = static_cast<uint64_t>(*p - '0');
    if (number > (UINT64_MAX - digit) / 10) return false;
    number = number * 10 + digit;
  }
  uint64_t scale = 1;
  const char unit = *p;
  if (unit != '\0') {
    const bool binary = p[1] == 'i';
    const uint64_t base = binary ? 1024 : 1000;
    int power = 0;
    switch (unit) {
      case 'k':
      case 'K':
        power = 1;
        break;
      case 'M':
        power = 2;
        break;  // 'm' is milli in Kubernetes: refused
      case 'G':
      case 'g':
        power = 3;
        break;
      case 'T':
      case 't':
        power = 4;
        break;
      case 'B':
      case 'b':
        power = 0;
        break;
      default:
        return false;
    }
    for (int i = 0; i < power; ++i) scale *= base;
    p += binary ? 2 : 1;
    if (*p == 'B' || *p == 'b') ++p;  // tolerate "2GiB", "512MB"
    while (*p == ' ') ++p;
    if (*p != '\0') return false;
  }
  if (scale != 0 && number > UINT64_MAX / scale) return false;
  *out = number * scale;
  return true;
}

// Non-negative decimal integer; false on junk or overflow.
inline bool ParseUnsigned(const char* value, uint64_t* out) {
  if (value == nullptr || *value < '0' || *value > '9') return false;
  uint64_t number = 0;
  for (const char* p = value; *p != '\0'; ++p) {
    if (*p < '0' || *p > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(*p - '0');
    if (number > (UINT64_MAX - digit) / 10) return false;
    number = number * 10 + digit;
  }
  *out = number;
  return true;
}

// 16 raw UUID bytes -> "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (what nvidia-smi -L shows and
// what NVIDIA_VISIBLE_DEVICES carries). Needs out_bytes >= 41; writes "" if it is smaller.
inline void FormatGpuUuid(const unsigned char raw[16], char* out, size_t out_bytes) {
  constexpr size_t kFormatted = 4 + 32 + 4;  // "GPU-" + hex digits + dashes
  if (out == nullptr || out_bytes == 0) return;
  if (out_bytes < kFormatted + 1) {
    out[0] = '\0';
    return;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  size_t pos = 0;
  out[pos++] = 'G';
  out[pos++] = 'P';
  out[pos++] = 'U';
  out[pos++] = '-';
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[pos++] = '-';
    out[pos++] = kHex[raw[i] >> 4];
    out[pos++] = kHex[raw[i] & 0xF];
  }
  out[pos] = '\0';
}

// Copies at most dst_bytes-1 characters and always terminates (dst_bytes > 0).
inline void CopyTruncated(char* dst, size_t dst_bytes, const char* src) {
  if (dst == nullptr || dst_bytes == 0) return;
  size_t i = 0;
  if (src != nullptr) {
    for (; i + 1 < dst_bytes && src[i] != '\0'; ++i) dst[i] = src[i];
  }
  dst[i] = '\0';
}

// The completion poller's lazy period (completion_poll.h): how long a record that nobody waits
// for (a timing sample, an NVTX range, a budget charge while nobody is held) may wait before the
// poller looks at it. A trainer always has a timed sample in flight, so this is how often its
// poller wakes, and a one-CPU pod pays for every wake: at 1 ms the trainer's step p99 rose 1.13x
// under a cgroup cpu.max of one CPU on an H100, and at 10 ms the interposed service was still
// throttled by the quota more often than the bare one (bench/orion_bench.py cpu-tax, round 13).
// ORION_LAZY_POLL_MS sets it (1 to 1000 ms).
inline constexpr uint64_t kDefaultLazyPollNs = 50'000'000;
// The lazy period of a process that may use less than two CPUs (its affinity or its cgroup's
// quota, cpu_limits.h), unless ORION_LAZY_POLL_MS is set: there every poller wake-up preempts
// the application's own thread on its one core (an eager service pinned to one core was
// preempted 27 times a second against 11 bare at 50 ms, 15 to 16 of them the poller's). Timing
// samples and NVTX ranges then reach the server up to a second late; a process short of
// records, a thread held at the gate and the exit flush still wake the poller at once.
inline constexpr uint64_t kFewCpusLazyPollNs = 1'000'000'000;
inline constexpr uint32_t kFewCpusBelowMilliCpus = 2000;

// Everything the interposer reads from its environment, parsed once.
struct EnvConfig {
  bool disabled = false;  // ORION_DISABLE: pure pass-through
  bool quiet = false;     // ORION_QUIET: no stderr notes
  bool profile = false;   // ORION_PROFILE: time every launch on the GPU
  // ORION_NO_TIMING: time no launch on the GPU unless profiling (the sampled ones included):
  // what the timeline's own GPU timing costs, by difference (bench/orion_bench.py cpu-tax
  // --baseline-env). Spans are then all inferred and busy seconds stay at 0.
  bool no_timing = false;
  // ORION_TIMING_HOLD (on unless 0/false/no/off): a timed kernel launch is held on its stream
  // until its end event is recorded (timing_hold.h); never with CUDA_LAUNCH_BLOCKING=1.
  bool timing_hold = true;
  // ORION_SAMPLE_EVERY, ORION_SAMPLE_EVERY_HIGH: past a kernel's first launches, 1 in this many
  // of a best-effort and of a high-priority client's launches are timed on the GPU (a power of
  // two from 1 to 4096; kernel_registry.h).
  uint32_t sample_every = kDefaultSampleEvery;
  uint32_t sample_every_high = kDefaultSampleEveryHigh;
  uint32_t requested_priority = contract::kNoValue32;
  uint64_t requested_memory_limit = 0;
  uint64_t requested_latency_target_us = 0;
  char requested_job[64] = {};  // ORION_JOB (checked by the server; a longer name is cut)
  char socket_path[108] = {};  // sun_path size
  char log_dir[256] = {};      // ORION_LOG_DIR: write call logs there when no server answers
  char timing_log_dir[256] = {};  // ORION_TIMING_LOG: the GPU timing diagnostic (timing_log.h)
  // ORION_NVTX_DEPTH: NVTX nesting levels reported as ranges (0: none); deeper ones are only
  // counted so that push and pop stay paired.
  uint32_t nvtx_depth = 2;
  // ORION_KERNEL_START_NS, ORION_QUEUED_START_NS, ORION_HELD_START_NS,
  // ORION_HELD_COMPUTE_START_NS: what a timed kernel on an idle, a queued or a held stream (a
  // compute kernel's apart) starts later than an event (sample_timing.h; each at most 100 us).
  StartLatency start_latency;
  uint64_t lazy_poll_ns = kDefaultLazyPollNs;  // ORION_LAZY_POLL_MS
  bool lazy_poll_set = false;                   // ORION_LAZY_POLL_MS was given (and valid)
  // Not from the environment: read at start (cpu_limits.h). The CPUs the process may use
  // (affinity, cgroup quota) in thousandths, and the most the gate may spin before it sleeps.
  uint32_t usable_millicpus = UINT32_MAX;
  uint64_t gate_spin_cap_ns = contract::kMaxSpinNs;
  // On unless ORION_GEMM_SPLIT=0: a best-effort client's cuBLAS GEMMs of over a millisecond run
  // as pieces no longer than the GPU's budget while a high-priority client shares it
  // (gemm_split.h, hooks_blas.cc).
  bool gemm_split = true;
  // ORION_GEMM_SPLIT_NS: pieces no longer than this whatever shares the GPU (10 us to 100 ms;
  // benchmarks and tests: what the split costs a trainer alone, whether pieces add up to the
  // whole). 0: the budget decides.
  uint64_t gemm_split_force_ns = 0;
  // How long after a process first cut a GEMM its hold keeper still opens gpu_hold between
  // graphs, so that the waits it queued on that word before drain (gpu_hold.h, KeeperMayOpen):
  // 5 s, far longer than a trainer queues ahead; ORION_GPU_HOLD_DRAIN_MS (1 ms to 60 s) for tests.
  uint64_t hold_drain_ns = 5'000'000'000;
};

// The direction of a copy from where its two ends live (device memory, managed memory and arrays
// count as the device's; anything the driver does not know is pageable host memory).
inline contract::CopyDirection CopyDirectionOf(bool dst_on_device, bool src_on_device) {
  using contract::CopyDirection;
  if (dst_on_device) {
    return src_on_device ? CopyDirection::kDeviceToDevice : CopyDirection::kHostToDevice;
  }
  return src_on_device ? CopyDirection::kDeviceToHost : CopyDirection::kHostToHost;
}

// getenv_fn is injected so tests need not touch the process environment.
template <typename GetEnv>
EnvConfig ReadEnvConfig(GetEnv getenv_fn) {
  EnvConfig config;
  config.disabled = ParseFlag(getenv_fn(contract::kEnvDisable));
  config.quiet = ParseFlag(getenv_fn(contract::kEnvQuiet));
  config.profile = ParseFlag(getenv_fn("ORION_PROFILE"));
  config.no_timing = ParseFlag(getenv_fn("ORION_NO_TIMING"));
  // A blocking launch waits for its stream, which the hold keeps waiting for the launch.
  config.timing_hold = !ParseFlagOff(getenv_fn("ORION_TIMING_HOLD")) &&
                       !ParseFlag(getenv_fn("CUDA_LAUNCH_BLOCKING"));
  config.requested_priority = ParsePriority(getenv_fn(contract::kEnvPriority));
  uint64_t value = 0;
  if (ParseByteSize(getenv_fn(contract::kEnvMemoryLimit), &value)) {
    config.requested_memory_limit = value;
  }
  if (ParseUnsigned(getenv_fn(contract::kEnvLatencyTargetMs), &value) &&
      value <= UINT64_MAX / 1000) {
    config.requested_latency_target_us = value * 1000;
  }
  if (const char* job = getenv_fn(contract::kEnvJob); job != nullptr) {
    CopyTruncated(config.requested_job, sizeof(config.requested_job), job);
  }
  const char* socket = getenv_fn(contract::kEnvSocket);
  CopyTruncated(config.socket_path, sizeof(config.socket_path),
                (socket != nullptr && socket[0] != '\0') ? socket : contract::kDefaultSocketPath);
  const char* log_dir = getenv_fn(contract::kEnvLogDir);
  if (log_dir != nullptr) CopyTruncated(config.log_dir, sizeof(config.log_dir), log_dir);
  const char* timing_log = getenv_fn(contract::kEnvTimingLog);
  if (timing_log != nullptr) {
    CopyTruncated(config.timing_log_dir, sizeof(config.timing_log_dir), timing_log);
  }
  if (ParseUnsigned(getenv_fn(contract::kEnvNvtxDepth), &value) && value <= 16) {
    config.nvtx_depth = static_cast<uint32_t>(value);
  }
  if (ParseUnsigned(getenv_fn(contract::kEnvKernelStartNs), &value) && value <= 100'000) {
    config.start_latency.idle_ns = value;
  }
  if (ParseUnsigned(getenv_fn(contract::kEnvQueuedStartNs), &value) && value <= 100'000) {
    config.start_latency.queued_ns = value;
  }
  if (ParseUnsigned(getenv_fn("ORION_HELD_START_NS"), &value) && value <= 100'000) {
    config.start_latency.held_ns = value;
  }
  if (ParseUnsigned(getenv_fn("ORION_HELD_COMPUTE_START_NS"), &value) && value <= 100'000) {
    config.start_latency.held_compute_ns = value;
  }
  for (auto [name, every] : {std::pair{"ORION_SAMPLE_EVERY", &config.sample_every},
                             std::pair{"ORION_SAMPLE_EVERY_HIGH", &config.sample_every_high}}) {
    if (ParseUnsigned(getenv_fn(name), &value) && value >= 1 && value <= 4096 &&
        (value & (value - 1)) == 0) {
      *every = static_cast<uint32_t>(value);
    }
  }
  config.gemm_split = !ParseFlagOff(getenv_fn("ORION_GEMM_SPLIT"));
  if (ParseUnsigned(getenv_fn("ORION_GEMM_SPLIT_NS"), &value) && value >= 10'000 &&
      value <= 100'000'000) {
    config.gemm_split_force_ns = value;
  }
  if (ParseUnsigned(getenv_fn("ORION_GPU_HOLD_DRAIN_MS"), &value) && value >= 1 &&
      value <= 60'000) {
    config.hold_drain_ns = value * 1'000'000;
  }
  if (ParseUnsigned(getenv_fn(contract::kEnvLazyPollMs), &value) && value >= 1 && value <= 1000) {
    config.lazy_poll_ns = value * 1'000'000;
    config.lazy_poll_set = true;
  }
  return config;
}

// The lazy period for a process that may use `usable_millicpus` (cpu_limits.h): what
// ORION_LAZY_POLL_MS said, else kFewCpusLazyPollNs below two CPUs and kDefaultLazyPollNs
// otherwise.
inline uint64_t LazyPollNsFor(const EnvConfig& config, uint32_t usable_millicpus) {
  if (config.lazy_poll_set) return config.lazy_poll_ns;
  return usable_millicpus < kFewCpusBelowMilliCpus ? kFewCpusLazyPollNs : kDefaultLazyPollNs;
}

}  // namespace orion::interpose
