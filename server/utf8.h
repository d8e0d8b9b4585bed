// Tenant-supplied strings made safe to show: process names, comm, kernel and NVTX range names and
// GPU UUIDs come from memory a tenant writes, and reach protobuf messages (whose string fields
// must be UTF-8, or serialization fails and the whole admin answer with it), timelines and
// Prometheus labels. They are made valid UTF-8 once, where they enter the server.
//
// Usage:
//   std::string name = SanitizeUtf8(raw);   // "\xff\xfeabc" -> "\uFFFD\uFFFDabc"
#pragma once

#include <string>
#include <string_view>

namespace orion::server {

// `text` with every byte that does not start a well-formed UTF-8 sequence (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF) replaced by U+FFFD, and control
// characters other than tab by U+FFFD too. Valid text comes back unchanged.
std::string SanitizeUtf8(std::string_view text);

}  // namespace orion::server
