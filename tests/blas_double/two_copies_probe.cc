// orion_blas_two_copies_probe: two copies of the cuBLAS test double in one process, each caller
// bound to its own, as a framework's cuBLAS in the global scope beside an extension module's
// own cuBLAS opened with RTLD_LOCAL (their symbols versioned apart: cublasGemmEx@@libcublas.so.13
// and @@libcublas.so.12).
//
// The probe is linked against copy A (liborion_blas_double_a.so, version node ORION_BLAS_A), so
// copy A is in the global scope. It calls cublasGemmEx itself (bound to A), then opens
// liborion_blas_caller_b.so (linked against copy B, ORION_BLAS_B) with RTLD_LOCAL and calls
// its orion_caller_b_gemm (cublasGemmEx from there, bound to B). Each copy keeps its own call log,
// read through its own orion_blas_double_take_calls (copy A's as ORION_BLAS_A in the global scope,
// copy B's as ORION_BLAS_B through the caller's handle). Every call is checked against both logs:
// its own copy received it (whole or in pieces), the other copy received nothing.
//
// One line per library and one per phase:
//
//   libs a=FILE b=FILE b_global=0|1
//   case=NAME owner=A|B|AB calls=N misrouted=X first_own=F last_own=L own_total=T
//     other_total=O cover=0|1 equal=0|1 right=0|1 max_err=E
//
// a, b: the files that define each copy's take function; b_global: copy B is (wrongly) visible
// in the global scope. Phases: "probe" (N calls from the probe: copy A's), "caller_b" (N calls
// from liborion_blas_caller_b.so: copy B's), "alternating" (2 rounds of one call each, A then B).
// misrouted: calls that their own copy did not receive or the other copy did; first_own,
// last_own: how many calls the own copy received for the phase's first and last call (more
// than one: the call ran in pieces); own_total, other_total: over the phase; cover: every call's
// pieces (own log) are the whole call's m and k and cover its n exactly; equal: every call's
// output is bitwise the phase's first; right: every output is within 1e-3 of a CPU reference in
// double precision and nothing past the output's m rows changed; max_err: the largest error.
//
// Usage: orion_blas_two_copies_probe CALLER_B_LIBRARY [calls]   (default 8)
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <stdlib.h>
#include <string.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "tests/blas_double/probe_common.h"

namespace blas = orion::interpose::blas;

namespace {

using orion::testing::Received;
using orion::testing::Take;
using orion::testing::TakeCallsFn;
using orion::testing::Values;

using CallerGemmFn = int (*)(CUstream, int, int, int, const float*, const float*, int,
                             const float*, int, const float*, float*, int);

// One shape for both callers: long enough for a forced bound of 20 us to cut it (more than
// 20,000 x 20,000 floating-point operations) into pieces of 128 columns.
constexpr int kM = 512, kN = 1024, kK = 512;
constexpr int kLda = kM + 3, kLdb = kK + 5, kLdc = kM + 9;
constexpr float kAlpha = 0.75f, kBeta = -0.5f;
constexpr double kTolerance = 1e-3;

// Whether the pieces in `log` are cublasGemmEx calls of the whole m and k that cover n exactly.
bool Covers(const Received& r) {
  std::istringstream lines(r.log);
  std::string api;
  long long m = 0, n = 0, k = 0, sum_n = 0;
  size_t count = 0;
  bool ok = true;
  while (lines >> api >> m >> n >> k) {
    ++count;
    ok = ok && api == "cublasGemmEx" && m == kM && k == kK && n > 0;
    sum_n += n;
  }
  return ok && count >= 1 && count == r.calls && sum_n == kN;
}

// Where a loaded object's segments lie (page-aligned), or size 0 when it is not loaded.
struct Extent {
  void* start = nullptr;
  size_t size = 0;
};

Extent ExtentOf(const char* base_name) {
  struct Look {
    const char* name;
    Extent found;
  } look{base_name, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* l = static_cast<Look*>(data);
        const char* path = info->dlpi_name;
        const char* slash = path != nullptr ? strrchr(path, '/') : nullptr;
        if (path == nullptr || strcmp(slash != nullptr ? slash + 1 : path, l->name) != 0) return 0;
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          lo = std::min<uintptr_t>(lo, info->dlpi_addr + ph.p_vaddr);
          hi = std::max<uintptr_t>(hi, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
        lo &= ~(page - 1);
        hi = (hi + page - 1) & ~(page - 1);
        if (hi > lo) l->found = {reinterpret_cast<void*>(lo), hi - lo};
        return 1;
      },
      &look);
  return look.found;
}

const char* FileOf(const void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "?";
  const char* slash = strrchr(info.dli_fname, '/');
  return slash != nullptr ? slash + 1 : info.dli_fname;
}

struct Probe {
  CUstream stream = nullptr;
  cublasHandle_t handle = nullptr;  // copy A's
  TakeCallsFn take_a = nullptr, take_b = nullptr;
  CallerGemmFn caller_b = nullptr;
  std::vector<float> a, b, initial, out;
  std::vector<double> reference;  // kLdc x kN; rows past kM unused

