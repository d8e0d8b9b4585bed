// AdmissionReview v1 handling of the webhook: real request bodies in, the JSON patch out, and a
// clear 400 for bodies that are not AdmissionReviews.
#include "agent/admission.h"

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "agent/json.h"
#include "tests/agent/testdata.h"

namespace orion::agent {
namespace {

using testing::ReadTestdata;

// Decodes response.patch of a reply into its JSON array.
JsonValue PatchOf(const AdmissionReply& reply) {
  absl::StatusOr<JsonValue> review = ParseJson(reply.body);
  EXPECT_TRUE(review.ok());
  std::string raw;
  EXPECT_TRUE(absl::Base64Unescape(StringAt(*review, {"response", "patch"}), &raw));
  absl::StatusOr<JsonValue> patch = ParseJson(raw);
  EXPECT_TRUE(patch.ok()) << raw;
  return *patch;
}

// "add PATH VALUE" of one patch operation (members compared as written).
std::string OpText(const JsonValue& op) {
  return StringAt(op, {"op"}) + " " + StringAt(op, {"path"}) + " " + WriteJson(*At(op, {"value"}));
}

JsonValue ReviewWithPod(const std::string& testdata, const std::string& pod_json) {
  JsonValue review = *ParseJson(ReadTestdata(testdata));
  review["request"]["object"] = *ParseJson(pod_json);
  return review;
}

TEST(ReviewPodAdmission, AddsShareToEveryContainerOfAnnotatedPod) {
  // Without a high-priority resource, a high-priority pod gets shares like any other.
  AdmissionReply reply = ReviewPodAdmission(ReadTestdata("admission-review-pod-high.json"),
                                            {.high_resource_name = ""});
  ASSERT_EQ(reply.http_status, 200);
  JsonValue review = *ParseJson(reply.body);
  EXPECT_EQ(StringAt(review, {"apiVersion"}), "admission.k8s.io/v1");
  EXPECT_EQ(StringAt(review, {"kind"}), "AdmissionReview");
  EXPECT_EQ(StringAt(review, {"response", "uid"}), "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_TRUE(At(review, {"response", "allowed"})->get<bool>());
  EXPECT_EQ(StringAt(review, {"response", "patchType"}), "JSONPatch");
  EXPECT_EQ(At(review, {"response", "warnings"}), nullptr);

  JsonValue patch = PatchOf(reply);
  ASSERT_EQ(patch.size(), 2);
  // Container 0 has limits: the resource is added inside them (with the '/' escaped).
  EXPECT_EQ(OpText(patch[0]),
            R"(add /spec/containers/0/resources/limits/orion.io~1gpu "1")");
  // Container 1 has empty resources: a limits object is added.
  EXPECT_EQ(OpText(patch[1]),
            R"(add /spec/containers/1/resources/limits {"orion.io/gpu":"1"})");
}

// A high-priority pod's containers get the GPU's high-priority slot instead of a share: the
// scheduler's fit then keeps them one per GPU.
TEST(ReviewPodAdmission, HighPriorityContainersGetTheHighSlotInsteadOfAShare) {
  JsonValue patch = PatchOf(ReviewPodAdmission(ReadTestdata("admission-review-pod-high.json"), {}));
  ASSERT_EQ(patch.size(), 2);
  EXPECT_EQ(OpText(patch[0]), R"(add /spec/containers/0/resources/limits/orion.io~1gpu-high "1")");
  EXPECT_EQ(OpText(patch[1]),
            R"(add /spec/containers/1/resources/limits {"orion.io/gpu-high":"1"})");

  // A share the container asked for itself is moved to the slot (limits and requests); a
  // best-effort pod's share stays a share.
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "high"}},
    "spec": {"containers": [
      {"name": "a", "resources": {"limits": {"orion.io/gpu": "1"}, "requests": {"orion.io/gpu": 1}}},
      {"name": "b", "resources": {"requests": {"orion.io/gpu": "1"}}},
      {"name": "c", "resources": {"limits": {"orion.io/gpu": "2"}}}]}})");
  AdmissionReply reply = ReviewPodAdmission(WriteJson(review), {});
  patch = PatchOf(reply);
  ASSERT_EQ(patch.size(), 4) << WriteJson(patch);
  EXPECT_EQ(WriteJson(patch[0]), R"({"from":"/spec/containers/0/resources/limits/orion.io~1gpu",)"
                                 R"("op":"move","path":"/spec/containers/0/resources/limits/orion.io~1gpu-high"})");
  EXPECT_EQ(StringAt(patch[1], {"path"}), "/spec/containers/0/resources/requests/orion.io~1gpu-high");
  EXPECT_EQ(StringAt(patch[2], {"op"}), "move");
  EXPECT_EQ(StringAt(patch[2], {"from"}), "/spec/containers/1/resources/requests/orion.io~1gpu");
  EXPECT_EQ(OpText(patch[3]), R"(add /spec/containers/1/resources/limits {"orion.io/gpu-high":"1"})");
  // Two shares are left as asked, with a warning that names the container.
  const JsonValue out = *ParseJson(reply.body);
  const JsonValue* warnings = At(out, {"response", "warnings"});
  ASSERT_NE(warnings, nullptr);
  ASSERT_EQ(warnings->size(), 1u);
  EXPECT_NE((*warnings)[0].get<std::string>().find("container \"c\" asks for \"2\" orion.io/gpu"),
            std::string::npos) << WriteJson(*warnings);

  review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "best-effort"}},
    "spec": {"containers": [{"name": "a"}]}})");
  patch = PatchOf(ReviewPodAdmission(WriteJson(review), {.best_effort_mps_thread_percentage = 0}));
  ASSERT_EQ(patch.size(), 1);
  EXPECT_EQ(OpText(patch[0]), R"(add /spec/containers/0/resources {"limits":{"orion.io/gpu":"1"}})");
}

