// Online kernel profiles and Orion's CSV format: export, import, and rejected inputs.
#include "server/kernel_profile.h"

#include <gtest/gtest.h>

namespace orion::server {
namespace {

TEST(KernelProfileTest, ClassifiesByName) {
  EXPECT_EQ(ClassifyKernelName("sm90_xmma_gemm_f16f16_f16f32"), KernelClass::kCompute);
  EXPECT_EQ(ClassifyKernelName("void cudnn::conv2d_grouped_direct_kernel<float>"),
            KernelClass::kCompute);
  EXPECT_EQ(ClassifyKernelName("void at::native::vectorized_elementwise_kernel<4>"),
            KernelClass::kMemory);
  EXPECT_EQ(ClassifyKernelName("orion_spin"), KernelClass::kUnknown);
}

TEST(KernelProfileTest, LearnsDurationsAndExportsOrionCsv) {
  KernelProfileBook book;
  book.OnName(0x10, "void at::native::reduce_kernel<512, 1>(float*)");
  book.OnName(0x20, "ampere_sgemm_128x64_nn");
  for (int i = 0; i < 10; ++i) book.OnLaunch(0x10, 80, 512);
  book.OnLaunch(0x20, 264, 256);
  book.OnDuration(0x10, 20000);
  book.OnDuration(0x10, 40000);
  book.OnDuration(0x20, 100000);
  EXPECT_EQ(book.EstimateNs(0x10), 30000u);
  EXPECT_EQ(book.EstimateNs(0x30), 0u);
  const std::string csv = book.ToOrionCsv();
  EXPECT_EQ(csv,
            "Name,Profile,Memory_footprint,SM_usage,Duration\n"
            "void at::native::reduce_kernel,0,0,80,30000\n"
            "ampere_sgemm_128x64_nn,1,0,264,100000\n");
  auto rows = ParseOrionCsv(csv, "roundtrip.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1].kclass, KernelClass::kCompute);
  EXPECT_EQ((*rows)[1].sm_usage, 264u);
  EXPECT_EQ((*rows)[1].duration_ns, 100000u);
}

TEST(KernelProfileTest, ImportedProfileOverridesClassAndSeedsDuration) {
  KernelProfileBook book;
  book.OnName(0x1, "orion_spin");
  book.OnLaunch(0x1, 1, 1);
  std::unordered_map<std::string, OrionProfileRow> known;
  known["orion_spin"] = OrionProfileRow{"orion_spin", KernelClass::kMemory, 0, 4, 77000};
  book.ApplyKnown(known);
  EXPECT_EQ(book.EstimateNs(0x1), 77000u);
  EXPECT_EQ(book.kernels().at(0x1).kclass, KernelClass::kMemory);
}

TEST(KernelProfileTest, P99OfRecentSamples) {
  KernelProfileBook book;
  for (int i = 1; i <= 100; ++i) book.OnDuration(0x5, static_cast<uint64_t>(i) * 1000);
  EXPECT_EQ(book.kernels().at(0x5).P99Us(), 100.0);  // last 32 samples: 69..100 us
}

// Untimed launches draw at the run's mean; warm-up samples count only until a measured one.
TEST(MeasuredMeanTest, DrawsAtTheRunsMean) {
  MeasuredMean m;
  m.Add(50'000, /*warmup=*/true);
  EXPECT_EQ(m.Draw(), 50'000u);
  for (int i = 0; i < 20; ++i) m.Add(7'000, /*warmup=*/false);
  for (int i = 0; i < 10; ++i) m.Add(5'000, /*warmup=*/false);
  EXPECT_EQ(m.Draw(), (20u * 7'000 + 10u * 5'000) / 30);
  EXPECT_EQ(m.MeanNs(), m.Draw());
}

// Two kernels, 10 us and 100 us, alternate. Steady, the pace stays 1 and draws are the means.
// When something slows every kernel by 26% (a trainer let run beside a service), the pace
// follows within kWeight samples or so, and the draws (mean times pace) with it, though each
// kernel's mean has moved only part of the way.
TEST(ClientPaceTest, DrawsFollowAChangeEveryKernelShares) {
  KernelProfileBook book;
  auto feed = [&book](double scale, int rounds) {
    for (int i = 0; i < rounds; ++i) {
      book.OnDuration(1, static_cast<uint64_t>(10'000 * scale));
      book.OnDuration(2, static_cast<uint64_t>(100'000 * scale));
    }
  };
  auto draw = [&book](uint64_t func) {
    return static_cast<double>(book.pace().Scale(book.StatsOf(func)->duration.Draw()));
  };
  feed(1.0, 80);
  EXPECT_DOUBLE_EQ(book.pace().Factor(), 1.0);
  EXPECT_DOUBLE_EQ(draw(1), 10'000);
  feed(1.26, 48);  // 96 samples: three kWeights
  EXPECT_LT(book.EstimateNs(2), 113'000u);  // the run's mean: not half the way yet
  EXPECT_NEAR(draw(1), 12'600, 12'600 * 0.03);
  EXPECT_NEAR(draw(2), 126'000, 126'000 * 0.03);
  feed(1.0, 48);  // held again: back down
  EXPECT_NEAR(draw(2), 100'000, 100'000 * 0.03);
}

TEST(ClientPaceTest, CountsAKernelPastItsFourthSampleAndBoundsAWildOne) {
  KernelProfileBook book;
  for (uint64_t i = 0; i < ClientPace::kMinSamples; ++i) book.OnDuration(1, 10'000);
  EXPECT_EQ(book.pace().samples, 0u);  // a young mean says nothing yet
  book.OnDuration(1, 10'000);
  EXPECT_EQ(book.pace().samples, 1u);
  book.OnDuration(1, 10'000, /*warmup=*/true);  // a cold launch: not the GPU's pace
  EXPECT_EQ(book.pace().samples, 1u);
  // A tenant reports a kernel a thousand times its mean: the pace moves as if it were 4x.
  book.OnDuration(1, 10'000'000);
  EXPECT_NEAR(book.pace().Factor(), 1.0 + 3.0 / ClientPace::kWeight, 0.01);
}

TEST(OrionCsvTest, RejectsBadFilesWithLineAndColumn) {
  auto bad_header = ParseOrionCsv("Kernel,Time\nfoo,1\n", "a.csv");
  ASSERT_FALSE(bad_header.ok());
  EXPECT_NE(std::string(bad_header.status().message()).find("a.csv:1: expected the header"),
            std::string::npos);
  auto bad_profile = ParseOrionCsv("Name,Profile,Memory_footprint,SM_usage,Duration\nk,7,0,1,5\n",
                                   "b.csv");
  ASSERT_FALSE(bad_profile.ok());
  EXPECT_NE(std::string(bad_profile.status().message()).find("b.csv:2: column Profile"),
            std::string::npos);
  auto bad_cols = ParseOrionCsv("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,0\n", "c.csv");
  ASSERT_FALSE(bad_cols.ok());
  EXPECT_NE(std::string(bad_cols.status().message()).find("expected 5 columns"), std::string::npos);
  auto bad_dur = ParseOrionCsv("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,0,3,soon\n",
                               "d.csv");
  ASSERT_FALSE(bad_dur.ok());
  EXPECT_NE(std::string(bad_dur.status().message()).find("column Duration"), std::string::npos);
  EXPECT_FALSE(ParseOrionCsv("", "e.csv").ok());
}

TEST(KernelProfileTest, EverNewFunctionsStopAtTheBound) {
  // A tenant's ring can name a new function in every event; the book keeps kMaxKernels of them.
  KernelProfileBook book;
  for (uint64_t f = 1; f <= KernelProfileBook::kMaxKernels + 100; ++f) {
    book.OnLaunch(f, 1, 32);
    book.OnName(f, "k");
  }
  EXPECT_EQ(book.kernels().size(), KernelProfileBook::kMaxKernels);
  EXPECT_EQ(book.dropped_events(), 200u);
  // Functions already known keep counting.
  book.OnDuration(1, 5000);
  book.OnLaunch(1, 2, 32);
  EXPECT_EQ(book.kernels().at(1).launches, 2u);
  EXPECT_EQ(book.kernels().at(1).duration.samples, 1u);
}

TEST(KernelProfileTest, DrawsEachShapeAtItsOwnMean) {
  // One convolution kernel at two layers' shapes, 10 us and 100 us: a draw at the function's
  // mean alone would give both 55 us; scaled to the shape, each gets its own.
  KernelProfileBook book;
  const uint32_t small_grid[3] = {4, 1, 1}, big_grid[3] = {64, 1, 1}, block[3] = {128, 1, 1};
  const uint64_t small = LaunchShapeKey(small_grid, block), big = LaunchShapeKey(big_grid, block);
  ASSERT_NE(small, big);
  book.OnLaunch(7, 4, 128);
  for (int i = 0; i < 3; ++i) {
    book.OnDuration(7, 10'000, /*warmup=*/false, small);
    book.OnDuration(7, 100'000, /*warmup=*/false, big);
  }
  const KernelStats& seven = *book.StatsOf(7);
  const uint64_t drawn = book.StatsOf(7)->duration.Draw();  // the function's mean
  EXPECT_NEAR(static_cast<double>(seven.ScaledToShape(small, drawn)), 10'000.0 * drawn / 55'000.0,
              1.0);
  EXPECT_NEAR(static_cast<double>(seven.ScaledToShape(big, drawn)), 100'000.0 * drawn / 55'000.0,
              1.0);
  // A shape never measured, and a function with one shape, draw as before.
  const uint32_t other[3] = {9, 9, 1};
  EXPECT_EQ(seven.ScaledToShape(LaunchShapeKey(other, block), drawn), drawn);
  book.OnLaunch(8, 4, 128);
  book.OnDuration(8, 30'000, /*warmup=*/false, small);
  EXPECT_EQ(book.StatsOf(8)->ScaledToShape(small, 30'000), 30'000u);
  EXPECT_EQ(book.StatsOf(8)->ScaledToShape(small, 0), 0u);
}

TEST(KernelProfileTest, EverNewShapesStopAtTheBound) {
  // A tenant can send a new grid in every sample: a function keeps kMaxShapesPerKernel shapes,
  // a client kMaxShapes, and the samples past them still teach the function's mean.
  KernelProfileBook book;
  const uint32_t block[3] = {32, 1, 1};
  for (uint64_t f = 1; f <= 100; ++f) {
    book.OnLaunch(f, 1, 32);
    for (uint32_t g = 1; g <= 40; ++g) {
      const uint32_t grid[3] = {g, 1, 1};
      book.OnDuration(f, 1000, /*warmup=*/false, LaunchShapeKey(grid, block));
    }
  }
  size_t kept = 0;
  for (const auto& [func, k] : book.kernels()) {
    EXPECT_LE(k.shapes.size(), KernelProfileBook::kMaxShapesPerKernel);
    kept += k.shapes.size();
  }
  EXPECT_EQ(kept, KernelProfileBook::kMaxShapes);
  EXPECT_EQ(book.kernels().at(100).duration.samples, 40u);
  EXPECT_TRUE(book.kernels().at(100).shapes.empty());
}

}  // namespace
}  // namespace orion::server