  // One call from `who` ('A': the probe itself, 'B': liborion_blas_caller_b.so).
  int Call(char who) {
    if (who == 'A') {
      return cublasGemmEx(handle, blas::kOpN, blas::kOpN, kM, kN, kK, &kAlpha, a.data(),
                          blas::kDataR32F, kLda, b.data(), blas::kDataR32F, kLdb, &kBeta,
                          out.data(), blas::kDataR32F, kLdc, /*CUBLAS_COMPUTE_32F=*/68,
                          /*CUBLAS_GEMM_DEFAULT=*/-1);
    }
    return caller_b(stream, kM, kN, kK, &kAlpha, a.data(), kLda, b.data(), kLdb, &kBeta,
                    out.data(), kLdc);
  }

  // The largest error against the reference, or infinity where a padding row changed.
  double Error() const {
    double worst = 0;
    for (int j = 0; j < kN; ++j) {
      for (int i = 0; i < kLdc; ++i) {
        const size_t at = static_cast<size_t>(i) + static_cast<size_t>(j) * kLdc;
        if (i >= kM) {
          if (memcmp(&out[at], &initial[at], sizeof(float)) != 0) return INFINITY;
          continue;
        }
        const double err = std::fabs(static_cast<double>(out[at]) - reference[at]);
        if (!(err <= worst)) worst = err;  // NaN stays the worst
      }
    }
    return worst;
  }

  // Opens liborion_blas_caller_b.so with RTLD_LOCAL and takes its entry point and copy B's log;
  // null (said on stderr) where any is missing.
  void* OpenCaller(const char* path) {
    void* caller = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (caller == nullptr) {
      fprintf(stderr, "probe: dlopen(%s): %s\n", path, dlerror());
      return nullptr;
    }
    caller_b = reinterpret_cast<CallerGemmFn>(dlsym(caller, "orion_caller_b_gemm"));
    take_b = reinterpret_cast<TakeCallsFn>(
        dlvsym(caller, "orion_blas_double_take_calls", "ORION_BLAS_B"));
    if (caller_b == nullptr || take_b == nullptr || take_b == take_a) {
      fprintf(stderr, "probe: the caller's entry point or copy B's log not found\n");
      return nullptr;
    }
    return caller;
  }

  void Phase(const char* name, const char* owner, const std::string& order) {
    size_t misrouted = 0, first_own = 0, last_own = 0, own_total = 0, other_total = 0;
    bool cover = true, equal = true;
    double max_err = 0;
    std::vector<float> first;
    for (size_t i = 0; i < order.size(); ++i) {
      const char who = order[i];
      out = initial;
      Take(take_a);
      Take(take_b);
      const int status = Call(who);
      if (status != 0) {
        fprintf(stderr, "probe: %s call %zu (%c) failed: %d\n", name, i, who, status);
        exit(1);
      }
      PROBE_CU(cuStreamSynchronize(stream));
      const Received got_a = Take(take_a), got_b = Take(take_b);
      const Received& own = who == 'A' ? got_a : got_b;
      const Received& other = who == 'A' ? got_b : got_a;
      if (own.calls == 0 || other.calls != 0) ++misrouted;
      if (i == 0) first_own = own.calls;
      last_own = own.calls;
      own_total += own.calls;
      other_total += other.calls;
      cover = cover && Covers(own);
      if (i == 0) {
        first = out;
      } else {
        equal = equal && memcmp(first.data(), out.data(), out.size() * sizeof(float)) == 0;
      }
      const double err = Error();
      if (!(err <= max_err)) max_err = err;
    }
    printf("case=%s owner=%s calls=%zu misrouted=%zu first_own=%zu last_own=%zu own_total=%zu "
           "other_total=%zu cover=%d equal=%d right=%d max_err=%.3g\n",
           name, owner, order.size(), misrouted, first_own, last_own, own_total, other_total,
           cover ? 1 : 0, equal ? 1 : 0, max_err <= kTolerance ? 1 : 0, max_err);
    fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CALLER_B_LIBRARY [calls]\n", argv[0]);
    return 2;
  }
  const char* caller_path = argv[1];
  const int calls = argc > 2 ? atoi(argv[2]) : 8;
  if (calls < 1) return 2;

