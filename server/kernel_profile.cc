// Online kernel statistics and Orion CSV import/export (see kernel_profile.h).
#include "server/kernel_profile.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace orion::server {

const char* KernelClassName(KernelClass c) {
  switch (c) {
    case KernelClass::kCompute: return "comp";
    case KernelClass::kMemory: return "mem";
    case KernelClass::kMixed: return "mixed";
    default: return "unknown";
  }
}

KernelStats* KernelProfileBook::Stats(uint64_t func) {
  if (auto it = kernels_.find(func); it != kernels_.end()) return &it->second;
  if (kernels_.size() >= kMaxKernels) {
    ++dropped_events_;
    return nullptr;
  }
  return &kernels_[func];
}

void KernelProfileBook::OnLaunch(uint64_t func, uint32_t blocks, uint32_t threads) {
  KernelStats* stats = Stats(func);
  if (stats == nullptr) return;
  KernelStats& k = *stats;
  ++k.launches;
  k.max_blocks = std::max(k.max_blocks, blocks);
  k.threads_per_block = threads;
}

void KernelProfileBook::OnName(uint64_t func, const std::string& name) {
  KernelStats* stats = Stats(func);
  if (stats == nullptr) return;
  KernelStats& k = *stats;
  if (k.name == name) return;  // the same name again: nothing to learn
  k.name = name;
  if (k.kclass != KernelClass::kUnknown) return;
  auto it = class_by_name_.find(name);
  if (it == class_by_name_.end()) {
    if (class_by_name_.size() >= kMaxClassifiedNames) class_by_name_.clear();
    ++classifications_;
    it = class_by_name_.emplace(name, ClassifyKernelName(name)).first;
  }
  k.kclass = it->second;
}

double KernelProfileBook::OnDuration(uint64_t func, uint64_t ns, bool warmup,
                                     std::optional<uint64_t> shape_key) {
  KernelStats* stats = Stats(func);
  if (stats == nullptr) return 0;
  KernelStats& k = *stats;
  const uint64_t mean = k.duration.MeanNs();  // at its shape: the sample not yet in
  const double caught_up =
      Measure(k.duration, ns, warmup, shape_key ? k.ScaledToShape(*shape_key, mean) : mean);
  if (warmup) return caught_up;  // cold: not in the p99 window or its shape's mean either
  const uint32_t us = static_cast<uint32_t>(std::min<uint64_t>(ns / 1000, UINT32_MAX));
  if (k.recent_us.size() < kRecent) {
    k.recent_us.push_back(us);
  } else {
    k.recent_us[k.recent_next] = us;
    k.recent_next = (k.recent_next + 1) % kRecent;
  }
  if (shape_key) AddShapeSample(k, *shape_key, ns);
  return caught_up;
}

void KernelProfileBook::AddShapeSample(KernelStats& k, uint64_t shape_key, uint64_t ns) {
  auto shape = std::find_if(k.shapes.begin(), k.shapes.end(),
                            [shape_key](const ShapeSamples& s) { return s.key == shape_key; });
  if (shape == k.shapes.end()) {
    if (k.shapes.size() >= kMaxShapesPerKernel || shapes_ >= kMaxShapes) return;
    shape = k.shapes.insert(k.shapes.end(), ShapeSamples{shape_key, 0, 0});
    ++shapes_;
  }
  ++shape->samples;
  shape->sum_ns += ns;
  ++k.shape_samples;
  k.shape_sum_ns += ns;
}

uint64_t KernelStats::ScaledToShape(uint64_t shape_key, uint64_t drawn_ns) const {
  if (drawn_ns == 0 || shapes.size() < 2 || shape_sum_ns == 0) return drawn_ns;  // one shape: 1x
  for (const ShapeSamples& s : shapes) {
    if (s.key != shape_key) continue;
    // (s.sum_ns / s.samples) / (shape_sum_ns / shape_samples), in doubles (no overflow).
    const double factor = (static_cast<double>(s.sum_ns) * static_cast<double>(shape_samples)) /
                          (static_cast<double>(shape_sum_ns) * static_cast<double>(s.samples));
    return SaturatingNs(static_cast<double>(drawn_ns) * factor);
  }
  return drawn_ns;
}

KernelStats* KernelProfileBook::StatsOf(uint64_t func) {
  auto it = kernels_.find(func);
  return it == kernels_.end() ? nullptr : &it->second;
}

double KernelProfileBook::UnreportedNs() {
  double ns = 0;
  for (auto& [func, k] : kernels_) ns += k.duration.UnreportedNs();
  return pace_.Scaled(ns);
}

