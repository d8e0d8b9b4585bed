// Fuzz target: orion-agent's mutating admission webhook (orion::agent::ReviewPodAdmission), which
// the API server calls with an AdmissionReview JSON body. Any body must give a 200 AdmissionReview
// or a 400 JSON error, never a crash; the reply must be JSON, and a patch, when there is one,
// base64 of a JSON list of operations.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/escaping.h"
#include "agent/admission.h"
#include "agent/json.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orion::agent;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const AdmissionReply reply = ReviewPodAdmission(body, AdmissionOptions{});
  Check(reply.http_status == 200 || reply.http_status == 400 || reply.http_status == 413);
  auto out = ParseJson(reply.body);
  Check(out.ok());
  if (reply.http_status != 200) return 0;
  Check(StringAt(*out, {"kind"}) == "AdmissionReview");
  const JsonValue* allowed = At(*out, {"response", "allowed"});
  Check(allowed != nullptr && allowed->is_boolean() && allowed->get<bool>());
  const std::string patch64 = StringAt(*out, {"response", "patch"});
  if (!patch64.empty()) {
    std::string patch;
    Check(absl::Base64Unescape(patch64, &patch));
    auto ops = ParseJson(patch);
    Check(ops.ok() && ops->is_array());
  }
  return 0;
}
