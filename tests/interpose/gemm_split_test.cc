// Splitting a long GEMM into pieces over its output (interpose/gemm_split.h): the plan, the
// pieces' pointers checked against a CPU reference GEMM computed whole and in pieces (bit for
// bit, for every transposition, axis, batch and element type), the bound, the learned duration,
// and the environment that sets them.
#include "interpose/gemm_split.h"
#include "interpose/hooks_blas.h"

#include <gtest/gtest.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "interpose/env_config.h"

namespace orion::interpose {
namespace {

// ---- the plan ----------------------------------------------------------------------------------

constexpr uint64_t kBound = 100'000;

// The sum of the pieces' widths on the cut axis, checking that every piece is non-empty, starts
// where the one before ended and keeps the other extent whole.
int64_t CoveredExtent(const GemmPlan& plan, int64_t m, int64_t n) {
  int64_t covered = 0;
  for (uint32_t i = 0; i < plan.pieces; ++i) {
    const GemmSlice s = SliceOf(plan, i, m, n);
    EXPECT_EQ(s.start, covered) << "piece " << i;
    const int64_t width = plan.axis == GemmAxis::kRows ? s.m : s.n;
    EXPECT_GT(width, 0) << "piece " << i;
    EXPECT_LE(width, plan.width) << "piece " << i;
    if (i + 1 < plan.pieces) {
      EXPECT_EQ(width, plan.width) << "piece " << i;
    }
    EXPECT_EQ(plan.axis == GemmAxis::kRows ? s.n : s.m, plan.axis == GemmAxis::kRows ? n : m);
    covered += width;
  }
  return covered;
}

TEST(PlanGemmSplitTest, NoPlanWhereTheCallFitsOrCannotBeCut) {
  EXPECT_EQ(PlanGemmSplit(4096, 4096, kBound, kBound, true).axis, GemmAxis::kNone);
  EXPECT_EQ(PlanGemmSplit(4096, 4096, kBound - 1, kBound, true).axis, GemmAxis::kNone);
  EXPECT_EQ(PlanGemmSplit(4096, 4096, 10 * kBound, 0, true).axis, GemmAxis::kNone);
  EXPECT_EQ(PlanGemmSplit(4096, 4096, 0, kBound, true).axis, GemmAxis::kNone);
  EXPECT_EQ(PlanGemmSplit(0, 4096, 10 * kBound, kBound, true).axis, GemmAxis::kNone);
  EXPECT_EQ(PlanGemmSplit(4096, 0, 10 * kBound, kBound, true).axis, GemmAxis::kNone);
  // Below two granules on both axes: nothing to cut.
  const GemmPlan small = PlanGemmSplit(2 * kGemmSliceGranule - 1, 2 * kGemmSliceGranule - 1,
                                       10 * kBound, kBound, true);
  EXPECT_EQ(small.axis, GemmAxis::kNone);
  EXPECT_EQ(small.pieces, 1u);
  // Narrow columns and rows not allowed (cuBLASLt): no plan however wide m is.
  EXPECT_EQ(PlanGemmSplit(1 << 16, 2 * kGemmSliceGranule - 1, 10 * kBound, kBound, false).axis,
            GemmAxis::kNone);
  // Just over the bound on exactly two granules: two pieces of one granule.
  const GemmPlan two = PlanGemmSplit(64, 2 * kGemmSliceGranule, kBound + 1, kBound, true);
  EXPECT_EQ(two.axis, GemmAxis::kColumns);
  EXPECT_EQ(two.pieces, 2u);
  EXPECT_EQ(two.width, kGemmSliceGranule);
}

TEST(PlanGemmSplitTest, PiecesAreTheEstimateOverTheBoundCapped) {
  // Extents that divide into the wanted pieces on the granule, the estimate exactly that many
  // bounds: that many pieces of the bound each.
  for (uint64_t wanted = 2; wanted <= kMaxGemmPieces; ++wanted) {
    const int64_t n = kGemmSliceGranule * 3 * static_cast<int64_t>(wanted);
    const GemmPlan plan = PlanGemmSplit(512, n, wanted * kBound, kBound, true);
    EXPECT_EQ(plan.axis, GemmAxis::kColumns) << wanted;
    EXPECT_EQ(plan.pieces, wanted) << wanted;
    EXPECT_EQ(plan.width, 3 * kGemmSliceGranule) << wanted;
  }
  // Any estimate: the widest multiple of the granule whose share of the estimate fits the bound
  // (unless the granule or the cap on pieces asks for wider).
  for (int64_t n : {1152, 512, 4096, 4099, 50257}) {
    for (uint64_t estimate : {2 * kBound + 1, 3 * kBound, 8 * kBound, 9 * kBound, 15 * kBound + 7}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " estimate " << estimate);
      const GemmPlan plan = PlanGemmSplit(512, n, estimate, kBound, true);
      ASSERT_EQ(plan.axis, GemmAxis::kColumns);
      const int64_t least =
          ((n + kMaxGemmPieces - 1) / kMaxGemmPieces + kGemmSliceGranule - 1) /
          kGemmSliceGranule * kGemmSliceGranule;
      const auto share = [&](int64_t width) {
        return static_cast<double>(width) * static_cast<double>(estimate) / static_cast<double>(n);
      };
      if (plan.width > kGemmSliceGranule && plan.width > least) {
        EXPECT_LE(share(plan.width), static_cast<double>(kBound));
        EXPECT_GT(share(plan.width + kGemmSliceGranule), static_cast<double>(kBound));
      }
      EXPECT_LE(plan.pieces, kMaxGemmPieces);
      EXPECT_EQ(CoveredExtent(plan, 512, n), n);
    }
  }
  // Far over the bound: kMaxGemmPieces, no more.
  const GemmPlan capped = PlanGemmSplit(512, 1 << 20, 1000 * kBound, kBound, true);
  EXPECT_EQ(capped.pieces, kMaxGemmPieces);
  EXPECT_EQ(CoveredExtent(capped, 512, 1 << 20), 1 << 20);
  // Fewer granules than wanted pieces: one granule a piece.
  const GemmPlan granules = PlanGemmSplit(512, 5 * kGemmSliceGranule, 50 * kBound, kBound, true);
  EXPECT_EQ(granules.axis, GemmAxis::kColumns);
  EXPECT_EQ(granules.pieces, 5u);
  EXPECT_EQ(granules.width, kGemmSliceGranule);
}

TEST(PlanGemmSplitTest, PiecesCoverTheExtentExactlyOnTheGranule) {
  for (int64_t n : {256, 257, 383, 1007, 1024, 2053, 4095, 100'003}) {
    for (uint64_t times : {2, 3, 5, 7, 16, 40}) {
      const GemmPlan plan = PlanGemmSplit(300, n, times * kBound, kBound, false);
      SCOPED_TRACE(testing::Message() << "n " << n << " estimate " << times << " bounds");
      ASSERT_EQ(plan.axis, GemmAxis::kColumns);
      EXPECT_GE(plan.pieces, 2u);
      EXPECT_LE(plan.pieces, kMaxGemmPieces);
      EXPECT_EQ(plan.width % kGemmSliceGranule, 0);
      EXPECT_GT(plan.width, 0);
      EXPECT_EQ(CoveredExtent(plan, 300, n), n);
      // The last piece is what is left, non-empty.
      const GemmSlice last = SliceOf(plan, plan.pieces - 1, 300, n);
      EXPECT_EQ(last.start + last.n, n);
      EXPECT_GT(last.n, 0);
    }
  }
}

TEST(PlanGemmSplitTest, ColumnsFirstRowsWhereOnlyTheyDivide) {
  // Both wide: columns, rows allowed or not.
  EXPECT_EQ(PlanGemmSplit(4096, 4096, 8 * kBound, kBound, true).axis, GemmAxis::kColumns);
  EXPECT_EQ(PlanGemmSplit(4096, 4096, 8 * kBound, kBound, false).axis, GemmAxis::kColumns);
  // Columns enough for the wanted pieces though rows are wider: columns.
  EXPECT_EQ(PlanGemmSplit(1 << 16, 8 * kGemmSliceGranule, 8 * kBound, kBound, true).axis,
            GemmAxis::kColumns);
  // n too narrow for the wanted pieces, m wide: rows where allowed.
  const GemmPlan rows = PlanGemmSplit(1007, 300, 5 * kBound, kBound, true);
  EXPECT_EQ(rows.axis, GemmAxis::kRows);
  EXPECT_EQ(rows.width % kGemmSliceGranule, 0);
  EXPECT_EQ(CoveredExtent(rows, 1007, 300), 1007);
  EXPECT_EQ(SliceOf(rows, 0, 1007, 300).n, 300);
  // ... and never where they are not: the narrow columns are cut as far as they go.
  const GemmPlan no_rows = PlanGemmSplit(1007, 300, 5 * kBound, kBound, false);
  EXPECT_EQ(no_rows.axis, GemmAxis::kColumns);
  EXPECT_EQ(no_rows.pieces, 3u);  // 128, 128 and the 44 left
  EXPECT_EQ(CoveredExtent(no_rows, 1007, 300), 300);
  // Narrow columns, rows no wider: columns.
  EXPECT_EQ(PlanGemmSplit(300, 300, 5 * kBound, kBound, true).axis, GemmAxis::kColumns);
}

// RunGemmPlan over a made-up plan: 3 pieces of 128 columns and a tail of 50 (434), or 4 of 128
// (512). Each piece writes its columns once; a piece may fail, writing nothing.
struct PlanRun {
  std::vector<int> writes;              // per column: how often a call wrote it
  std::vector<std::pair<int64_t, int64_t>> calls;  // (start, width) of each piece call, in order
  int whole = 0;
  bool failed = false;
  int status = 0;
};

PlanRun RunMadeUpPlan(int64_t n, bool redo_whole,
                      const std::function<bool(int64_t start, int64_t width, size_t call)>& fails,
                      GemmAxis axis = GemmAxis::kColumns) {
  GemmPlan plan;
  plan.axis = axis;
  plan.width = 128;
  plan.pieces = static_cast<uint32_t>((n + 127) / 128);
  const bool rows = axis == GemmAxis::kRows;
  PlanRun r;
  r.writes.assign(static_cast<size_t>(n), 0);
  r.status = RunGemmPlan(
      plan, rows ? n : 64, rows ? 64 : n, redo_whole, 0,
      [&](const GemmSlice& s) {
        const int64_t width = rows ? s.m : s.n;
        EXPECT_EQ(rows ? s.n : s.m, 64);
        r.calls.emplace_back(s.start, width);
        if (fails(s.start, width, r.calls.size())) return 7;
        for (int64_t c = s.start; c < s.start + width; ++c) ++r.writes[static_cast<size_t>(c)];
        return 0;
      },
      [&] {
        ++r.whole;
        for (int& w : r.writes) ++w;  // the whole call writes all of D once more
        return 0;
      },
      &r.failed);
  return r;
}

bool OnceEach(const std::vector<int>& writes) {
  return std::all_of(writes.begin(), writes.end(), [](int w) { return w == 1; });
}

TEST(RunGemmPlanTest, TheNarrowerTailGoesFirstThenThePiecesInOrder) {
  const PlanRun r = RunMadeUpPlan(434, false, [](int64_t, int64_t, size_t) { return false; });
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.failed);
  EXPECT_EQ(r.whole, 0);
  const std::vector<std::pair<int64_t, int64_t>> want = {{384, 50}, {0, 128}, {128, 128},
                                                         {256, 128}};
  EXPECT_EQ(r.calls, want);
  EXPECT_TRUE(OnceEach(r.writes));
  // Pieces all as wide: in order.
  const PlanRun even = RunMadeUpPlan(512, false, [](int64_t, int64_t, size_t) { return false; });
  EXPECT_EQ(even.calls.front(), (std::pair<int64_t, int64_t>{0, 128}));
  EXPECT_EQ(even.calls.back(), (std::pair<int64_t, int64_t>{384, 128}));
  // Rows: the same order over m.
  const PlanRun rows = RunMadeUpPlan(
      434, false, [](int64_t, int64_t, size_t) { return false; }, GemmAxis::kRows);
  EXPECT_EQ(rows.calls, want);
  EXPECT_TRUE(OnceEach(rows.writes));
}

TEST(RunGemmPlanTest, AWidthThatFailsFailsFirstAndTheCallGoesWhole) {
  // The tail's width fails (a library that cannot take it): it is the first to run, nothing of
  // D is written, the call goes whole, in place or not.
  for (bool redo_whole : {false, true}) {
    const PlanRun r = RunMadeUpPlan(434, redo_whole,
                                    [](int64_t, int64_t width, size_t) { return width < 64; });
    EXPECT_TRUE(r.failed);
    EXPECT_EQ(r.whole, 1);
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.calls.size(), 1u);
    EXPECT_TRUE(OnceEach(r.writes));
  }
}

