// Splitting a long GEMM into pieces over its output, so that no piece runs longer than a bound:
// the arithmetic of hooks_blas.cc, pure (unit-tested without a GPU).
//
// cuBLAS is column-major: D (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C.
//  - A slice of D's columns [s, s + w) takes op(B)'s columns [s, s + w) and all of op(A):
//    B moves s * ldb elements where op(B) = B (B is k x n), s elements where op(B) = B^T;
//    C and D move s * ldc (ldd) elements. A bias (one value per row of D) stays as it is.
//  - A slice of D's rows [s, s + w) takes op(A)'s rows [s, s + w) and all of op(B):
//    A moves s elements where op(A) = A (A is m x k), s * lda elements where op(A) = A^T;
//    C and D move s elements.
// Every element of D is computed from the same row of op(A) and column of op(B), over K in the
// same order: where the same algorithm runs, a slice's elements equal the unsplit call's bit for
// bit. A batched call keeps its strides: every matrix of the batch is sliced alike.
//
// Usage:
//   GemmPlan plan = PlanGemmSplit(m, n, estimate_ns, bound_ns, /*rows_allowed=*/true);
//   bool failed = false;
//   status = RunGemmPlan(plan, m, n, /*redo_whole=*/C apart from D, kSuccess,
//       [&](const GemmSlice& s) {  // s.m x s.n of D from s.start on the plan's axis
//         GemmShift d = ShiftOf(operands, plan.axis, s.start);  // byte offsets of A, B, C, D
//         return call with s.m, s.n and the moved pointers;
//       },
//       [&] { return the whole call; }, &failed);
#pragma once

#include <stdint.h>

