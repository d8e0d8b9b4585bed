// Shared plumbing of the driver-API sample workloads (orion-sample-infer, -train, -alloc):
// CUresult checking that names the failing call, a small --flag parser, the device-0 primary
// context with the orion_spin kernel loaded, and latency percentiles.
//
// The samples link against libcuda.so.1 by SONAME only, so the same binary runs on a real GPU
// and, with LD_LIBRARY_PATH pointing at the test double, on machines without one.
//
// Usage:
//   orion::samples::Gpu gpu = orion::samples::OpenGpu();
//   ORION_CHECK_CU(cuLaunchKernel(gpu.spin, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
#pragma once

#include <cuda.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cctype>
#include <string>
#include <vector>

#include "samples/spin_kernel.h"

namespace orion::samples {

inline const char* ResultName(CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) return "CUDA_ERROR_?";
  return name;
}

// Exits with a message naming the call; samples are programs, not libraries, so dying loudly
// on the first driver error is the useful behaviour.
inline void CheckCu(CUresult result, const char* call, const char* file, int line) {
  if (result == CUDA_SUCCESS) return;
  fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", file, line, call, ResultName(result),
          static_cast<int>(result));
  exit(2);
}

#define ORION_CHECK_CU(call) ::orion::samples::CheckCu((call), #call, __FILE__, __LINE__)