  Probe p;
  // Copy A's log: its version node in the global scope (dlvsym: never the interposer's dlsym).
  p.take_a = reinterpret_cast<TakeCallsFn>(
      dlvsym(RTLD_DEFAULT, "orion_blas_double_take_calls", "ORION_BLAS_A"));
  if (p.take_a == nullptr) {
    fprintf(stderr, "probe: copy A's orion_blas_double_take_calls not found\n");
    return 1;
  }
  CUdevice device;
  CUcontext ctx;
  PROBE_CU(cuInit(0));
  PROBE_CU(cuDeviceGet(&device, 0));
  PROBE_CU(cuDevicePrimaryCtxRetain(&ctx, device));
  PROBE_CU(cuCtxSetCurrent(ctx));
  PROBE_CU(cuStreamCreate(&p.stream, CU_STREAM_NON_BLOCKING));
  if (cublasCreate_v2(&p.handle) != 0 || cublasSetStream_v2(p.handle, p.stream) != 0) {
    fprintf(stderr, "probe: copy A's handle failed\n");
    return 1;
  }

  p.a = Values(static_cast<size_t>(kLda) * kK, 1);
  p.b = Values(static_cast<size_t>(kLdb) * kN, 2);
  p.initial = Values(static_cast<size_t>(kLdc) * kN, 3);
  p.reference.assign(static_cast<size_t>(kLdc) * kN, 0.0);
  for (int j = 0; j < kN; ++j) {
    double* col = &p.reference[static_cast<size_t>(j) * kLdc];
    for (int q = 0; q < kK; ++q) {
      const double y = p.b[static_cast<size_t>(q) + static_cast<size_t>(j) * kLdb];
      const float* x = &p.a[static_cast<size_t>(q) * kLda];
      for (int i = 0; i < kM; ++i) col[i] += static_cast<double>(x[i]) * y;
    }
    for (int i = 0; i < kM; ++i) {
      col[i] = kAlpha * col[i] + kBeta * static_cast<double>(p.initial[i + j * kLdc]);
    }
  }

  // Until the caller is opened only copy A is loaded: the probe's own calls (copy B's log is
  // read as empty meanwhile).
  static TakeCallsFn nothing = [](char* buf, size_t size) -> size_t {
    if (buf != nullptr && size > 0) buf[0] = '\0';
    return 0;
  };
  p.take_b = nothing;
  p.Phase("probe", "A", std::string(static_cast<size_t>(calls), 'A'));

  void* caller = p.OpenCaller(caller_path);
  if (caller == nullptr) return 1;
  const bool b_global =
      dlvsym(RTLD_DEFAULT, "orion_blas_double_take_calls", "ORION_BLAS_B") != nullptr;
  printf("libs a=%s b=%s b_global=%d\n", FileOf(reinterpret_cast<void*>(p.take_a)),
         FileOf(reinterpret_cast<void*>(p.take_b)), b_global ? 1 : 0);
  fflush(stdout);

  p.Phase("caller_b", "B", std::string(static_cast<size_t>(calls), 'B'));
  p.Phase("alternating", "AB", "ABAB");

  // The caller and its copy unloaded, then loaded again: the caller where it was, its cuBLAS
  // copy elsewhere (its old place taken by an inaccessible mapping). A function resolved for a
  // call site before the unload now points into that mapping.
  Dl_info caller_info{};
  if (dladdr(reinterpret_cast<void*>(p.caller_b), &caller_info) == 0) return 1;
  const Extent old_b = ExtentOf("liborion_blas_double_b.so");
  dlclose(caller);
  const bool b_unloaded = ExtentOf("liborion_blas_double_b.so").size == 0;
  void* blocked = old_b.size == 0 ? MAP_FAILED
                                  : mmap(old_b.start, old_b.size, PROT_NONE,
                                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  caller = p.OpenCaller(caller_path);
  Dl_info again{};
  if (caller == nullptr || dladdr(reinterpret_cast<void*>(p.caller_b), &again) == 0) return 1;
  printf("reload b_unloaded=%d blocked=%d caller_same=%d b_moved=%d\n", b_unloaded ? 1 : 0,
         blocked == old_b.start ? 1 : 0, again.dli_fbase == caller_info.dli_fbase ? 1 : 0,
         ExtentOf("liborion_blas_double_b.so").start != old_b.start ? 1 : 0);
  fflush(stdout);
  p.Phase("reloaded", "B", std::string(static_cast<size_t>(calls), 'B'));

  cublasDestroy_v2(p.handle);
  PROBE_CU(cuStreamDestroy(p.stream));
  return 0;
}