namespace orion::interpose {

// At most this many pieces: beyond it a piece's launch and its partial last wave cost more than
// the wait it saves.
inline constexpr uint32_t kMaxGemmPieces = 16;
// A slice starts on a multiple of this many columns (rows): every pointer moves by a multiple of
// 128 elements, so the pieces keep the alignment class of the whole call, and whole tiles.
inline constexpr int64_t kGemmSliceGranule = 128;
// No piece is asked to be shorter than this: shorter pieces run at a poor fraction of the GPU.
inline constexpr uint64_t kMinGemmPieceNs = 100'000;
// Beside a high-priority client a call is cut only where it runs longer than this, whatever the
// bound on its pieces: a process that cut a GEMM is held at the gate on the CPU from then on
// (gpu_hold.h), which costs a trainer whose GEMMs all end within a millisecond more than the
// pieces save its neighbour (H200, the padded-vocabulary LM beside a ResNet50 graph service: cut
// at the 250 us budget, harvest 0.77 to 0.63 and p50 1.23x to 1.27x), while the kernels that
// cost a service its tail run 2 to 4 ms (docs/benchmarks.md, "A trainer's long GEMMs in pieces").
inline constexpr uint64_t kMinCutGemmNs = 1'000'000;
// A call with fewer floating-point operations than the bound times this rate (20 TFLOP/s, far
// below what any tensor core runs a GEMM at) ends within the bound: it is never looked at.
inline constexpr uint64_t kSureFlopsPerNs = 20'000;

enum class GemmAxis : uint8_t { kNone, kColumns, kRows };

struct GemmPlan {
  GemmAxis axis = GemmAxis::kNone;
  uint32_t pieces = 1;
  int64_t width = 0;  // columns (rows) of every piece but the last; a multiple of the granule
};

// The pieces for a call of m x n output predicted to run `estimate_ns`, each predicted to run
// within `bound_ns` where the granule and kMaxGemmPieces allow (the work taken as even over the
// cut axis): the widest multiple of the granule that fits the bound, widened where that would
// take more than kMaxGemmPieces pieces. Columns are cut first (a bias stays whole); rows where
// `rows_allowed` and the columns are narrower than the rows. No plan (kNone) when the call fits
// the bound or cannot be cut in two.
inline GemmPlan PlanGemmSplit(int64_t m, int64_t n, uint64_t estimate_ns, uint64_t bound_ns,
                              bool rows_allowed) {
  GemmPlan plan;
  if (bound_ns == 0 || estimate_ns <= bound_ns || m <= 0 || n <= 0) return plan;
  const uint64_t wanted = (estimate_ns + bound_ns - 1) / bound_ns;
  auto slots = [](int64_t extent) { return static_cast<uint64_t>(extent / kGemmSliceGranule); };
  const bool rows = rows_allowed && slots(n) < wanted && slots(m) > slots(n);
  const int64_t extent = rows ? m : n;
  if (slots(extent) < 2) return plan;
  const double fit = static_cast<double>(extent) * static_cast<double>(bound_ns) /
                     static_cast<double>(estimate_ns);
  int64_t width = static_cast<int64_t>(fit) / kGemmSliceGranule * kGemmSliceGranule;
  if (width < kGemmSliceGranule) width = kGemmSliceGranule;
  const int64_t per_cap = (extent + kMaxGemmPieces - 1) / kMaxGemmPieces;
  const int64_t least = (per_cap + kGemmSliceGranule - 1) / kGemmSliceGranule * kGemmSliceGranule;
  if (width < least) width = least;
  const int64_t pieces = (extent + width - 1) / width;
  if (pieces < 2) return plan;
  plan.axis = rows ? GemmAxis::kRows : GemmAxis::kColumns;
  plan.pieces = static_cast<uint32_t>(pieces);
  plan.width = width;
  return plan;
}

// Piece `index` of a plan: where it starts on the cut axis and its m and n.
struct GemmSlice {
  int64_t start = 0;
  int64_t m = 0;
  int64_t n = 0;
};

inline GemmSlice SliceOf(const GemmPlan& plan, uint32_t index, int64_t m, int64_t n) {
  const int64_t extent = plan.axis == GemmAxis::kRows ? m : n;
  GemmSlice s;
  s.start = plan.width * index;
  const int64_t rest = extent - s.start;
  const int64_t width = rest < plan.width ? rest : plan.width;
  s.m = plan.axis == GemmAxis::kRows ? width : m;
  s.n = plan.axis == GemmAxis::kRows ? n : width;
  return s;
}

// D's slice [start, end) on the plan's axis (rows or columns), the other extent whole.
inline GemmSlice SliceBetween(const GemmPlan& plan, int64_t start, int64_t end, int64_t m,
                              int64_t n) {
  GemmSlice s;
  s.start = start;
  s.m = plan.axis == GemmAxis::kRows ? end - start : m;
  s.n = plan.axis == GemmAxis::kRows ? n : end - start;
  return s;
}

// Runs a plan's pieces through `piece(slice)` (each returns `ok` or an error) in the order, and
// with the recovery, that keep D whole where a piece fails and the call reads D as C (in place):
//  - a last piece narrower than the others (an odd width, the likeliest one for a library to
//    refuse) goes first;
//  - the first piece that runs fails: nothing is written, the call goes whole (`whole()`);
//  - a later one fails: where C is apart from D (`redo_whole`) the call goes whole again; in
//    place, the part of D not yet written goes as one call, and the caller sees its status.
//    Where that part is the failed piece alone, or that call fails too, the caller sees the
//    error with D part written: in place, no C is left to compute the written part again from.
// *failed is set where any piece failed (the caller stops cutting the shape).
template <typename Status, typename Piece, typename Whole>
Status RunGemmPlan(const GemmPlan& plan, int64_t m, int64_t n, bool redo_whole, Status ok,
                   Piece piece, Whole whole, bool* failed) {
  const int64_t extent = plan.axis == GemmAxis::kRows ? m : n;
  const uint32_t last = plan.pieces - 1;
  const bool tail_first = SliceOf(plan, last, m, n).start + plan.width > extent;
  // Where the pieces that run in order end: before the tail where it went first.
  const int64_t end = tail_first ? plan.width * last : extent;
  for (uint32_t run = 0; run < plan.pieces; ++run) {
    const uint32_t index = tail_first ? (run == 0 ? last : run - 1) : run;
    const GemmSlice slice = SliceOf(plan, index, m, n);
    const Status status = piece(slice);
    if (status == ok) continue;
    *failed = true;
    if (run == 0 || redo_whole) return whole();
    if (slice.start + plan.width >= end) return status;  // the rest is this piece: it failed
    return piece(SliceBetween(plan, slice.start, end, m, n));
  }
  return ok;
}

// The operands of a call as slicing sees them: leading dimensions, whether op(A) and op(B)
// transpose, and the size of an element of each matrix in bytes.
struct GemmOperands {
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;
  bool a_transposed = false, b_transposed = false;
  uint32_t a_bytes = 0, b_bytes = 0, c_bytes = 0, d_bytes = 0;
};

// How far each pointer moves, in bytes, for a slice starting at `start` on `axis`.
struct GemmShift {
  uint64_t a = 0, b = 0, c = 0, d = 0;
};

inline GemmShift ShiftOf(const GemmOperands& op, GemmAxis axis, int64_t start) {
  GemmShift shift;
  const auto s = static_cast<uint64_t>(start);
  if (axis == GemmAxis::kColumns) {
    shift.b = s * (op.b_transposed ? 1 : static_cast<uint64_t>(op.ldb)) * op.b_bytes;
    shift.c = s * static_cast<uint64_t>(op.ldc) * op.c_bytes;
    shift.d = s * static_cast<uint64_t>(op.ldd) * op.d_bytes;
  } else if (axis == GemmAxis::kRows) {
    shift.a = s * (op.a_transposed ? static_cast<uint64_t>(op.lda) : 1) * op.a_bytes;
    shift.c = s * op.c_bytes;
    shift.d = s * op.d_bytes;
  }
  return shift;
}

// Bytes of one element of a cudaDataType (library_types.h values), 0 for a type not sliced:
// real 8/16/32/64-bit floats and integers, complex 16/32/64-bit floats.
inline uint32_t ElementBytes(int data_type) {
  switch (data_type) {
    case 0: return 4;    // CUDA_R_32F
    case 1: return 8;    // CUDA_R_64F
    case 2: return 2;    // CUDA_R_16F
    case 3: return 1;    // CUDA_R_8I
    case 4: return 8;    // CUDA_C_32F
    case 5: return 16;   // CUDA_C_64F
    case 6: return 4;    // CUDA_C_16F
    case 8: return 1;    // CUDA_R_8U
    case 10: return 4;   // CUDA_R_32I
    case 14: return 2;   // CUDA_R_16BF
    case 28: return 1;   // CUDA_R_8F_E4M3
    case 29: return 1;   // CUDA_R_8F_E5M2
    default: return 0;
  }
}

// The bound on a best-effort client's pieces now, 0 for none (the call goes whole): forced by
// the environment (benchmarks, tests), or the GPU's best-effort budget (at least
// kMinGemmPieceNs) while the split is on (ORION_GEMM_SPLIT not 0), the gate is on, a
// high-priority client shares the GPU and the process is no rank of a multi-GPU job.
struct GemmSplitView {
  uint64_t forced_ns = 0;  // ORION_GEMM_SPLIT_NS
  bool enabled = true;     // ORION_GEMM_SPLIT not off
  bool registered = false;
  bool best_effort = false;
  bool gate_on = false;  // the GPU's gate mode is not pass-through
  bool high_present = false;
  // A rank of a multi-GPU job (it launched a collective): its GEMMs go whole. The pieces are not
  // measured beside a job's collectives yet, and a default is measured on every shape it runs on.
  bool job_rank = false;
  uint64_t budget_ns = 0;
};

inline uint64_t GemmSplitBoundNs(const GemmSplitView& v) {
  if (v.forced_ns != 0) return v.forced_ns;
  if (!v.enabled || !v.registered || !v.best_effort || !v.gate_on || !v.high_present ||
      v.job_rank) {
    return 0;
  }
  return v.budget_ns > kMinGemmPieceNs ? v.budget_ns : kMinGemmPieceNs;
}

// The least duration of a call that is cut, for pieces of `bound_ns`: the bound itself where it
// is forced (benchmarks, tests), else at least kMinCutGemmNs. 0 with no bound.
inline uint64_t GemmCutAboveNs(uint64_t bound_ns, bool forced) {
  if (bound_ns == 0 || forced) return bound_ns;
  return bound_ns > kMinCutGemmNs ? bound_ns : kMinCutGemmNs;
}

// Whether a call is worth looking at: more work than the GPU surely ends within the bound.
inline bool GemmMayExceed(int64_t m, int64_t n, int64_t k, int64_t batch, uint64_t bound_ns) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return false;
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                       static_cast<double>(k) * static_cast<double>(batch);
  return flops >= static_cast<double>(bound_ns) * static_cast<double>(kSureFlopsPerNs);
}