// A pod annotated high in a namespace not allowed high priority runs best-effort on the node
// (server policy.high_priority_namespaces): it gets a share, not one of the GPU's slots.
TEST(ReviewPodAdmission, HighPodOutsideTheAllowedNamespacesGetsAShare) {
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "high"}},
    "spec": {"containers": [{"name": "a"}]}})");
  review["request"]["namespace"] = "default";
  const AdmissionOptions options = {.high_priority_namespaces = {"serving", "prod"},
                                    .best_effort_mps_thread_percentage = 0};
  AdmissionReply reply = ReviewPodAdmission(WriteJson(review), options);
  JsonValue patch = PatchOf(reply);
  ASSERT_EQ(patch.size(), 1);
  EXPECT_EQ(OpText(patch[0]), R"(add /spec/containers/0/resources {"limits":{"orion.io/gpu":"1"}})");
  const JsonValue out = *ParseJson(reply.body);
  const JsonValue* warnings = At(out, {"response", "warnings"});
  ASSERT_NE(warnings, nullptr);
  EXPECT_EQ((*warnings)[0].get<std::string>(),
            "orion/priority: high is not honoured in namespace \"default\" (allowed: serving, "
            "prod); the pod gets a best-effort share and runs best-effort");
  // In an allowed namespace it gets the slot.
  review["request"]["namespace"] = "serving";
  patch = PatchOf(ReviewPodAdmission(WriteJson(review), options));
  ASSERT_EQ(patch.size(), 1);
  EXPECT_EQ(OpText(patch[0]),
            R"(add /spec/containers/0/resources {"limits":{"orion.io/gpu-high":"1"}})");
}

// "op path", "move FROM -> PATH" or "add PATH VALUE" of any patch operation.
std::string AnyOpText(const JsonValue& op) {
  const std::string name = StringAt(op, {"op"});
  if (name == "move") return "move " + StringAt(op, {"from"}) + " -> " + StringAt(op, {"path"});
  if (name == "remove") return "remove " + StringAt(op, {"path"});
  return OpText(op);
}

std::vector<std::string> WarningsOf(const AdmissionReply& reply) {
  const JsonValue out = *ParseJson(reply.body);
  const JsonValue* warnings = At(out, {"response", "warnings"});
  std::vector<std::string> list;
  if (warnings != nullptr) {
    for (const JsonValue& w : *warnings) list.push_back(w.get<std::string>());
  }
  return list;
}

