// Fuzz target: Orion's kernel profile CSV (orion::server::ParseOrionCsv), as orion-server reads it
// from kernel_profiles files. Any text must give rows or an error naming the file; rows that parse
// must survive the server's own round trip: applied to a profile book, exported with ToOrionCsv
// and parsed again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include "server/kernel_profile.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orion::server;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto rows = ParseOrionCsv(text, "fuzz.csv");
  if (!rows.ok()) {
    Check(rows.status().message().rfind("fuzz.csv", 0) == 0);
    return 0;
  }
  std::unordered_map<std::string, OrionProfileRow> known;
  KernelProfileBook book;
  uint64_t func = 1;
  for (const OrionProfileRow& r : *rows) {
    Check(r.kclass == KernelClass::kUnknown || r.kclass == KernelClass::kMemory ||
          r.kclass == KernelClass::kCompute);
    known[OrionKernelKey(r.name)] = r;
    book.OnLaunch(func, r.sm_usage, 256);
    book.OnName(func, r.name);
    ++func;
  }
  book.ApplyKnown(known);
  auto again = ParseOrionCsv(book.ToOrionCsv(), "export.csv");
  Check(again.ok() && again->size() == rows->size());
  return 0;
}