TEST(RunGemmPlanTest, InPlaceALaterFailureSendsWhatIsNotWrittenAsOneCall) {
  // The second full piece fails after the tail and the first: the columns 128..383 go as one
  // call; every column is written once, from its own C.
  const PlanRun r = RunMadeUpPlan(
      434, false,
      [](int64_t start, int64_t width, size_t) { return start == 128 && width == 128; });
  EXPECT_TRUE(r.failed);
  EXPECT_EQ(r.whole, 0);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.calls.back(), (std::pair<int64_t, int64_t>{128, 256}));
  EXPECT_TRUE(OnceEach(r.writes));
  // Pieces all as wide, the third fails: 256..511 as one call.
  const PlanRun even = RunMadeUpPlan(
      512, false,
      [](int64_t start, int64_t width, size_t) { return start == 256 && width == 128; });
  EXPECT_EQ(even.calls.back(), (std::pair<int64_t, int64_t>{256, 256}));
  EXPECT_TRUE(OnceEach(even.writes));
  // Rows, in place, the first full piece fails: rows 0..383 as one call.
  const PlanRun rows = RunMadeUpPlan(
      434, false, [](int64_t start, int64_t width, size_t) { return start == 0 && width == 128; },
      GemmAxis::kRows);
  EXPECT_EQ(rows.calls.back(), (std::pair<int64_t, int64_t>{0, 384}));
  EXPECT_TRUE(OnceEach(rows.writes));
  // C apart from D: the call goes whole again instead (D written again whole from C).
  const PlanRun apart = RunMadeUpPlan(
      434, true, [](int64_t start, int64_t, size_t) { return start == 128; });
  EXPECT_EQ(apart.whole, 1);
  EXPECT_EQ(apart.calls.size(), 3u);
  EXPECT_EQ(apart.status, 0);
}