inline uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline void SleepUntilNs(uint64_t deadline_ns) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(deadline_ns / 1'000'000'000ull);
  ts.tv_nsec = static_cast<long>(deadline_ns % 1'000'000'000ull);
  while (NowNs() < deadline_ns &&
         clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// "--name value" flags. Each program declares its flags, then Parse() fills them or prints the
// usage and exits 1 on anything unknown or malformed.
class Flags {
 public:
  Flags(const char* program, const char* summary) : program_(program), summary_(summary) {}

  void AddDouble(const char* name, double* value, const char* help) {
    specs_.push_back({name, help, Spec::kDouble, value});
  }
  void AddInt(const char* name, int64_t* value, const char* help) {
    specs_.push_back({name, help, Spec::kInt, value});
  }
  void AddBytes(const char* name, uint64_t* value, const char* help) {
    specs_.push_back({name, help, Spec::kBytes, value});
  }
  void AddBool(const char* name, bool* value, const char* help) {
    specs_.push_back({name, help, Spec::kBool, value});
  }
  // A PTX identifier's characters only (letters, digits, '_', '$').
  void AddString(const char* name, std::string* value, const char* help) {
    specs_.push_back({name, help, Spec::kIdentifier, value});
  }

  void Parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "-h" || arg == "--help") Usage(0, nullptr);
      const Spec* spec = Find(arg);
      if (spec == nullptr) Usage(1, ("unknown flag " + arg).c_str());
      if (spec->type == Spec::kBool) {
        *static_cast<bool*>(spec->value) = true;
        continue;
      }
      if (i + 1 >= argc) Usage(1, ("missing value for " + arg).c_str());
      if (!Assign(*spec, argv[++i])) {
        Usage(1, ("bad value '" + std::string(argv[i]) + "' for " + arg).c_str());
      }
    }
  }

  [[noreturn]] void Usage(int status, const char* problem) const {
    FILE* out = status == 0 ? stdout : stderr;
    if (problem != nullptr) fprintf(out, "%s: %s\n", program_, problem);
    fprintf(out, "usage: %s [flags]\n  %s\n", program_, summary_);
    for (const Spec& spec : specs_) fprintf(out, "  --%-10s %s\n", spec.name, spec.help);
    exit(status);
  }

  // "256Mi", "1Gi", "4096": bytes with optional binary or decimal suffix.
  static bool ParseBytes(const char* text, uint64_t* bytes) {
    char* end = nullptr;
    errno = 0;
    const double value = strtod(text, &end);
    if (errno != 0 || end == text || value < 0) return false;
    const std::string suffix(end);
    struct Unit {
      const char* suffix;
      double scale;
    };
    static constexpr Unit kUnits[] = {
        {"", 1},    {"Ki", 1024.0}, {"Mi", 1024.0 * 1024}, {"Gi", 1024.0 * 1024 * 1024}, {"K", 1e3},
        {"M", 1e6}, {"G", 1e9}};
    double unit = 0;
    for (const Unit& u : kUnits) {
      if (suffix == u.suffix) unit = u.scale;
    }
    if (unit == 0) return false;
    *bytes = static_cast<uint64_t>(value * unit);
    return true;
  }

 private:
  struct Spec {
    enum Type { kDouble, kInt, kBytes, kBool, kIdentifier };
    const char* name;
    const char* help;
    Type type;
    void* value;
  };

  const Spec* Find(const std::string& arg) const {
    if (arg.rfind("--", 0) != 0) return nullptr;
    for (const Spec& spec : specs_) {
      if (arg.compare(2, std::string::npos, spec.name) == 0) return &spec;
    }
    return nullptr;
  }

  static bool Assign(const Spec& spec, const char* text) {
    char* end = nullptr;
    errno = 0;
    switch (spec.type) {
      case Spec::kDouble: {
        const double v = strtod(text, &end);
        if (errno != 0 || end == text || *end != '\0' || v < 0) return false;
        *static_cast<double*>(spec.value) = v;
        return true;
      }
      case Spec::kInt: {
        const long long v = strtoll(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0' || v < 0) return false;
        *static_cast<int64_t*>(spec.value) = v;
        return true;
      }
      case Spec::kBytes:
        return ParseBytes(text, static_cast<uint64_t*>(spec.value));
      case Spec::kBool:
        return true;
      case Spec::kIdentifier: {
        for (const char* c = text; *c != '\0'; ++c) {
          if (!isalnum(static_cast<unsigned char>(*c)) && *c != '_' && *c != '$') return false;
        }
        *static_cast<std::string*>(spec.value) = text;
        return true;
      }
    }
    return false;
  }

  const char* program_;
  const char* summary_;
  std::vector<Spec> specs_;
};

// Device `ordinal` (0 unless a rank of several is given its own), its primary context current on
// the calling thread, and orion_spin loaded.
struct Gpu {
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;
  CUfunction spin = nullptr;
  char name[128] = {};
};

inline Gpu OpenGpu(int ordinal = 0) {
  Gpu gpu;
  ORION_CHECK_CU(cuInit(0));
  ORION_CHECK_CU(cuDeviceGet(&gpu.device, ordinal));
  ORION_CHECK_CU(cuDeviceGetName(gpu.name, sizeof(gpu.name), gpu.device));
  ORION_CHECK_CU(cuDevicePrimaryCtxRetain(&gpu.context, gpu.device));
  ORION_CHECK_CU(cuCtxSetCurrent(gpu.context));
  ORION_CHECK_CU(cuModuleLoadData(&gpu.module, kSpinKernelPtx));
  ORION_CHECK_CU(cuModuleGetFunction(&gpu.spin, gpu.module, kSpinKernelName));
  return gpu;
}

// orion_spin loaded again under the name `prefix` + "orion_spin" (a second module; the PTX's
// entry renamed), e.g. to launch a kernel named like a collective. Null prefix: gpu.spin.
inline CUfunction SpinNamed(Gpu& gpu, const std::string& prefix, CUmodule* module) {
  if (prefix.empty()) return gpu.spin;
  std::string ptx = kSpinKernelPtx;
  const std::string from = kSpinKernelName, to = prefix + kSpinKernelName;
  for (size_t at = ptx.find(from); at != std::string::npos; at = ptx.find(from, at + to.size())) {
    ptx.replace(at, from.size(), to);
  }
  CUfunction f = nullptr;
  ORION_CHECK_CU(cuModuleLoadData(module, ptx.c_str()));
  ORION_CHECK_CU(cuModuleGetFunction(&f, *module, to.c_str()));
  return f;
}

inline void CloseGpu(Gpu& gpu) {
  ORION_CHECK_CU(cuModuleUnload(gpu.module));
  ORION_CHECK_CU(cuDevicePrimaryCtxRelease(gpu.device));
}

// Launches one orion_spin (or `f`, a renamed one) of `ns` nanoseconds with `blocks` blocks of
// 32 threads.
inline void LaunchSpin(const Gpu& gpu, CUstream stream, uint64_t ns, unsigned int blocks,
                       CUfunction f = nullptr) {
  unsigned long long arg = ns;
  void* args[] = {&arg};
  ORION_CHECK_CU(cuLaunchKernel(f != nullptr ? f : gpu.spin, blocks, 1, 1, 32, 1, 1, 0, stream,
                                args, nullptr));
}

// Nearest-rank percentile (q in [0, 1]) of an unsorted sample; 0 when empty.
inline double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  if (rank < 1) rank = 1;
  if (rank > values.size()) rank = values.size();
  return values[rank - 1];
}

}  // namespace orion::samples
