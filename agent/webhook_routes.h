// The webhook's HTTP routes: POST /mutate (AdmissionReview v1), /healthz, /readyz. Shared by
// `orion-agent webhook` and its tests.
//
// Usage:
//   HttpEndpoint::Start({.listen_address = ":8443", .tls_cert_file = ..., .tls_key_file = ...},
//                       WebhookRoutes({.resource_name = "orion.io/gpu"}));
#pragma once

#include <map>
#include <string>

#include "agent/admission.h"
#include "agent/http_endpoint.h"

namespace orion::agent {

std::map<std::string, HttpEndpoint::Handler> WebhookRoutes(const AdmissionOptions& options);

}  // namespace orion::agent