// The high-priority slot is its GPU's one place for a high-priority pod: outside the allowed
// namespaces a container that asks for it itself (no annotation needed) gets a share instead,
// with a warning saying why; before, such a pod held the GPU's only slot.
TEST(ReviewPodAdmission, HighSlotAskedForOutsideTheAllowedNamespacesBecomesAShare) {
  JsonValue review = ReviewWithPod("admission-review-pod-plain.json", R"({
    "metadata": {},
    "spec": {
      "initContainers": [
        {"name": "sidecar", "restartPolicy": "Always",
         "resources": {"limits": {"orion.io/gpu-high": "1"}}}],
      "containers": [
        {"name": "a", "resources": {"limits": {"orion.io/gpu-high": "1"},
                                    "requests": {"orion.io/gpu-high": "1"}}},
        {"name": "b", "resources": {"limits": {"orion.io/gpu-high": "1", "orion.io/gpu": "1"}}},
        {"name": "c", "resources": {"requests": {"orion.io/gpu-high": 2}}},
        {"name": "d"}]}})");
  review["request"]["namespace"] = "default";
  const AdmissionOptions options = {.high_priority_namespaces = {"serving", "prod"},
                                    .best_effort_mps_thread_percentage = 0};
  AdmissionReply reply = ReviewPodAdmission(WriteJson(review), options);
  JsonValue patch = PatchOf(reply);
  std::vector<std::string> ops;
  for (const JsonValue& op : patch) ops.push_back(AnyOpText(op));
  EXPECT_EQ(ops, (std::vector<std::string>{
                     "move /spec/containers/0/resources/limits/orion.io~1gpu-high -> "
                     "/spec/containers/0/resources/limits/orion.io~1gpu",
                     "move /spec/containers/0/resources/requests/orion.io~1gpu-high -> "
                     "/spec/containers/0/resources/requests/orion.io~1gpu",
                     "remove /spec/containers/1/resources/limits/orion.io~1gpu-high",
                     "move /spec/containers/2/resources/requests/orion.io~1gpu-high -> "
                     "/spec/containers/2/resources/requests/orion.io~1gpu",
                     R"(add /spec/containers/2/resources/limits {"orion.io/gpu":2})",
                     "move /spec/initContainers/0/resources/limits/orion.io~1gpu-high -> "
                     "/spec/initContainers/0/resources/limits/orion.io~1gpu"}))
      << WriteJson(patch);
  const std::vector<std::string> warnings = WarningsOf(reply);
  ASSERT_EQ(warnings.size(), 4u);
  EXPECT_EQ(warnings[0], "container \"a\" asks for orion.io/gpu-high, which only pods in "
                         "namespaces serving, prod may hold (not \"default\"): it gets "
                         "orion.io/gpu instead and runs best-effort");
  EXPECT_NE(warnings[3].find("init container \"sidecar\""), std::string::npos);

  // Annotated best-effort or high, the same: the slot's ask becomes a share and no second share
  // is added beside it.
  for (const char* priority : {"best-effort", "high"}) {
    review = ReviewWithPod("admission-review-pod-plain.json", absl::StrCat(R"({
      "metadata": {"annotations": {"orion/priority": ")", priority, R"("}},
      "spec": {"containers": [{"name": "a", "resources": {"limits": {"orion.io/gpu-high": "1"}}}]}})"));
    review["request"]["namespace"] = "default";
    patch = PatchOf(ReviewPodAdmission(WriteJson(review), options));
    ASSERT_EQ(patch.size(), 1u) << priority << ": " << WriteJson(patch);
    EXPECT_EQ(AnyOpText(patch[0]), "move /spec/containers/0/resources/limits/orion.io~1gpu-high -> "
                                   "/spec/containers/0/resources/limits/orion.io~1gpu");
  }
  // In an allowed namespace (or with no list) the ask is left alone.
  review["request"]["namespace"] = "serving";
  EXPECT_EQ(At(*ParseJson(ReviewPodAdmission(WriteJson(review), options).body),
               {"response", "patch"}),
            nullptr);
}

// A best-effort pod of an allowed namespace whose container asks for the slot gets no share
// beside it (before: orion.io/gpu was added, two devices); a warning says it holds the slot.
TEST(ReviewPodAdmission, NoShareIsAddedBesideTheHighSlot) {
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "best-effort"}},
    "spec": {"containers": [{"name": "a", "resources": {"limits": {"orion.io/gpu-high": "1"}}}]}})");
  AdmissionReply reply = ReviewPodAdmission(WriteJson(review), {.best_effort_mps_thread_percentage = 0});
  EXPECT_EQ(At(*ParseJson(reply.body), {"response", "patch"}), nullptr);
  const std::vector<std::string> warnings = WarningsOf(reply);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("container \"a\" asks for orion.io/gpu-high though the pod is "
                             "best-effort: left as asked, no orion.io/gpu added"),
            std::string::npos)
      << warnings[0];
}