TEST(RunGemmPlanTest, InPlaceWhatCannotBeRedoneReturnsItsError) {
  // The rest fails too: its error is the caller's.
  const PlanRun rest = RunMadeUpPlan(
      434, false, [](int64_t start, int64_t, size_t) { return start == 128; });
  EXPECT_EQ(rest.status, 7);
  EXPECT_TRUE(rest.failed);
  EXPECT_EQ(rest.whole, 0);
  EXPECT_EQ(rest.calls.back(), (std::pair<int64_t, int64_t>{128, 256}));
  // The last full piece fails: the rest is that piece, not tried again.
  const PlanRun last = RunMadeUpPlan(
      434, false, [](int64_t start, int64_t, size_t) { return start == 256; });
  EXPECT_EQ(last.status, 7);
  EXPECT_EQ(last.calls.size(), 4u);
  EXPECT_EQ(last.whole, 0);
  // Two pieces, the full one fails after the tail: the same (D part written, the error).
  const PlanRun two = RunMadeUpPlan(
      200, false, [](int64_t, int64_t width, size_t) { return width == 128; });
  EXPECT_EQ(two.calls, (std::vector<std::pair<int64_t, int64_t>>{{128, 72}, {0, 128}}));
  EXPECT_EQ(two.status, 7);
  EXPECT_EQ(two.whole, 0);
}

