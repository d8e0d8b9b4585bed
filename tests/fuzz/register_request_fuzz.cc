// Fuzz target: the registration message a client sends on orion-server's Unix socket. The input's
// bytes fill a contract::RegisterRequest (shorter inputs leave the rest zero; bytes_read is the
// input's length, as a short or long read would report it); ValidateRegisterRequest must refuse
// it with an error or accept it, and an accepted one goes through DecidePolicy as the
// registration listener does (standalone process, default config; then with a config rule whose
// glob is matched against the request's process name).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "server/admission.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

bool ValidPriority(orion::contract::Priority p) {
  return p == orion::contract::Priority::kHigh || p == orion::contract::Priority::kBestEffort;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orion;
  contract::RegisterRequest request{};
  std::memcpy(&request, data, std::min(size, sizeof(request)));
  const absl::Status valid = server::ValidateRegisterRequest(request, size);
  if (!valid.ok()) {
    Check(!valid.message().empty());
    return 0;
  }
  Check(size == sizeof(request));
  const server::PeerIdentity peer;
  const server::ServerConfig config;
  const server::ClientPolicy p = server::DecidePolicy(peer, request, config, nullptr, nullptr);
  Check(ValidPriority(p.priority));

  static const server::ServerConfig* with_rule = [] {
    auto* c = new server::ServerConfig;
    server::PriorityRule rule;
    rule.process_glob = "serve*[0-9]";
    rule.priority = contract::Priority::kHigh;
    rule.latency_target_us = 5000;
    c->rules.push_back(rule);
    c->trust_client_requests = false;
    return c;
  }();
  const contract::Priority override_priority = contract::Priority::kBestEffort;
  const server::ClientPolicy q =
      server::DecidePolicy(peer, request, *with_rule, nullptr, &override_priority);
  Check(q.priority == contract::Priority::kBestEffort && q.source == "admin");
  return 0;
}