// A shape's duration: the least of its last kGemmSamples timed calls (a call timed while the
// gate held it, or beside another process's time slice, only reads longer). Its calls are timed
// until kGemmWarmupCalls samples are in (a caller that does not wait for its calls finds the
// last one's end not reached yet, so that is not always its first calls), then 1 in
// kGemmResampleEvery.
inline constexpr uint32_t kGemmSamples = 4;
inline constexpr uint32_t kGemmWarmupCalls = 3;
inline constexpr uint32_t kGemmResampleEvery = 16;

inline bool GemmCallTimed(uint64_t call_index, uint32_t samples) {
  return samples < kGemmWarmupCalls || call_index % kGemmResampleEvery == 0;
}

struct GemmDuration {
  uint64_t samples[kGemmSamples] = {};
  uint32_t count = 0;  // samples taken (the ring holds the last kGemmSamples)
  uint64_t least = 0;  // the least sample of them all, 0 before the first

  void Add(uint64_t ns) {
    samples[count++ % kGemmSamples] = ns;
    if (least == 0 || ns < least) least = ns;
  }
  // 0 until a sample is in.
  uint64_t EstimateNs() const {
    const uint32_t n = count < kGemmSamples ? count : kGemmSamples;
    uint64_t least = 0;
    for (uint32_t i = 0; i < n; ++i) {
      if (least == 0 || samples[i] < least) least = samples[i];
    }
    return least;
  }
};

// Whether calls of a shape timed `d` are cut, above `cut_above_ns` (GemmCutAboveNs): once
// kGemmWarmupCalls samples are in, and where the least of them all runs longer. A sample reads
// longer than the call, never shorter (the service's time slices beside it), so the least is the
// call's own length: a shape that ran under the floor once stays whole (a process that cut one
// GEMM is held on the CPU from then on). The pieces follow the last samples (EstimateNs).
inline bool GemmShapeCut(const GemmDuration& d, uint64_t cut_above_ns) {
  return cut_above_ns != 0 && d.count >= kGemmWarmupCalls && d.least > cut_above_ns;
}

}  // namespace orion::interpose
