// Two cuBLAS copies in one process, each caller routed to its own, end to end on test doubles:
// orion_blas_two_copies_probe (linked against copy A of the cuBLAS double, versioned
// ORION_BLAS_A) calls cublasGemmEx itself, then through liborion_blas_caller_b.so (linked
// against copy B, ORION_BLAS_B, opened with RTLD_LOCAL), then alternately, then through the
// caller closed and opened again with copy B elsewhere (its old place an inaccessible mapping:
// a function resolved before the unload, called again, ends the process); each copy's call log
// says which calls it received. The interposer's cublasGemmEx is unversioned: it captures both
// callers' references, and must send each on to the copy the loader bound that caller to.
// Run three ways, with no orion-server (ORION_SOCKET names nothing):
//  - without the interposer: the loader's own routing, the baseline that proves the setup;
//  - under the interposer, split off (no server: the bound is 0): every call goes whole, each to
//    its own copy (a resolution cached for the process would send caller_b's calls to copy A);
//  - under the interposer with a forced bound (ORION_GEMM_SPLIT_NS=20000): once three of a
//    shape's calls were timed its calls run in pieces, every piece in the caller's own copy,
//    the outputs right.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/blas_double/probe_run.h"

namespace {

using orion::testing::Fields;
using orion::testing::Int;
using orion::testing::ProbeRun;
using orion::testing::Report;

constexpr int kCalls = 8;

// The probe, kCalls calls a phase, with `env` added.
ProbeRun RunProbe(std::vector<std::string> env) {
  return orion::testing::RunProbe(
      {ORION_TWO_COPIES_PROBE, ORION_CALLER_B_LIB, std::to_string(kCalls)}, std::move(env),
      "orion-two-copies");
}

// The two copies are the libraries they should be, and copy B stayed out of the global scope.
void ExpectTwoCopies(const ProbeRun& run) {
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(run.libs.count("a") == 1 ? run.libs.at("a") : "", "liborion_blas_double_a.so")
      << run.output;
  EXPECT_EQ(run.libs.count("b") == 1 ? run.libs.at("b") : "", "liborion_blas_double_b.so")
      << run.output;
  EXPECT_EQ(Int(run.libs, "b_global"), 0) << run.output;
  // The reload: copy B went with its caller and came back elsewhere. (The caller comes back
  // where it was on Linux's layout, caller_same=1: then its call sites are the ones resolved
  // before.)
  EXPECT_EQ(Int(run.reload, "b_unloaded"), 1) << run.output;
  EXPECT_EQ(Int(run.reload, "blocked"), 1) << run.output;
  EXPECT_EQ(Int(run.reload, "b_moved"), 1) << run.output;
}

// Each phase: every call reached its own copy, and only its own; outputs right.
void ExpectOwnCopies(const ProbeRun& run) {
  ExpectTwoCopies(run);
  const std::map<std::string, int> calls = {
      {"probe", kCalls}, {"caller_b", kCalls}, {"alternating", 4}, {"reloaded", kCalls}};
  for (const auto& [name, count] : calls) {
    SCOPED_TRACE(name);
    ASSERT_EQ(run.cases.count(name), 1u) << run.output;
    const Fields& c = run.cases.at(name);
    EXPECT_EQ(Int(c, "calls"), count);
    EXPECT_EQ(Int(c, "misrouted"), 0) << run.output;
    EXPECT_EQ(Int(c, "other_total"), 0) << run.output;
    EXPECT_EQ(Int(c, "cover"), 1) << run.output;
    EXPECT_EQ(Int(c, "equal"), 1) << run.output;
    EXPECT_EQ(Int(c, "right"), 1) << run.output;
  }
}

// Every call went whole to its own copy.
void ExpectAllWhole(const ProbeRun& run) {
  ExpectOwnCopies(run);
  for (const auto& [name, c] : run.cases) {
    SCOPED_TRACE(name);
    EXPECT_EQ(Int(c, "first_own"), 1);
    EXPECT_EQ(Int(c, "last_own"), 1);
    EXPECT_EQ(Int(c, "own_total"), Int(c, "calls"));
  }
}

TEST(TwoCublasCopiesTest, WithoutTheInterposerEachCallerReachesItsOwnCopy) {
  const ProbeRun run = RunProbe({});
  ExpectAllWhole(run);
  EXPECT_EQ(Report(run.output)[0], -1) << "no interposer, no report";
}

TEST(TwoCublasCopiesTest, UnderTheInterposerEachCallerReachesItsOwnCopy) {
  const ProbeRun run = RunProbe({std::string("LD_PRELOAD=") + ORION_INTERPOSE_LIB});
  ExpectAllWhole(run);
  // With no server the bound is 0: no call is even looked at, all went straight on.
  const std::vector<long long> report = Report(run.output);
  EXPECT_EQ(report[0], 0) << run.output;
  EXPECT_EQ(report[1], 0) << run.output;
}

TEST(TwoCublasCopiesTest, UnderAForcedBoundEachCopyRunsItsOwnCallersPieces) {
  const ProbeRun run = RunProbe(
      {std::string("LD_PRELOAD=") + ORION_INTERPOSE_LIB, "ORION_GEMM_SPLIT_NS=20000"});
  ExpectOwnCopies(run);
  // Each caller's shape (its own handle) goes whole until three of its calls were timed
  // (kGemmWarmupCalls), then in pieces: 8 columns of 128 each (the duration is far beyond the
  // bound).
  constexpr int kWholeCalls = 3;
  long long pieces = 0;
  for (const char* name : {"probe", "caller_b", "reloaded"}) {
    SCOPED_TRACE(name);
    ASSERT_EQ(run.cases.count(name), 1u) << run.output;
    const Fields& c = run.cases.at(name);
    EXPECT_EQ(Int(c, "first_own"), 1);
    EXPECT_GT(Int(c, "last_own"), 1);
    EXPECT_LE(Int(c, "last_own"), 16);
    EXPECT_GT(Int(c, "own_total"), Int(c, "calls"));
    pieces += Int(c, "own_total") - kWholeCalls;
  }
  // Both shapes learned: every alternating call runs in pieces, each in its caller's copy.
  ASSERT_EQ(run.cases.count("alternating"), 1u) << run.output;
  const Fields& alt = run.cases.at("alternating");
  EXPECT_GT(Int(alt, "first_own"), 1);
  EXPECT_GT(Int(alt, "last_own"), 1);
  pieces += Int(alt, "own_total");
  // Every call looked at; all but each caller's first three split (the reloaded caller's handle
  // is a new one: it learns again).
  const std::vector<long long> report = Report(run.output);
  EXPECT_EQ(report[0], 3 * kCalls + 4) << run.output;
  EXPECT_EQ(report[1], 3 * (kCalls - kWholeCalls) + 4) << run.output;
  EXPECT_EQ(report[2], pieces) << run.output;
}

}  // namespace
