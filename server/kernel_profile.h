// Online kernel profiles: per client and kernel, launches, measured GPU durations (sampled by the
// interposer), SM need and an Orion class (compute / memory bound). Exports and reads Orion's
// profile CSV (`Name,Profile,Memory_footprint,SM_usage,Duration`; Profile 1 = compute-bound,
// 0 = memory-bound, -1 = unknown; Duration in ns), so Orion's offline nsys + ncu step is optional.
//
// Usage:
//   KernelProfileBook book;
//   book.OnLaunch(func, blocks, threads);  book.OnName(func, "volta_sgemm_128x64_nn");
//   book.OnDuration(func, 41000);
//   std::string csv = book.ToOrionCsv();
//   absl::StatusOr<std::vector<OrionProfileRow>> rows = ParseOrionCsv(text, "resnet.csv");
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "contract/kernel_class.h"

namespace orion::server {

using contract::KernelClass;

// The 99th percentile of a window of samples (0 for an empty window); takes a copy to reorder.
template <typename T>
T Percentile99(std::vector<T> v) {
  if (v.empty()) return T{};
  const size_t idx = std::min(v.size() - 1, (v.size() * 99) / 100);
  std::nth_element(v.begin(), v.begin() + idx, v.end());
  return v[idx];
}

// Name-based class for kernels without a measured roofline (contract::ClassifyKernelName). A CSV
// row for the name overrides it.
inline KernelClass ClassifyKernelName(const std::string& name) {
  return contract::ClassifyKernelName(name.c_str());
}
const char* KernelClassName(KernelClass c);  // "comp", "mem", "unknown"

// Mean GPU time of a kernel or graph from its measured launches. A kernel's first launches run
// cold (warm-up samples): they count only until a later launch has been measured.
//
// Untimed launches are drawn at the mean (times the client's pace, ClientPace: the caller
// scales). Before any launch is measured (the first samples reach the server milliseconds after
// the launches behind them) they are drawn at 0 and counted; the first measurement catches their
// GPU time up at its mean, so a job's busy time does not lose its first milliseconds of work (a
// short job: all of it). Timed launches whose measurement never came (the process ended with
// them in flight) are counted too, and caught up at the mean when the client leaves
// (Unreported).
//
// A measurement taken on an idle stream while another process's work was in flight on a
// time-sliced GPU (kContendedSample) may hold the other's time slice (an eager service's 2 us
// kernel measured 94 us beside a trainer): it counts at the mean and moves no mean (Contended).
// Behind the client's own queued work the measurement is the kernel's, and counts.
//
// The mean is the whole run's: a kernel timed 1 in 256 gets a sample every few seconds, and a
// mean over its last few (each new one weighing a quarter, the server's draw before) read an
// eager service's busy seconds 1.035x to 1.044x the profiler's in three windows of four where
// the run's mean read 0.989x to 1.021x (timing-log --replay-weights, docs/benchmarks.md). What
// moves every kernel's time together, what shares the GPU, is the client's pace. The caller
// scales every draw by it: untimed and contended launches, and the ones caught up or never
// reported (ClientPace::Scale, Scaled).
struct MeasuredMean {
  uint64_t samples = 0, sum_ns = 0;
  uint64_t warmup_samples = 0, warmup_sum_ns = 0;
  uint64_t drawn_unmeasured = 0;  // launches drawn at 0, before any measurement
  uint64_t awaited = 0;           // timed launches whose measurement has not arrived
  void Add(uint64_t ns, bool warmup) {
    (warmup ? warmup_samples : samples) += 1;
    (warmup ? warmup_sum_ns : sum_ns) += ns;
  }
  uint64_t MeanNs() const {
    if (samples != 0) return sum_ns / samples;
    return warmup_samples != 0 ? warmup_sum_ns / warmup_samples : 0;
  }
  // An untimed launch's GPU time: the mean, or 0 (counted) while nothing is measured.
  uint64_t Draw() {
    const uint64_t mean = MeanNs();
    if (mean == 0) ++drawn_unmeasured;
    return mean;
  }
  // After Add: the GPU time of the launches drawn at 0 before, at the mean now (once).
  double CatchUpNs() {
    const uint64_t mean = MeanNs();
    if (mean == 0 || drawn_unmeasured == 0) return 0;
    const double ns = static_cast<double>(drawn_unmeasured) * static_cast<double>(mean);
    drawn_unmeasured = 0;
    return ns;
  }
  // A timed launch: its measurement is awaited.
  void Await() { ++awaited; }
  // Its measurement arrived: added; returns the GPU time of the launches drawn at 0 before it
  // (CatchUpNs).
  double Measured(uint64_t ns, bool warmup) {
    Add(ns, warmup);
    if (awaited != 0) --awaited;
    return CatchUpNs();
  }
  // A timed launch whose measurement may hold another process's time slice (kContendedSample):
  // it counts at the mean and teaches nothing. Returns 0 while nothing is measured (the caller
  // then takes the measurement as it is).
  uint64_t Contended() {
    const uint64_t mean = MeanNs();
    if (mean != 0 && awaited != 0) --awaited;
    return mean;
  }
  // The GPU time of the awaited launches that never reported, at the mean (once).
  double UnreportedNs() {
    const double ns = static_cast<double>(awaited) * static_cast<double>(MeanNs());
    awaited = 0;
    return ns;
  }
};

// `ns` as a whole number of nanoseconds, at most UINT64_MAX (a double past it converts to
// nothing defined).
inline uint64_t SaturatingNs(double ns) {
  if (!(ns > 0)) return 0;
  return ns >= 18446744073709549568.0 ? UINT64_MAX : static_cast<uint64_t>(ns);
}

// A client's recent pace: over its last samples (a new one weighs 1/kWeight), the GPU time they
// measured against what their kernels' means (scaled to their shapes) said just before them.
// Untimed launches are drawn at their mean times the pace. A kernel's time moves with what shares
// the GPU: an eager ResNet50 service ran its kernels 26% longer beside a running trainer than
// beside a held one (H100), and drawn at the run's mean a window of the second kind read 1.08x
// to 1.14x. One kernel's samples are seconds apart; the client's, over all its kernels, come
// about once a request, so the pace follows such a change within a fraction of a second.
// A sample counts once kMinSamples of its kernel's samples are in (before, the mean is too young
// to say what the GPU's pace is). A ratio of sums, so long kernels weigh by their time, as in
// busy seconds.
// It starts at 1 (the first sample's mean on both sides), so a young client's first samples
// move it by 1/kWeight each, like any later one: a pace takes kWeight samples to move 63% of
// the way to a new one (an eager service at 120 requests a second: about a third of a second).
struct ClientPace {
  static constexpr uint64_t kWeight = 32;
  static constexpr uint64_t kMinSamples = 4;
  // A sample off by more than this factor from its mean moves the pace as if it were this far
  // (a tenant's samples are hostile, and one wild one must not scale every draw).
  static constexpr double kMaxRatio = 4.0;
  uint64_t samples = 0;
  double measured_ns = 0, expected_ns = 0;
  void Add(uint64_t ns, uint64_t expected) {
    if (expected == 0) return;
    const double e = static_cast<double>(expected);
    const double m = std::clamp(static_cast<double>(ns), e / kMaxRatio, e * kMaxRatio);
    if (samples++ == 0) measured_ns = expected_ns = e;
    measured_ns += (m - measured_ns) / static_cast<double>(kWeight);
    expected_ns += (e - expected_ns) / static_cast<double>(kWeight);
  }
  // Between 1/kMaxRatio and kMaxRatio: both sums start at one value and move by clamped steps.
  double Factor() const { return expected_ns > 0 ? measured_ns / expected_ns : 1.0; }
  double Scaled(double ns) const { return ns * Factor(); }
  uint64_t Scale(uint64_t ns) const { return SaturatingNs(static_cast<double>(ns) * Factor()); }
};

// A launch's shape (grid and block), as one key. One function runs at many shapes (a
// convolution kernel over every layer of a network, 10x apart in length), and 1 in 64 of its
// launches timed holds a few samples of each: its mean alone draws every shape at the mix those
// few samples happened to be (a ResNet50 trainer's window: the kept samples' own kernels 1.05x
// the profiler's kernel time, H100).
inline uint64_t LaunchShapeKey(const uint32_t grid[3], const uint32_t block[3]) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the six dimensions
  for (const uint32_t* v : {grid, block}) {
    for (int i = 0; i < 3; ++i) h = (h ^ v[i]) * 0x100000001b3ull;
  }
  return h;
}