TEST(ReviewPodAdmission, PodWithoutPriorityIsAdmittedUnchanged) {
  AdmissionReply reply = ReviewPodAdmission(ReadTestdata("admission-review-pod-plain.json"), {});
  ASSERT_EQ(reply.http_status, 200);
  JsonValue review = *ParseJson(reply.body);
  EXPECT_EQ(StringAt(review, {"response", "uid"}), "e911857d-c318-11e8-bbad-025000000001");
  EXPECT_TRUE(At(review, {"response", "allowed"})->get<bool>());
  EXPECT_EQ(At(review, {"response", "patch"}), nullptr);
}

TEST(ReviewPodAdmission, OrionContainersSelectsAndExistingRequestsAreKept) {
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "best-effort",
                                 "orion/containers": "trainer, ghost"}},
    "spec": {"containers": [
      {"name": "sidecar"},
      {"name": "trainer", "resources": {"requests": {"orion.io/gpu": "2"}}}]}})");
  AdmissionReply reply = ReviewPodAdmission(WriteJson(review), {});
  ASSERT_EQ(reply.http_status, 200);
  JsonValue patch = PatchOf(reply);
  ASSERT_EQ(patch.size(), 3);  // two MPS variables, then the share
  EXPECT_EQ(OpText(patch[2]),
            R"(add /spec/containers/1/resources/limits {"orion.io/gpu":"2"})");
  JsonValue out = *ParseJson(reply.body);
  const JsonValue* warnings = At(out, {"response", "warnings"});
  ASSERT_NE(warnings, nullptr);
  EXPECT_NE(WriteJson(*warnings).find("ghost"), std::string::npos);
}

TEST(ReviewPodAdmission, WholeGpuAndAlreadySharedContainersGetNoShare) {
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "urgent"}},
    "spec": {"containers": [
      {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
      {"name": "b", "resources": {"limits": {"orion.io/gpu": "1"}}}]}})");
  AdmissionReply reply = ReviewPodAdmission(WriteJson(review), {.best_effort_mps_thread_percentage = 0});
  ASSERT_EQ(reply.http_status, 200);
  JsonValue out = *ParseJson(reply.body);
  EXPECT_EQ(At(out, {"response", "patch"}), nullptr);
  // The malformed priority is reported to the user as an admission warning.
  EXPECT_NE(WriteJson(*At(out, {"response", "warnings"})).find("orion/priority"),
            std::string::npos);
}

TEST(ReviewPodAdmission, BestEffortContainersGetMpsPriorityAndSmShareUnlessTheySetThem) {
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "best-effort"}},
    "spec": {"containers": [
      {"name": "a"},
      {"name": "b", "env": [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "20"}],
       "resources": {"limits": {"orion.io/gpu": "1"}}},
      {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})");
  JsonValue patch = PatchOf(ReviewPodAdmission(WriteJson(review), {}));
  ASSERT_EQ(patch.size(), 4) << WriteJson(patch);
  // a: no env list yet (one op creates it, the next appends), then its share.
  const JsonValue& create = patch[0];
  EXPECT_EQ(StringAt(create, {"path"}), "/spec/containers/0/env");
  ASSERT_EQ(At(create, {"value"})->size(), 1);
  const JsonValue& priority = At(create, {"value"})->at(0);
  EXPECT_EQ(StringAt(priority, {"name"}), "CUDA_MPS_CLIENT_PRIORITY");
  EXPECT_EQ(StringAt(priority, {"value"}), "1");
  EXPECT_EQ(StringAt(patch[1], {"path"}), "/spec/containers/0/env/-");
  EXPECT_EQ(StringAt(patch[1], {"value", "name"}),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  EXPECT_EQ(StringAt(patch[1], {"value", "value"}), "50");
  EXPECT_EQ(StringAt(patch[2], {"path"}), "/spec/containers/0/resources");
  // b sets its own SM share and already has the resource: only the priority is added.
  EXPECT_EQ(StringAt(patch[3], {"path"}), "/spec/containers/1/env/-");
  EXPECT_EQ(StringAt(patch[3], {"value", "name"}), "CUDA_MPS_CLIENT_PRIORITY");
  // c uses a whole GPU: untouched.
}

