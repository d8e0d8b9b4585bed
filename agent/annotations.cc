// Parsing of the orion/* pod annotations (see annotations.h).
#include "agent/annotations.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "contract/orion_contract.h"

namespace orion::agent {
namespace {

struct Suffix {
  std::string_view text;
  long double multiplier;
};

// Longest suffixes first so "Ki" is not read as "K"+"i".
constexpr Suffix kSuffixes[] = {
    {"Ki", 1024.0L},
    {"Mi", 1024.0L * 1024},
    {"Gi", 1024.0L * 1024 * 1024},
    {"Ti", 1024.0L * 1024 * 1024 * 1024},
    {"Pi", 1024.0L * 1024 * 1024 * 1024 * 1024},
    {"Ei", 1024.0L * 1024 * 1024 * 1024 * 1024 * 1024},
    {"k", 1e3L},
    {"M", 1e6L},
    {"G", 1e9L},
    {"T", 1e12L},
    {"P", 1e15L},
    {"E", 1e18L},
};

// Debian's abseil has its own string_view type, so trimming is done here on std::string_view.
std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IsPlainDecimal(std::string_view s) {
  // digits with at most one '.', at least one digit; no sign, no blanks, no hex, no inf/nan.
  bool digit = false;
  bool dot = false;
  for (char c : s) {
    if (c >= '0' && c <= '9') {
      digit = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      return false;
    }
  }
  return digit;
}

}  // namespace

std::string AnnotationProblem::Message() const {
  // Keys of labels read as annotations are (e.g. a job label) carry their own "label " prefix.
  return absl::StrCat(key.starts_with("label ") ? "" : "annotation ", key, "=\"", value,
                      "\" ignored: ", reason);
}

std::string_view PriorityName(PodPriority priority) {
  return priority == PodPriority::kHigh ? "high" : "best-effort";
}

absl::StatusOr<PodPriority> ParsePriority(std::string_view text) {
  std::string v(Trim(text));
  for (char& c : v) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (v == "high") return PodPriority::kHigh;
  if (v == "best-effort") return PodPriority::kBestEffort;
  return absl::InvalidArgumentError("priority must be \"high\" or \"best-effort\"");
}

absl::StatusOr<uint64_t> ParseMemoryQuantity(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.empty()) return absl::InvalidArgumentError("empty quantity");
  long double multiplier = 1.0L;
  for (const Suffix& suffix : kSuffixes) {
    if (s.size() > suffix.text.size() && s.ends_with(suffix.text)) {
      multiplier = suffix.multiplier;
      s.remove_suffix(suffix.text.size());
      break;
    }
  }
  // Decimal exponent form (1e9, 5E3) only without a suffix; "E" alone is exa.
  int exponent = 0;
  if (multiplier == 1.0L) {
    const size_t e = s.find_first_of("eE");
    if (e != std::string_view::npos) {
      std::string_view exp_text = s.substr(e + 1);
      if (!exp_text.empty() && exp_text.front() == '+') exp_text.remove_prefix(1);
      if (exp_text.empty() || !IsPlainDecimal(exp_text) ||
          exp_text.find('.') != std::string_view::npos || std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exponent).ec != std::errc() ||
          exponent > 18) {
        return absl::InvalidArgumentError("bad exponent");
      }
      s = s.substr(0, e);
    }
  }
  if (!IsPlainDecimal(s)) {
    return absl::InvalidArgumentError(
        "not a memory quantity (use bytes or a suffix: Ki Mi Gi Ti, k M G T)");
  }
  long double value = std::strtold(std::string(s).c_str(), nullptr);
  value *= multiplier;
  for (int i = 0; i < exponent; ++i) value *= 10.0L;
  if (value >= static_cast<long double>(std::numeric_limits<uint64_t>::max())) {
    return absl::InvalidArgumentError("quantity too large");
  }
  return static_cast<uint64_t>(std::ceil(value));
}

absl::StatusOr<uint64_t> ParseLatencyTargetMs(std::string_view text) {
  const std::string_view s = Trim(text);
  if (!IsPlainDecimal(s)) {
    return absl::InvalidArgumentError("latency target must be a positive number of milliseconds");
  }
  const long double ms = std::strtold(std::string(s).c_str(), nullptr);
  if (ms <= 0.0L) return absl::InvalidArgumentError("latency target must be > 0");
  if (ms > 3600.0L * 1000) return absl::InvalidArgumentError("latency target above one hour");
  const auto us = static_cast<uint64_t>(std::llround(ms * 1000.0L));
  return us == 0 ? 1 : us;
}

absl::StatusOr<std::string> ParseJobName(std::string_view text) {
  const std::string_view s = Trim(text);
  if (const char* why = contract::JobNameProblem(s.data(), s.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job name ", why, " (1 to 63 lowercase letters, digits, '-' and '.')"));
  }
  return std::string(s);
}

ParsedAnnotations ParsePodAnnotations(const std::map<std::string, std::string>& annotations,
                                      const std::map<std::string, std::string>& labels) {
  ParsedAnnotations out;
  auto report = [&out](std::string_view key, const std::string& value, const absl::Status& s) {
    out.problems.push_back({std::string(key), value, std::string(s.message())});
  };
  if (auto it = annotations.find(std::string(kAnnotationPriority)); it != annotations.end()) {
    out.has_priority_annotation = true;
    absl::StatusOr<PodPriority> p = ParsePriority(it->second);
    if (p.ok()) {
      out.settings.priority = *p;
    } else {
      report(kAnnotationPriority, it->second, p.status());
    }
  }
  if (auto it = annotations.find(std::string(kAnnotationMemoryLimit)); it != annotations.end()) {
    absl::StatusOr<uint64_t> bytes = ParseMemoryQuantity(it->second);
    if (bytes.ok()) {
      out.settings.memory_limit_bytes = *bytes;
    } else {
      report(kAnnotationMemoryLimit, it->second, bytes.status());
    }
  }
  if (auto it = annotations.find(std::string(kAnnotationLatencyTargetMs));
      it != annotations.end()) {
    absl::StatusOr<uint64_t> us = ParseLatencyTargetMs(it->second);
    if (us.ok()) {
      out.settings.latency_target_us = *us;
    } else {
      report(kAnnotationLatencyTargetMs, it->second, us.status());
    }
  }
  // The job: orion/job, else the first job controller label; a refused annotation falls back to
  // the labels (and is reported), as other annotations fall back to their defaults.
  if (auto it = annotations.find(std::string(kAnnotationJob)); it != annotations.end()) {
    absl::StatusOr<std::string> job = ParseJobName(it->second);
    if (job.ok()) {
      out.settings.job = *std::move(job);
    } else {
      report(kAnnotationJob, it->second, job.status());
    }
  }
  for (std::string_view key : kJobLabels) {
    if (!out.settings.job.empty()) break;
    auto it = labels.find(std::string(key));
    if (it == labels.end()) continue;
    absl::StatusOr<std::string> job = ParseJobName(it->second);
    if (job.ok()) {
      out.settings.job = *std::move(job);
    } else {
      out.problems.push_back({"label " + std::string(key), it->second,
                              std::string(job.status().message())});
    }
  }
  return out;
}

}  // namespace orion::agent