// The measured samples of one function at one shape, past its warm-up.
struct ShapeSamples {
  uint64_t key = 0;
  uint64_t samples = 0;
  uint64_t sum_ns = 0;
};

struct KernelStats {
  std::string name;
  uint64_t launches = 0;
  MeasuredMean duration;  // measured launches (duration.samples: past the warm-up)
  // Its shapes' samples (KernelProfileBook::kMaxShapesPerKernel at most): a launch is drawn at
  // the mean scaled by its shape's mean over the function's (ScaledToShape).
  std::vector<ShapeSamples> shapes;
  uint64_t shape_samples = 0, shape_sum_ns = 0;  // over `shapes`
  std::vector<uint32_t> recent_us;  // last kRecent measured durations (us), for p99
  size_t recent_next = 0;
  uint32_t max_blocks = 0;
  uint32_t threads_per_block = 0;
  KernelClass kclass = KernelClass::kUnknown;

  uint64_t MeanNs() const { return duration.MeanNs(); }
  // `drawn_ns` (a draw at the mean) scaled to the launch's shape (LaunchShapeKey): times the
  // shape's mean over the mean of every shape kept, both over the measured samples.
  // Unchanged where the function has one shape or the shape is not kept.
  uint64_t ScaledToShape(uint64_t shape_key, uint64_t drawn_ns) const;
  double MeanUs() const { return static_cast<double>(MeanNs()) / 1000.0; }
  double P99Us() const { return Percentile99(recent_us); }
};