uint64_t KernelProfileBook::EstimateNs(uint64_t func) const {
  auto it = kernels_.find(func);
  return it == kernels_.end() ? 0 : it->second.MeanNs();
}

const std::string* KernelProfileBook::NameOf(uint64_t func) const {
  auto it = kernels_.find(func);
  return it == kernels_.end() || it->second.name.empty() ? nullptr : &it->second.name;
}

std::string OrionKernelKey(const std::string& name) {
  const size_t lt = name.find('<');
  std::string key = lt == std::string::npos ? name : name.substr(0, lt);
  // Commas would break the CSV; Orion's own names never contain them after '<' is cut.
  std::replace(key.begin(), key.end(), ',', ';');
  return key;
}

std::string KernelProfileBook::ToOrionCsv() const {
  std::string out = "Name,Profile,Memory_footprint,SM_usage,Duration\n";
  std::vector<const KernelStats*> rows;
  for (const auto& [func, k] : kernels_) rows.push_back(&k);
  std::sort(rows.begin(), rows.end(), [](const KernelStats* a, const KernelStats* b) {
    return a->launches != b->launches ? a->launches > b->launches : a->name < b->name;
  });
  for (const KernelStats* k : rows) {
    const std::string name = k->name.empty() ? "unnamed_kernel" : OrionKernelKey(k->name);
    absl::StrAppend(&out, name, ",", static_cast<int>(k->kclass), ",0,", k->max_blocks, ",",
                    k->MeanNs(), "\n");
  }
  return out;
}

namespace {

void ApplyRow(KernelStats& k, const std::unordered_map<std::string, OrionProfileRow>& known) {
  auto it = known.find(OrionKernelKey(k.name));
  if (it == known.end()) return;
  if (it->second.kclass != KernelClass::kUnknown) k.kclass = it->second.kclass;
  if (k.duration.samples == 0 && it->second.duration_ns > 0) {
    k.duration.samples = 1;
    k.duration.sum_ns = it->second.duration_ns;
  }
}

}  // namespace

void KernelProfileBook::ApplyKnown(const std::unordered_map<std::string, OrionProfileRow>& known) {
  for (auto& [func, k] : kernels_) ApplyRow(k, known);
}

void KernelProfileBook::ApplyKnown(uint64_t func,
                                   const std::unordered_map<std::string, OrionProfileRow>& known) {
  if (auto it = kernels_.find(func); it != kernels_.end()) ApplyRow(it->second, known);
}

absl::StatusOr<std::vector<OrionProfileRow>> ParseOrionCsv(const std::string& text,
                                                           const std::string& source) {
  std::vector<OrionProfileRow> rows;
  int line_no = 0;
  bool header_seen = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<std::string> cols = absl::StrSplit(line, ',');
    if (!header_seen) {
      header_seen = true;
      if (cols.size() != 5 || cols[0] != "Name" || cols[4] != "Duration") {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ":", line_no,
            ": expected the header Name,Profile,Memory_footprint,SM_usage,Duration"));
      }
      continue;
    }
    if (cols.size() != 5) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_no, ": expected 5 columns, found ", cols.size()));
    }
    OrionProfileRow r;
    r.name = cols[0];
    int profile = 0;
    double footprint = 0, sm = 0, duration = 0;
    if (!absl::SimpleAtoi(cols[1], &profile) || profile < -1 || profile > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line_no, ": column Profile: expected -1, 0 or 1, got '", cols[1], "'"));
    }
    // Written so that NaN fails too; the bounds keep the integer conversions below defined.
    constexpr double kTwo32 = 4294967296.0, kTwo64 = 18446744073709551616.0;
    if (!absl::SimpleAtod(cols[2], &footprint) || !(footprint >= 0 && footprint < kTwo64)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line_no, ": column Memory_footprint: expected a number >= 0 (bytes, "
          "below 2^64), got '", cols[2], "'"));
    }
    if (!absl::SimpleAtod(cols[3], &sm) || !(sm >= 0 && sm < kTwo32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line_no, ": column SM_usage: expected a number >= 0 (below 2^32), got '",
          cols[3], "'"));
    }
    if (!absl::SimpleAtod(cols[4], &duration) || !(duration >= 0 && duration < kTwo64)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line_no, ": column Duration: expected nanoseconds >= 0 (below 2^64), got '",
          cols[4], "'"));
    }
    r.kclass = static_cast<KernelClass>(profile);
    r.memory_footprint = static_cast<uint64_t>(footprint);
    r.sm_usage = static_cast<uint32_t>(sm);
    r.duration_ns = static_cast<uint64_t>(duration);
    rows.push_back(std::move(r));
  }
  if (!header_seen) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": empty profile file"));
  }
  return rows;
}

}  // namespace orion::server