TEST(ShiftOfTest, MovesWhatTheSliceTakes) {
  GemmOperands op;
  op.lda = 1000;
  op.ldb = 2000;
  op.ldc = 3000;
  op.ldd = 4000;
  op.a_bytes = 2;
  op.b_bytes = 2;
  op.c_bytes = 4;
  op.d_bytes = 8;
  GemmShift s = ShiftOf(op, GemmAxis::kColumns, 256);
  EXPECT_EQ(s.a, 0u);
  EXPECT_EQ(s.b, 256u * 2000 * 2);
  EXPECT_EQ(s.c, 256u * 3000 * 4);
  EXPECT_EQ(s.d, 256u * 4000 * 8);
  op.b_transposed = true;
  EXPECT_EQ(ShiftOf(op, GemmAxis::kColumns, 256).b, 256u * 2);
  s = ShiftOf(op, GemmAxis::kRows, 128);
  EXPECT_EQ(s.a, 128u * 2);
  EXPECT_EQ(s.b, 0u);
  EXPECT_EQ(s.c, 128u * 4);
  EXPECT_EQ(s.d, 128u * 8);
  op.a_transposed = true;
  EXPECT_EQ(ShiftOf(op, GemmAxis::kRows, 128).a, 128u * 1000 * 2);
  s = ShiftOf(op, GemmAxis::kNone, 128);
  EXPECT_EQ(s.a + s.b + s.c + s.d, 0u);
}

// ---- pieces against a CPU reference GEMM -------------------------------------------------------

enum class Dtype { kFloat, kBf16 };
constexpr int kCudaR32F = 0;
constexpr int kCudaR16BF = 14;

int DataTypeOf(Dtype t) { return t == Dtype::kFloat ? kCudaR32F : kCudaR16BF; }

uint32_t FloatBits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}
float FromBits(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof(v));
  return v;
}
// bfloat16 as 16-bit storage: the high half of a float, rounded to nearest even.
uint16_t ToBf16(float v) {
  const uint32_t u = FloatBits(v);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float FromBf16(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

float Load(const char* p, Dtype t) {
  if (t == Dtype::kFloat) {
    float v;
    memcpy(&v, p, sizeof(v));
    return v;
  }
  uint16_t h;
  memcpy(&h, p, sizeof(h));
  return FromBf16(h);
}
void Store(char* p, Dtype t, float v) {
  if (t == Dtype::kFloat) {
    memcpy(p, &v, sizeof(v));
    return;
  }
  const uint16_t h = ToBf16(v);
  memcpy(p, &h, sizeof(h));
}

float Gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}

// One call, column-major, as cuBLAS takes it: D = alpha * op(A) * op(B) + beta * C, then the
// epilogue (a bias per row of D, GELU). Leading dimensions and batch strides in elements;
// every matrix of one element type.
struct RefCall {
  Dtype type = Dtype::kFloat;
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const char* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const char* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  const char* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  char* d = nullptr;
  int64_t ldd = 0, stride_d = 0;
  int64_t batch = 1;
  const float* bias = nullptr;
  bool gelu = false;
};

// op(A) and op(B) are read into floats first (op(A) k-major, so that the sum over k runs for
// a column of D at once); every element still sums its k products in order.
void RefGemm(const RefCall& g) {
  const int64_t e = ElementBytes(DataTypeOf(g.type));
  std::vector<float> a_op(static_cast<size_t>(g.k * g.m)), acc(static_cast<size_t>(g.m));
  for (int64_t q = 0; q < g.batch; ++q) {
    const char* a = g.a + q * g.stride_a * e;
    const char* b = g.b + q * g.stride_b * e;
    const char* c = g.c + q * g.stride_c * e;
    char* d = g.d + q * g.stride_d * e;
    for (int64_t p = 0; p < g.k; ++p) {
      for (int64_t i = 0; i < g.m; ++i) {
        a_op[static_cast<size_t>(p * g.m + i)] =
            Load(a + (g.ta ? p + i * g.lda : i + p * g.lda) * e, g.type);
      }
    }
    for (int64_t j = 0; j < g.n; ++j) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t p = 0; p < g.k; ++p) {
        const float y = Load(b + (g.tb ? j + p * g.ldb : p + j * g.ldb) * e, g.type);
        const float* x = &a_op[static_cast<size_t>(p * g.m)];
        for (int64_t i = 0; i < g.m; ++i) acc[static_cast<size_t>(i)] += x[i] * y;
      }
      for (int64_t i = 0; i < g.m; ++i) {
        float v = g.alpha * acc[static_cast<size_t>(i)] +
                  g.beta * Load(c + (i + j * g.ldc) * e, g.type);
        if (g.bias != nullptr) v += g.bias[i];
        if (g.gelu) v = Gelu(v);
        Store(d + (i + j * g.ldd) * e, g.type, v);
      }
    }
  }
}

// The call in the pieces of `plan`, its pointers moved exactly as hooks_blas.cc moves them.
void SplitGemm(const RefCall& g, const GemmPlan& plan, const GemmOperands& op) {
  for (uint32_t i = 0; i < plan.pieces; ++i) {
    const GemmSlice s = SliceOf(plan, i, g.m, g.n);
    const GemmShift d = ShiftOf(op, plan.axis, s.start);
    RefCall piece = g;
    piece.m = s.m;
    piece.n = s.n;
    piece.a = g.a + d.a;
    piece.b = g.b + d.b;
    piece.c = g.c + d.c;
    piece.d = g.d + d.d;
    RefGemm(piece);
  }
}

GemmOperands OperandsOf(const RefCall& g) {
  GemmOperands op;
  op.lda = g.lda;
  op.ldb = g.ldb;
  op.ldc = g.ldc;
  op.ldd = g.ldd;
  op.a_transposed = g.ta;
  op.b_transposed = g.tb;
  op.a_bytes = op.b_bytes = op.c_bytes = op.d_bytes = ElementBytes(DataTypeOf(g.type));
  return op;
}

