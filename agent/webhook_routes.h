// The webhook's HTTP routes: POST /mutate (AdmissionReview v1) on the HTTPS port, and /healthz
// and /readyz on a plain-HTTP port of their own, so the kubelet's probes never queue behind
// clients of /mutate. Shared by `orion-agent webhook` and its tests.
//
// Usage:
//   HttpEndpoint::Start({.listen_address = ":8443", .tls_cert_file = ..., .tls_key_file = ...},
//                       WebhookRoutes({.resource_name = "orion.io/gpu"}));
//   HttpEndpoint::Start({.listen_address = ":8081"}, WebhookHealthRoutes());
#pragma once

#include <map>
#include <string>

#include "agent/admission.h"
#include "agent/http_endpoint.h"

namespace orion::agent {

std::map<std::string, HttpEndpoint::Handler> WebhookRoutes(const AdmissionOptions& options);
std::map<std::string, HttpEndpoint::Handler> WebhookHealthRoutes();

}  // namespace orion::agent
