// Mutating admission for annotation-only use: a pod carrying orion/priority gets
// `resources.limits[<resource>]: "1"` in each of its containers (or in those named by the
// orion/containers annotation), so users need not request the share themselves. A pod with
// orion/priority: high gets the high-priority slot (`high_resource_name`, orion.io/gpu-high)
// instead of the share, so the scheduler's resource fit allows only as many high-priority
// containers on a GPU as it has slots; a share it asked for itself (1 per container) is moved
// to the slot. Containers
// that already ask for the resource, or for whole GPUs (nvidia.com/gpu), get no share added;
// nor do those that ask for the high-priority slot (a share beside it would be a second device).
// Outside high_priority_namespaces a container's own ask for the slot (any pod's, annotated or
// not; init containers too) becomes a share, with a warning saying why: the slot is its GPU's
// one place for a high-priority pod.
// Best-effort pods' containers that take a share (not whole-GPU ones) also get
// CUDA_MPS_CLIENT_PRIORITY=1 and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the options' default or the
// pod's orion/mps-thread-percentage, 0 there: neither), unless their `env` sets them (a value
// from `envFrom` is overridden, as `env` takes precedence in Kubernetes): on nodes that run the MPS daemon their
// kernels then queue behind high-priority ones and use at most that share of the SMs; elsewhere
// CUDA ignores both.
// Pure: AdmissionReview v1 JSON in, HTTP status + JSON out.
//
// Usage:
//   AdmissionReply reply = ReviewPodAdmission(request_body, {.resource_name = "orion.io/gpu"});
//   Respond(reply.http_status, "application/json", reply.body);
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/json.h"
#include "contract/orion_contract.h"

namespace orion::agent {

struct AdmissionOptions {
  std::string resource_name = "orion.io/gpu";
  // Resource of high-priority containers; empty: they get a share like the others.
  std::string high_resource_name = "orion.io/gpu-high";
  // Namespaces whose pods may be high priority (the server's policy.high_priority_namespaces);
  // empty: all. Elsewhere a pod annotated high runs best-effort, so it gets a share (and the
  // best-effort MPS variables) rather than one of the GPU's high-priority slots.
  std::vector<std::string> high_priority_namespaces;
  // 1..100; 0: leave both MPS variables unset.
  int best_effort_mps_thread_percentage = contract::kDefaultBestEffortMpsThreadPercentage;
};

struct AdmissionReply {
  int http_status = 200;
  std::string body;  // AdmissionReview v1, or {"error": ...} for bodies that are not one
};

AdmissionReply ReviewPodAdmission(std::string_view request_body, const AdmissionOptions& options);

// The JSON patch (RFC 6902 operations) that gives the pod its shares; empty if none is needed.
// Warnings about ignored annotations are appended to *warnings.
// `ns`: the pod's namespace (the AdmissionReview's request.namespace; a pod being created may
// carry none in its metadata).
JsonValue SharePatchForPod(const JsonValue& pod, const AdmissionOptions& options,
                           std::vector<std::string>* warnings, const std::string& ns = "");

// "a/b~c" -> "a~1b~0c" (RFC 6901), for resource names inside patch paths.
std::string EscapeJsonPointer(std::string_view token);

}  // namespace orion::agent