// Deterministic values in [-1, 1), stored in the element type.
void Fill(std::vector<char>* buf, Dtype t, uint32_t seed) {
  const size_t e = ElementBytes(DataTypeOf(t));
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i + e <= buf->size(); i += e) {
    x = x * 1664525u + 1013904223u;
    Store(buf->data() + i, t, static_cast<float>(x >> 8) / static_cast<float>(1u << 23) - 1.0f);
  }
}

struct Case {
  bool ta, tb;
  GemmAxis axis;
  int64_t batch;
  Dtype type;
};

std::string Name(const Case& c) {
  return std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") +
         (c.axis == GemmAxis::kRows ? " rows" : " columns") + " batch " +
         std::to_string(c.batch) + (c.type == Dtype::kFloat ? " float" : " bf16");
}

// A problem of odd sizes whose last piece is a remainder: 1007 on the cut axis, 300 on the
// other, k 37; every leading dimension and batch stride larger than the least. Cut by columns
// it is cuBLASLt-like (C and D apart, a bias per row and GELU); cut by rows cuBLAS-like (C is
// D, in place, no epilogue: a bias does not move with a row slice).
struct Problem {
  RefCall call;
  std::vector<char> a, b, c, d_initial;
  std::vector<float> bias;
  bool in_place = false;

  explicit Problem(const Case& cs) {
    RefCall& g = call;
    g.type = cs.type;
    g.ta = cs.ta;
    g.tb = cs.tb;
    const bool rows = cs.axis == GemmAxis::kRows;
    g.m = rows ? 1007 : 300;
    g.n = rows ? 300 : 1007;
    g.k = 37;
    g.alpha = 0.75f;
    g.beta = -0.5f;
    g.batch = cs.batch;
    g.lda = (g.ta ? g.k : g.m) + 5;
    g.ldb = (g.tb ? g.n : g.k) + 3;
    g.ldc = g.m + 7;
    in_place = rows;
    g.ldd = in_place ? g.ldc : g.m + 11;
    g.stride_a = g.lda * (g.ta ? g.m : g.k) + 17;
    g.stride_b = g.ldb * (g.tb ? g.k : g.n) + 19;
    g.stride_c = g.ldc * g.n + 23;
    g.stride_d = in_place ? g.stride_c : g.ldd * g.n + 29;
    const size_t e = ElementBytes(DataTypeOf(g.type));
    a.resize(static_cast<size_t>(g.stride_a * g.batch) * e);
    b.resize(static_cast<size_t>(g.stride_b * g.batch) * e);
    c.resize(static_cast<size_t>(g.stride_c * g.batch) * e);
    Fill(&a, g.type, 1);
    Fill(&b, g.type, 2);
    Fill(&c, g.type, 3);
    if (in_place) {
      d_initial = c;
    } else {
      d_initial.assign(static_cast<size_t>(g.stride_d * g.batch) * e, static_cast<char>(0xA5));
      bias.resize(static_cast<size_t>(g.m));
      for (int64_t i = 0; i < g.m; ++i) bias[static_cast<size_t>(i)] = 0.01f * (i % 37) - 0.2f;
      g.bias = bias.data();
      g.gelu = true;
    }
    g.a = a.data();
    g.b = b.data();
  }

  // D starting as it starts, and the call writing into it (and, in place, reading C from it).
  RefCall On(std::vector<char>* d) const {
    *d = d_initial;
    RefCall g = call;
    g.d = d->data();
    g.c = in_place ? d->data() : c.data();
    return g;
  }

  // Whether byte `i` of D is an element of the output (a row below m, a column below n, of a
  // matrix of the batch).
  bool IsOutput(size_t byte) const {
    const auto e = static_cast<int64_t>(ElementBytes(DataTypeOf(call.type)));
    const int64_t element = static_cast<int64_t>(byte) / e;
    const int64_t q = element / call.stride_d;
    const int64_t at = element % call.stride_d;
    return q < call.batch && at / call.ldd < call.n && at % call.ldd < call.m;
  }
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (GemmAxis axis : {GemmAxis::kColumns, GemmAxis::kRows}) {
        for (int64_t batch : {1, 3}) {
          for (Dtype t : {Dtype::kFloat, Dtype::kBf16}) cases.push_back({ta, tb, axis, batch, t});
        }
      }
    }
  }
  return cases;
}

TEST(GemmSplitPiecesTest, PiecesEqualTheWholeCallBitForBit) {
  for (const Case& cs : AllCases()) {
    SCOPED_TRACE(Name(cs));
    const Problem problem(cs);
    const RefCall& g = problem.call;
    const GemmPlan plan =
        PlanGemmSplit(g.m, g.n, 5 * kBound, kBound, /*rows_allowed=*/cs.axis == GemmAxis::kRows);
    ASSERT_EQ(plan.axis, cs.axis);
    ASSERT_GE(plan.pieces, 2u);
    // The last piece is a remainder: narrower than the others.
    const GemmSlice last = SliceOf(plan, plan.pieces - 1, g.m, g.n);
    ASSERT_LT(cs.axis == GemmAxis::kRows ? last.m : last.n, plan.width);

    std::vector<char> whole, pieces;
    RefGemm(problem.On(&whole));
    SplitGemm(problem.On(&pieces), plan, OperandsOf(g));
    ASSERT_EQ(whole.size(), pieces.size());
    EXPECT_EQ(memcmp(whole.data(), pieces.data(), whole.size()), 0);

    // Outside the output (rows m..ldd, the gaps between the batch's matrices) nothing moved;
    // every output element was written (the reference differs from where D started).
    size_t outside_changed = 0, outputs_unwritten = 0, outputs = 0;
    const size_t e = ElementBytes(DataTypeOf(g.type));
    for (size_t i = 0; i < pieces.size(); i += e) {
      const bool same = memcmp(pieces.data() + i, problem.d_initial.data() + i, e) == 0;
      if (!problem.IsOutput(i)) {
        outside_changed += same ? 0 : 1;
      } else {
        ++outputs;
        outputs_unwritten += same ? 1 : 0;
      }
    }
    EXPECT_EQ(outside_changed, 0u);
    EXPECT_EQ(outputs, static_cast<size_t>(g.m * g.n * g.batch));
    // In place a value may be written back unchanged by chance; apart, never the 0xA5 filler.
    EXPECT_LE(outputs_unwritten, problem.in_place ? outputs / 100 : 0) << outputs;
  }
}

