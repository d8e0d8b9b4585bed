// Fuzz target: the admin API tokens file (orion::server::ParseAdminTokens) and the per-call check
// (AdminAuth::Authorize). Any text must give tokens or an error naming the file; every token that
// parses must then authorize its holder, and no other header may pass as it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/admin_auth.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using orion::server::AdminAuth;
  using orion::server::AdminRole;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto tokens = orion::server::ParseAdminTokens(text, "fuzz-tokens");
  if (!tokens.ok()) {
    Check(tokens.status().message().rfind("fuzz-tokens", 0) == 0);
    // The same bytes as an authorization header against a fixed token set.
    AdminAuth auth({{AdminRole::kReader, "reader", "0123456789abcdef-reader"}});
    auto who = auth.Authorize(text, "", AdminRole::kReader);
    if (who.ok()) Check(who->name == "reader");
    return 0;
  }
  Check(!tokens->empty());
  const std::vector<orion::server::AdminToken> copy = *tokens;
  AdminAuth auth(std::move(*tokens));
  Check(auth.enabled());
  for (const auto& t : copy) {
    Check(t.token.size() >= 16 && !t.name.empty());
    auto who = auth.Authorize("Bearer " + t.token, "", AdminRole::kReader);
    Check(who.ok() && who->role == t.role);
    auto op = auth.Authorize("Bearer " + t.token, "", AdminRole::kOperator);
    Check(op.ok() == (t.role == AdminRole::kOperator));
  }
  auto who = auth.Authorize(text, "", AdminRole::kReader);
  if (who.ok()) {
    bool known = false;
    for (const auto& t : copy) known = known || who->name == t.name;
    Check(known);
  }
  return 0;
}
