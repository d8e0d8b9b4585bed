// Pod annotations that steer GPU sharing, parsed without any I/O so they can be tested directly:
//
//   orion/priority:          high | best-effort           (default best-effort)
//   orion/memory-limit:      Kubernetes quantity, 8Gi, 512Mi, 2G, 1073741824 (default: none)
//   orion/latency-target-ms: milliseconds, may be fractional, 2.5 (default: none)
//   orion/job:               the training job the pod's ranks belong to, within its namespace
//                            (default: the pod's JobSet or Kubeflow job label, else the pod
//                            alone); 1 to 63 lowercase letters, digits, '-' and '.'
//
// A malformed value never fails the pod: the setting keeps its default and the problem is
// returned so the caller can log it and raise a Kubernetes Event on the pod.
//
// Usage:
//   ParsedAnnotations parsed = ParsePodAnnotations(pod.annotations, pod.labels);
//   for (const AnnotationProblem& p : parsed.problems) events.Warn(pod, p.Message());
//   sink.Upsert(pod.uid, parsed.settings);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace orion::agent {

inline constexpr std::string_view kAnnotationPriority = "orion/priority";
inline constexpr std::string_view kAnnotationMemoryLimit = "orion/memory-limit";
inline constexpr std::string_view kAnnotationLatencyTargetMs = "orion/latency-target-ms";
inline constexpr std::string_view kAnnotationJob = "orion/job";
// Labels the job controllers set on their pods, read in this order when orion/job is absent:
// JobSet, then Kubeflow's training operator (v1, and its older key).
inline constexpr std::string_view kLabelJobSetName = "jobset.sigs.k8s.io/jobset-name";
inline constexpr std::string_view kLabelKubeflowJobName = "training.kubeflow.org/job-name";
inline constexpr std::string_view kLabelKubeflowJobNameOld = "kubeflow.org/job-name";
inline constexpr std::string_view kJobLabels[] = {kLabelJobSetName, kLabelKubeflowJobName,
                                                  kLabelKubeflowJobNameOld};
// Optional, read by the admission webhook: comma-separated container names that get a share.
inline constexpr std::string_view kAnnotationContainers = "orion/containers";
// Optional, read by the admission webhook: a best-effort pod's SM percentage under MPS (1..100;
// 0: set no MPS variables).
inline constexpr std::string_view kAnnotationMpsThreadPercentage = "orion/mps-thread-percentage";

enum class PodPriority { kBestEffort, kHigh };

// What a pod is allowed, as the server sees it.
struct PodSettings {
  PodPriority priority = PodPriority::kBestEffort;
  uint64_t memory_limit_bytes = 0;  // 0: no limit
  uint64_t latency_target_us = 0;   // 0: none, the server's default applies
  // The job the pod's ranks belong to within its namespace; empty: the pod alone is the job.
  std::string job;

  friend bool operator==(const PodSettings&, const PodSettings&) = default;
};

struct AnnotationProblem {
  std::string key;
  std::string value;
  std::string reason;

  // One line for logs and Event messages.
  std::string Message() const;
  friend bool operator==(const AnnotationProblem&, const AnnotationProblem&) = default;
};

struct ParsedAnnotations {
  PodSettings settings;
  std::vector<AnnotationProblem> problems;
  // True if the pod names its priority: the webhook gives such pods an orion.io/gpu share.
  bool has_priority_annotation = false;
};

// `labels`: the pod's job labels (kJobLabels), for its job when orion/job is absent or refused.
ParsedAnnotations ParsePodAnnotations(const std::map<std::string, std::string>& annotations,
                                      const std::map<std::string, std::string>& labels = {});

// A job name as orion/job takes it (contract::JobNameProblem), surrounding blanks ignored.
absl::StatusOr<std::string> ParseJobName(std::string_view text);

// "high" or "best-effort" (case-insensitive, surrounding blanks ignored).
absl::StatusOr<PodPriority> ParsePriority(std::string_view text);

// A Kubernetes resource quantity of bytes: plain or decimal-exponent numbers, binary suffixes
// (Ki..Ei) and decimal suffixes (k, M..E). Fractions round up to whole bytes, as Kubernetes does.
absl::StatusOr<uint64_t> ParseMemoryQuantity(std::string_view text);

// Milliseconds (fractional allowed, > 0, at most one hour) to microseconds.
absl::StatusOr<uint64_t> ParseLatencyTargetMs(std::string_view text);

std::string_view PriorityName(PodPriority priority);

}  // namespace orion::agent