struct OrionProfileRow {
  std::string name;
  KernelClass kclass = KernelClass::kUnknown;
  uint64_t memory_footprint = 0;
  uint32_t sm_usage = 0;
  uint64_t duration_ns = 0;
};

class KernelProfileBook {
 public:
  // Measured durations kept a kernel for its p99 (of so few, the window's maximum).
  static constexpr size_t kRecent = 32;
  // Distinct functions kept per client: the events come from a ring the tenant writes, and
  // ever-new handles must not grow the server without bound. A kernel costs up to about 450
  // bytes (an 80-byte name, a kRecent-sample window), so a full book is under 0.5 MB and 256
  // such clients stay well under the chart's 512 Mi (docs/security.md). Services launch a few
  // hundred distinct kernels; events about more are dropped and counted (dropped_events).
  static constexpr size_t kMaxKernels = 1024;
  // Names whose class is remembered (class_by_name_); a cache, cleared when full.
  static constexpr size_t kMaxClassifiedNames = 256;
  // Classifications done (cache misses), for tests.
  uint64_t classifications() const { return classifications_; }
  void OnLaunch(uint64_t func, uint32_t blocks, uint32_t threads_per_block);
  void OnName(uint64_t func, const std::string& name);
  // Shapes kept per function, and per client in all: beyond them a launch is drawn at its
  // function's mean alone. A tenant's ever-new shapes grow a client by at most 64 KiB.
  static constexpr size_t kMaxShapesPerKernel = 32;
  static constexpr size_t kMaxShapes = 2048;
  // A measured launch; `warmup`: one of the kernel's first launches (kept apart, see
  // MeasuredMean). Past the warm-up, `shape_key` (LaunchShapeKey), where given, learns the
  // shape's mean. Returns the GPU time of launches drawn at 0 before it (MeasuredMean::Measured),
  // times the client's pace.
  double OnDuration(uint64_t func, uint64_t duration_ns, bool warmup = false,
                    std::optional<uint64_t> shape_key = std::nullopt);
  // One measurement of a kernel or a graph (`mean`, a graph's kept by the caller): past the
  // warm-up, once kMinSamples are in, it moves the client's pace against `expected_ns` (what
  // `mean` said before it, at the launch's shape); then it is added. Returns the GPU time of the
  // launches drawn at 0 before it (MeasuredMean::Measured), times the pace.
  double Measure(MeasuredMean& mean, uint64_t ns, bool warmup, uint64_t expected_ns) {
    if (!warmup && mean.samples >= ClientPace::kMinSamples) pace_.Add(ns, expected_ns);
    return pace_.Scaled(mean.Measured(ns, warmup));
  }
  const ClientPace& pace() const { return pace_; }
  // Estimated GPU time of one launch of func (mean measured, else 0).
  uint64_t EstimateNs(uint64_t func) const;
  // The stats of func, where the book has room for it (launches draw from its duration).
  KernelStats* StatsOf(uint64_t func);
  // The GPU time of every kernel's timed launches that never reported (MeasuredMean::UnreportedNs),
  // times the client's pace.
  double UnreportedNs();
  const std::string* NameOf(uint64_t func) const;
  const std::unordered_map<uint64_t, KernelStats>& kernels() const { return kernels_; }
  // Events about functions beyond kMaxKernels, left out.
  uint64_t dropped_events() const { return dropped_events_; }
  std::string ToOrionCsv() const;
  // Applies known classes/durations from an imported Orion profile, matched by name: to every
  // kernel, or to the one kernel func (when its name has just arrived).
  void ApplyKnown(const std::unordered_map<std::string, OrionProfileRow>& known);
  void ApplyKnown(uint64_t func, const std::unordered_map<std::string, OrionProfileRow>& known);

 private:
  // The stats of func, added if there is room; null when the book is full.
  KernelStats* Stats(uint64_t func);
  // Counts a measured sample in its shape's mean (bounded by kMaxShapesPerKernel, kMaxShapes).
  void AddShapeSample(KernelStats& k, uint64_t shape_key, uint64_t ns);

  std::unordered_map<uint64_t, KernelStats> kernels_;
  ClientPace pace_;
  uint64_t dropped_events_ = 0;
  size_t shapes_ = 0;  // ShapeSamples kept over every kernel
  // Classes of names already classified (ClassifyKernelName scans a few dozen patterns): each
  // name is classified once, however often a tenant sends it. Cleared when full.
  std::unordered_map<std::string, KernelClass> class_by_name_;
  uint64_t classifications_ = 0;
};

// Parses an Orion profile CSV; errors name the source, the line and the column.
absl::StatusOr<std::vector<OrionProfileRow>> ParseOrionCsv(const std::string& text,
                                                           const std::string& source);
// Orion strips template arguments: "void foo<float>(...)" -> "void foo".
std::string OrionKernelKey(const std::string& name);

}  // namespace orion::server