TEST(ReviewPodAdmission, MpsThreadPercentageAnnotationOverridesTheDefault) {
  auto share_of = [](const std::string& annotation, std::string* warnings) {
    JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
      "metadata": {"annotations": {"orion/priority": "best-effort",
                                   "orion/mps-thread-percentage": ")" + annotation + R"("}},
      "spec": {"containers": [{"name": "a", "env": []}]}})");
    AdmissionReply reply = ReviewPodAdmission(WriteJson(review), {.best_effort_mps_thread_percentage = 40});
    const JsonValue out = *ParseJson(reply.body);
    const JsonValue* w = At(out, {"response", "warnings"});
    *warnings = w ? WriteJson(*w) : "";
    JsonValue patch = PatchOf(reply);
    return StringAt(patch[1], {"value", "value"});
  };
  std::string warnings;
  EXPECT_EQ(share_of("30", &warnings), "30");
  EXPECT_EQ(warnings, "");
  EXPECT_EQ(share_of("150", &warnings), "40");
  EXPECT_NE(warnings.find("orion/mps-thread-percentage"), std::string::npos) << warnings;
  EXPECT_EQ(share_of("half", &warnings), "40");
  EXPECT_NE(warnings.find("[0, 100]"), std::string::npos) << warnings;
}

TEST(ReviewPodAdmission, MpsThreadPercentageZeroOptsAPodOut) {
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "best-effort",
                                 "orion/mps-thread-percentage": "0"}},
    "spec": {"containers": [{"name": "a"}]}})");
  JsonValue patch = PatchOf(ReviewPodAdmission(WriteJson(review), {}));
  ASSERT_EQ(patch.size(), 1);  // the share only
  EXPECT_EQ(StringAt(patch[0], {"path"}), "/spec/containers/0/resources");
}

TEST(ReviewPodAdmission, HighPriorityPodsGetNoMpsVariables) {
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"({
    "metadata": {"annotations": {"orion/priority": "high"}},
    "spec": {"containers": [{"name": "a"}]}})");
  JsonValue patch = PatchOf(ReviewPodAdmission(WriteJson(review), {}));
  ASSERT_EQ(patch.size(), 1);
  EXPECT_EQ(StringAt(patch[0], {"path"}), "/spec/containers/0/resources");
}

TEST(ReviewPodAdmission, CustomResourceName) {
  AdmissionReply reply = ReviewPodAdmission(ReadTestdata("admission-review-pod-high.json"),
                                            {.resource_name = "example.com/gpu-share",
                                             .high_resource_name = "example.com/gpu-high"});
  JsonValue patch = PatchOf(reply);
  EXPECT_EQ(StringAt(patch[0], {"path"}),
            "/spec/containers/0/resources/limits/example.com~1gpu-high");
}

TEST(ReviewPodAdmission, MalformedBodiesGetAClear400) {
  struct Case {
    std::string body;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"", "not JSON"},
      {"{\"kind\": \"AdmissionReview\", ", "not JSON"},
      {"<html>hello</html>", "not JSON"},
      {"[1, 2, 3]", "not an AdmissionReview"},
      {R"({"kind": "Pod", "apiVersion": "v1"})", "not an AdmissionReview"},
      {R"({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1",
           "request": {"uid": "x"}})",
       "admission.k8s.io/v1beta1"},
      {R"({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}})",
       "request.uid"},
      {R"({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"})", "request.uid"},
  };
  for (const Case& c : cases) {
    AdmissionReply reply = ReviewPodAdmission(c.body, {});
    EXPECT_EQ(reply.http_status, 400) << c.body;
    absl::StatusOr<JsonValue> err = ParseJson(reply.body);
    ASSERT_TRUE(err.ok()) << reply.body;
    EXPECT_NE(StringAt(*err, {"error"}).find(c.expected), std::string::npos)
        << c.body << " -> " << reply.body;
  }
}

TEST(ReviewPodAdmission, ReviewWhoseObjectIsNoPodIsAdmittedWithAWarning) {
  JsonValue review = ReviewWithPod("admission-review-pod-high.json", R"("just a string")");
  AdmissionReply reply = ReviewPodAdmission(WriteJson(review), {});
  ASSERT_EQ(reply.http_status, 200);
  JsonValue out = *ParseJson(reply.body);
  EXPECT_TRUE(At(out, {"response", "allowed"})->get<bool>());
  EXPECT_EQ(At(out, {"response", "patch"}), nullptr);
  EXPECT_NE(At(out, {"response", "warnings"}), nullptr);
}

TEST(EscapeJsonPointer, Rfc6901) {
  EXPECT_EQ(EscapeJsonPointer("orion.io/gpu"), "orion.io~1gpu");
  EXPECT_EQ(EscapeJsonPointer("a~b/c"), "a~0b~1c");
}

}  // namespace
}  // namespace orion::agent