// The comparison above catches a wrong move: pieces of B taken as if B were transposed, or D
// moved by C's leading dimension, differ from the whole call (both stay inside the buffers).
TEST(GemmSplitPiecesTest, AWrongShiftDiffers) {
  const Problem problem({false, false, GemmAxis::kColumns, 1, Dtype::kFloat});
  const RefCall& g = problem.call;
  const GemmPlan plan = PlanGemmSplit(g.m, g.n, 5 * kBound, kBound, false);
  ASSERT_EQ(plan.axis, GemmAxis::kColumns);
  std::vector<char> whole;
  RefGemm(problem.On(&whole));
  GemmOperands b_wrong = OperandsOf(g);
  b_wrong.b_transposed = true;
  GemmOperands d_wrong = OperandsOf(g);
  d_wrong.ldd = g.ldc;
  for (const GemmOperands& wrong : {b_wrong, d_wrong}) {
    std::vector<char> pieces;
    SplitGemm(problem.On(&pieces), plan, wrong);
    EXPECT_NE(memcmp(whole.data(), pieces.data(), whole.size()), 0);
  }
  std::vector<char> right;
  SplitGemm(problem.On(&right), plan, OperandsOf(g));
  EXPECT_EQ(memcmp(whole.data(), right.data(), whole.size()), 0);
}

// ---- element sizes, the bound, durations -------------------------------------------------------

TEST(ElementBytesTest, KnownTypesAndZeroOtherwise) {
  const std::map<int, uint32_t> known = {{0, 4},  {1, 8},  {2, 2},   {3, 1},  {4, 8},
                                         {5, 16}, {6, 4},  {8, 1},   {10, 4}, {14, 2},
                                         {28, 1}, {29, 1}};
  for (auto [type, bytes] : known) EXPECT_EQ(ElementBytes(type), bytes) << type;
  for (int type : {-1, 7, 9, 11, 12, 13, 99, 1000}) EXPECT_EQ(ElementBytes(type), 0u) << type;
}

GemmSplitView SharedBestEffort(uint64_t budget_ns) {
  GemmSplitView v;
  v.registered = true;
  v.best_effort = true;
  v.gate_on = true;
  v.high_present = true;
  v.budget_ns = budget_ns;
  return v;
}

