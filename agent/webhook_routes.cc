// HTTP routes of the admission webhook (see webhook_routes.h).
#include "agent/webhook_routes.h"

namespace orion::agent {

std::map<std::string, HttpEndpoint::Handler> WebhookRoutes(const AdmissionOptions& options) {
  return {
      {"/mutate",
       [options](const HttpRequest& r) {
         if (r.method != "POST") {
           return HttpReply{405, "application/json",
                            R"({"error":"orion webhook: POST an AdmissionReview to /mutate"})"};
         }
         AdmissionReply reply = ReviewPodAdmission(r.body, options);
         return HttpReply{reply.http_status, "application/json", reply.body};
       }},
  };
}

std::map<std::string, HttpEndpoint::Handler> WebhookHealthRoutes() {
  auto ok = [](const HttpRequest&) { return HttpReply{200, "text/plain", "ok\n"}; };
  return {{"/healthz", ok}, {"/readyz", ok}};
}

}  // namespace orion::agent