TEST(GemmSplitBoundNsTest, ForcedWinsElseTheBudgetWhileSharedWithAHighPriorityClient) {
  EXPECT_EQ(GemmSplitBoundNs(SharedBestEffort(500'000)), 500'000u);
  // A budget below the least piece is raised to it.
  EXPECT_EQ(GemmSplitBoundNs(SharedBestEffort(kMinGemmPieceNs - 1)), kMinGemmPieceNs);
  EXPECT_EQ(GemmSplitBoundNs(SharedBestEffort(0)), kMinGemmPieceNs);
  // Each condition off: no bound.
  GemmSplitView v = SharedBestEffort(500'000);
  v.enabled = false;
  EXPECT_EQ(GemmSplitBoundNs(v), 0u);
  v = SharedBestEffort(500'000);
  v.registered = false;
  EXPECT_EQ(GemmSplitBoundNs(v), 0u);
  v = SharedBestEffort(500'000);
  v.best_effort = false;  // high priority itself
  EXPECT_EQ(GemmSplitBoundNs(v), 0u);
  v = SharedBestEffort(500'000);
  v.gate_on = false;
  EXPECT_EQ(GemmSplitBoundNs(v), 0u);
  v = SharedBestEffort(500'000);
  v.high_present = false;
  EXPECT_EQ(GemmSplitBoundNs(v), 0u);
  v = SharedBestEffort(500'000);
  v.job_rank = true;  // a rank of a multi-GPU job
  EXPECT_EQ(GemmSplitBoundNs(v), 0u);
  EXPECT_EQ(GemmSplitBoundNs(GemmSplitView{}), 0u);
  // Forced: whatever the rest says, disabled included.
  GemmSplitView forced;
  forced.forced_ns = 20'000;
  forced.enabled = false;
  EXPECT_EQ(GemmSplitBoundNs(forced), 20'000u);
  v = SharedBestEffort(500'000);
  v.forced_ns = 30'000;
  EXPECT_EQ(GemmSplitBoundNs(v), 30'000u);
}

TEST(GemmMayExceedTest, AtLeastTheBoundAtTheSureRate) {
  // 2 * 100^3 = 2e6 flops; the threshold is bound * kSureFlopsPerNs.
  const uint64_t at = 2'000'000 / kSureFlopsPerNs;
  EXPECT_TRUE(GemmMayExceed(100, 100, 100, 1, at));
  EXPECT_FALSE(GemmMayExceed(100, 100, 100, 1, at + 1));
  EXPECT_TRUE(GemmMayExceed(100, 100, 100, 2, 2 * at));  // the batch counts
  EXPECT_FALSE(GemmMayExceed(100, 100, 100, 2, 2 * at + 1));
  EXPECT_TRUE(GemmMayExceed(100, 100, 100, 1, 0));
  // m 4096, n 4096, k 4096 at a 1 ms bound: 1.37e11 flops against 2e10.
  EXPECT_TRUE(GemmMayExceed(4096, 4096, 4096, 1, 1'000'000));
  EXPECT_FALSE(GemmMayExceed(1024, 1024, 64, 1, 1'000'000));
  for (int64_t zero : {0, -1}) {
    EXPECT_FALSE(GemmMayExceed(zero, 4096, 4096, 1, 1));
    EXPECT_FALSE(GemmMayExceed(4096, zero, 4096, 1, 1));
    EXPECT_FALSE(GemmMayExceed(4096, 4096, zero, 1, 1));
    EXPECT_FALSE(GemmMayExceed(4096, 4096, 4096, zero, 1));
  }
}

TEST(GemmDurationTest, LeastOfTheLastFourSamples) {
  GemmDuration d;
  EXPECT_EQ(d.EstimateNs(), 0u);
  d.Add(500);
  EXPECT_EQ(d.EstimateNs(), 500u);
  d.Add(300);
  d.Add(400);
  EXPECT_EQ(d.EstimateNs(), 300u);
  d.Add(100);
  EXPECT_EQ(d.EstimateNs(), 100u);
  // The 100 ages out after four newer samples, not before.
  d.Add(900);
  d.Add(800);
  d.Add(700);
  EXPECT_EQ(d.EstimateNs(), 100u);
  d.Add(600);
  EXPECT_EQ(d.EstimateNs(), 600u);
  EXPECT_EQ(d.count, 8u);
}

TEST(GemmCallTimedTest, UntilThreeSamplesThenOneInSixteen) {
  // A caller that waits for its calls: one sample a call.
  for (uint32_t i = 0; i < kGemmWarmupCalls; ++i) EXPECT_TRUE(GemmCallTimed(i, i)) << i;
  EXPECT_FALSE(GemmCallTimed(kGemmWarmupCalls, kGemmWarmupCalls));
  EXPECT_FALSE(GemmCallTimed(kGemmResampleEvery - 1, kGemmWarmupCalls));
  EXPECT_TRUE(GemmCallTimed(kGemmResampleEvery, kGemmWarmupCalls));
  EXPECT_FALSE(GemmCallTimed(kGemmResampleEvery + 1, kGemmWarmupCalls));
  EXPECT_TRUE(GemmCallTimed(5 * kGemmResampleEvery, kGemmWarmupCalls));
  // One that does not: its samples come later than its first calls, and are still all taken.
  EXPECT_TRUE(GemmCallTimed(kGemmResampleEvery + 1, kGemmWarmupCalls - 1));
}

// ---- the environment ---------------------------------------------------------------------------

TEST(GemmCutAboveNsTest, AMillisecondAtLeastUnlessTheBoundIsForced) {
  EXPECT_EQ(GemmCutAboveNs(0, false), 0u);
  EXPECT_EQ(GemmCutAboveNs(0, true), 0u);
  EXPECT_EQ(GemmCutAboveNs(250'000, false), kMinCutGemmNs);
  EXPECT_EQ(GemmCutAboveNs(kMinCutGemmNs + 1, false), kMinCutGemmNs + 1);
  EXPECT_EQ(GemmCutAboveNs(20'000, true), 20'000u);
  // A 2 ms call, cut above a millisecond, runs in pieces of the bound.
  const uint64_t bound = 250'000, above = GemmCutAboveNs(bound, false);
  EXPECT_EQ(PlanGemmSplit(4096, 4096, 2'000'000, bound, true).pieces, 8u);
  // Not looked at: less work than the GPU surely ends within a millisecond (20 GFLOP).
  EXPECT_FALSE(GemmMayExceed(2048, 2048, 2048, 1, above));   // 17 GFLOP
  EXPECT_TRUE(GemmMayExceed(4096, 4096, 1024, 1, above));    // 34 GFLOP
  EXPECT_TRUE(GemmMayExceed(2048, 2048, 2048, 1, bound));
}

// Cut above a millisecond at a 250 us bound: only once three samples are in, only where the
// least of them all is over the floor; the pieces follow the last samples.
TEST(GemmShapeCutTest, OnceWarmedUpWhereTheLeastSampleEverIsOverTheFloor) {
  const uint64_t bound = 250'000, above = GemmCutAboveNs(bound, false);
  GemmDuration d;
  EXPECT_FALSE(GemmShapeCut(d, above));
  d.Add(2'000'000);
  d.Add(2'000'000);
  EXPECT_FALSE(GemmShapeCut(d, above)) << "two samples";
  d.Add(2'000'000);
  EXPECT_TRUE(GemmShapeCut(d, above));
  EXPECT_EQ(PlanGemmSplit(4096, 4096, d.EstimateNs(), bound, true).pieces, 8u);
  EXPECT_FALSE(GemmShapeCut(d, 0)) << "no bound";
  // A 0.7 ms GEMM whose samples read long beside the service's time slices: whole for good once
  // it read its own length, even after that sample left the last four.
  GemmDuration near;
  for (uint64_t ns : {1'400'000, 700'000, 1'300'000}) near.Add(ns);
  EXPECT_FALSE(GemmShapeCut(near, above));
  for (int i = 0; i < 8; ++i) near.Add(1'500'000);
  EXPECT_EQ(near.EstimateNs(), 1'500'000u);
  EXPECT_FALSE(GemmShapeCut(near, above));
  // Under a forced bound (benchmarks, tests) the floor is the bound.
  GemmDuration forced;
  for (int i = 0; i < 3; ++i) forced.Add(700'000);
  EXPECT_TRUE(GemmShapeCut(forced, GemmCutAboveNs(20'000, true)));
  EXPECT_FALSE(GemmShapeCut(forced, above));
}

// A timed GEMM's start is recorded again at the call's first kernel launch on its stream; a first
// launch on another stream leaves the first record; either way the next launch finds nothing.
TEST(TakeGemmStartTest, TheFirstLaunchTakesItOnTheCallsStreamOnly) {
  auto* event = reinterpret_cast<CUevent>(0x10);
  auto* stream = reinterpret_cast<CUstream>(0x20);
  auto* other = reinterpret_cast<CUstream>(0x30);
  GemmStartToRedo pending{event, stream};
  EXPECT_EQ(TakeGemmStart(pending, stream), event);
  EXPECT_EQ(pending.event, nullptr);
  EXPECT_EQ(TakeGemmStart(pending, stream), nullptr) << "taken once";
  pending = {event, stream};
  EXPECT_EQ(TakeGemmStart(pending, other), nullptr);
  EXPECT_EQ(pending.event, nullptr) << "taken by a launch on another stream too";
  EXPECT_EQ(TakeGemmStart(pending, stream), nullptr);
}

// cuBLAS on the default stream (a null runtime handle) is the legacy stream: a launch that names
// it CU_STREAM_LEGACY, or null through the plain entry point, takes the start; a null through a
// per-thread entry point is the thread's own stream, another one.
TEST(TakeGemmStartTest, DefaultStreamsCompareByWhatTheyName) {
  auto* event = reinterpret_cast<CUevent>(0x10);
  GemmStartToRedo pending{event, nullptr};
  EXPECT_EQ(TakeGemmStart(pending, CanonicalStream(CU_STREAM_LEGACY, true)), event);
  pending = {event, nullptr};
  EXPECT_EQ(TakeGemmStart(pending, CanonicalStream(nullptr, false)), event);
  pending = {event, nullptr};
  EXPECT_EQ(TakeGemmStart(pending, CanonicalStream(nullptr, true)), nullptr);
  pending = {event, CU_STREAM_PER_THREAD};
  EXPECT_EQ(TakeGemmStart(pending, CanonicalStream(nullptr, true)), event);
  pending = {event, CU_STREAM_PER_THREAD};
  EXPECT_EQ(TakeGemmStart(pending, CanonicalStream(nullptr, false)), nullptr);
}

TEST(ReadEnvConfigTest, GemmSplitOnUnlessTurnedOffAndItsForcedBoundInRange) {
  std::map<std::string, std::string> env;
  auto get = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EnvConfig config = ReadEnvConfig(get);
  EXPECT_TRUE(config.gemm_split);
  EXPECT_EQ(config.gemm_split_force_ns, 0u);
  for (const char* off : {"0", "off", "OFF", "false", "no"}) {
    env = {{"ORION_GEMM_SPLIT", off}};
    EXPECT_FALSE(ReadEnvConfig(get).gemm_split) << off;
  }
  for (const char* on : {"1", "on", "ON", "yes", "true", "", "junk"}) {
    env = {{"ORION_GEMM_SPLIT", on}};
    EXPECT_TRUE(ReadEnvConfig(get).gemm_split) << on;
  }
  for (const char* ns : {"10000", "20000", "1000000", "100000000"}) {
    env = {{"ORION_GEMM_SPLIT_NS", ns}};
    EXPECT_EQ(ReadEnvConfig(get).gemm_split_force_ns, std::stoull(ns)) << ns;
  }
  for (const char* bad : {"9999", "0", "100000001", "-20000", "20000ns", "20us", " 20000", "",
                          "99999999999999999999999"}) {
    env = {{"ORION_GEMM_SPLIT_NS", bad}};
    EXPECT_EQ(ReadEnvConfig(get).gemm_split_force_ns, 0u) << bad;
  }
  // The hold's drain after a first cut: 5 s, or 1 ms to 60 s.
  env = {};
  EXPECT_EQ(ReadEnvConfig(get).hold_drain_ns, 5'000'000'000u);
  env = {{"ORION_GPU_HOLD_DRAIN_MS", "200"}};
  EXPECT_EQ(ReadEnvConfig(get).hold_drain_ns, 200'000'000u);
  for (const char* bad : {"0", "60001", "-1", "2s", ""}) {
    env = {{"ORION_GPU_HOLD_DRAIN_MS", bad}};
    EXPECT_EQ(ReadEnvConfig(get).hold_drain_ns, 5'000'000'000u) << bad;
  }
  // Both: the split off, the forced bound still read (it wins in GemmSplitBoundNs).
  env = {{"ORION_GEMM_SPLIT", "0"}, {"ORION_GEMM_SPLIT_NS", "50000"}};
  config = ReadEnvConfig(get);
  EXPECT_FALSE(config.gemm_split);
  EXPECT_EQ(config.gemm_split_force_ns, 50'000u);
}

}  // namespace
}  // namespace orion::interpose
