// Fuzz target: orion-server over shared memory that tenants wrote. Each client writes its own
// client area and, with the other clients of its GPU, the GPU's gate area (docs/security.md);
// where the kernel cannot seal the board, the board too. Whatever bytes those hold (rings,
// counters, gate words, and the server-written fields), the server's drain, policy loop, gate
// checks and queries must neither crash nor trip a sanitizer.
//
// One NodeState over a real NodeBoard (memfds) with two GPUs and four clients registered through
// NodeState::Register as the registration listener does (no socket): per GPU a high-priority
// client with a latency target and a best-effort one. Input:
//
//   bytes [i*kWindow, (i+1)*kWindow), i < kClients: laid over the first kWindow bytes of client
//       i's ClientArea: its header and counters, the ring's head/tail/dropped and the first
//       kWindowEntries ring entries (sequence word + payload);
//   then kGateWindow bytes per GPU, laid over the start of its gate area: header, gate words and
//       the first kGateSlots slots' entries;
//   then kHeadBytes, if the input is that long: laid over the start of the board, the header and
//       the GPU states (writable by tenants only where the board cannot be sealed).
//
// Before each input the board regions are put back as they were after registration, so an input
// alone decides what the board holds. Then: DrainOnce and PolicyTick (on a virtual clock that
// lets a hole in a ring time out), ListClients, ListGpus, GetClient, GetKernelProfile, the
// metrics snapshot (and its Prometheus text), the timeline views; finally every client unregisters
// (draining its ring once more) and registers again, so no state carries over to the next input
// but the timelines and the counters.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "prometheus/text_serializer.h"
#include "server/board.h"
#include "server/metrics.h"
#include "server/node_state.h"

namespace {

using namespace orion;

constexpr size_t kClients = 4;
constexpr size_t kGpuCount = 2;
constexpr size_t kWindowEntries = 16;
constexpr size_t kRingOffset = offsetof(contract::ClientArea, ring);
constexpr size_t kWindow = kRingOffset + offsetof(contract::EventRing, entries) +
                           kWindowEntries * sizeof(contract::EventRing::Entry);
constexpr size_t kGateSlots = 8;
constexpr size_t kGateWindow =
    offsetof(contract::GateArea, slots) + kGateSlots * sizeof(contract::SlotGate);
constexpr size_t kHeadBytes = offsetof(contract::Board, slots);
static_assert(kWindow == 2944);
static_assert(kGateWindow == 640);
static_assert(kHeadBytes == 4352);

const char* const kGpus[] = {"GPU-11111111-2222-3333-4444-555555555555",
                             "GPU-66666666-7777-8888-9999-000000000000"};

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "board_drain_fuzz: %s\n", what);
    std::abort();
  }
}

struct Fixture {
  std::unique_ptr<server::NodeState> state;
  std::unique_ptr<server::MetricsCollector> metrics;
  server::PeerIdentity peer;
  std::array<contract::RegisterRequest, kClients> requests{};
  std::array<uint32_t, kClients> ids{};
  std::array<uint32_t, kClients> slots{};
  std::vector<uint8_t> pristine_head;
  std::array<std::vector<uint8_t>, kGpuCount> pristine_gate;
  uint64_t now = 0;

  contract::Board& board() { return state->board().board(); }
  uint8_t* head() { return reinterpret_cast<uint8_t*>(&board()); }
  uint8_t* window(size_t i) { return reinterpret_cast<uint8_t*>(state->board().area(slots[i])); }
  uint8_t* gate(size_t g) { return reinterpret_cast<uint8_t*>(state->board().gate(g)); }

  void RegisterAll() {
    for (size_t i = 0; i < kClients; ++i) {
      const server::NodeState::Admission a = state->Register(peer, requests[i]);
      Check(a.status == contract::RegisterStatus::kOk, "registration failed");
      ids[i] = a.client_id;
      slots[i] = a.slot;
    }
  }
};

Fixture* MakeFixture() {
  auto* f = new Fixture;
  auto cfg = server::ParseServerConfig("", "<fuzz>");
  Check(cfg.ok(), "default config");
  cfg->gpus = {kGpus[0], kGpus[1]};
  cfg->timeline_spans_per_gpu = 1000;  // small, so the timeline ring wraps
  cfg->hp_latency_window = 100;
  auto board = server::NodeBoard::Create();
  Check(board.ok(), "cannot create the board");
  f->state = std::make_unique<server::NodeState>(*cfg, std::move(*board));
  f->metrics = std::make_unique<server::MetricsCollector>(f->state.get(), "fuzz-node");

  // Known kernels, so that kernel names arriving in rings are matched against a profile.
  server::OrionProfileRow gemm;
  gemm.name = "volta_sgemm_128x64_nn";
  gemm.kclass = contract::KernelClass::kCompute;
  gemm.duration_ns = 41000;
  server::OrionProfileRow add;
  add.name = "void at::native::elementwise_kernel";
  add.kclass = contract::KernelClass::kMemory;
  f->state->ImportOrionProfile({gemm, add});

  f->peer.pid = getpid();
  f->peer.uid = getuid();
  f->peer.gid = getgid();
  f->peer.process_name = "fuzz-client";
  for (size_t i = 0; i < kClients; ++i) {
    contract::RegisterRequest& r = f->requests[i];
    r.header = contract::MakeHeader(contract::MessageType::kRegister, sizeof(r));
    r.claimed_pid = static_cast<uint32_t>(getpid());
    std::snprintf(r.gpu_uuid, sizeof(r.gpu_uuid), "%s", kGpus[i / 2]);
    const bool high = i % 2 == 0;
    r.requested_priority = static_cast<uint32_t>(high ? contract::Priority::kHigh
                                                      : contract::Priority::kBestEffort);
    r.requested_latency_target_us = high ? (i == 0 ? 2000 : 500) : 0;
    std::snprintf(r.process_name, sizeof(r.process_name), "fuzz-client-%zu", i);
  }
  f->RegisterAll();
  f->pristine_head.assign(f->head(), f->head() + kHeadBytes);
  for (size_t g = 0; g < kGpuCount; ++g) {
    f->pristine_gate[g].assign(f->gate(g), f->gate(g) + kGateWindow);
  }
  f->now = server::MonotonicNs();
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* const f = MakeFixture();
  server::NodeState& state = *f->state;

  // What the tenants wrote.
  // (Client areas are fresh: every client registered again after the last input.)
  std::memcpy(f->head(), f->pristine_head.data(), kHeadBytes);
  for (size_t i = 0; i < kClients; ++i) {
    const size_t begin = i * kWindow;
    if (size > begin) std::memcpy(f->window(i), data + begin, std::min(kWindow, size - begin));
  }
  for (size_t g = 0; g < kGpuCount; ++g) {
    std::memcpy(f->gate(g), f->pristine_gate[g].data(), kGateWindow);
    const size_t begin = kClients * kWindow + g * kGateWindow;
    if (size > begin) std::memcpy(f->gate(g), data + begin, std::min(kGateWindow, size - begin));
  }
  if (const size_t begin = kClients * kWindow + kGpuCount * kGateWindow; size > begin) {
    std::memcpy(f->head(), data + begin, std::min(kHeadBytes, size - begin));
  }

  // The server's loops: drain ~every 1 ms, policy ~every 100 ms; a hole in a ring is skipped
  // after 200 ms.
  constexpr uint64_t kMs = 1000000;
  f->now += kMs;
  size_t drained = state.DrainOnce(f->now);
  state.PolicyTick(f->now);
  drained += state.DrainOnce(f->now + 250 * kMs);
  drained += state.DrainOnce(f->now + 500 * kMs);
  f->now += 500 * kMs;
  state.PolicyTick(f->now);

  // What the admin API and /metrics read.
  const std::vector<server::ClientView> clients = state.ListClients({});
  Check(clients.size() == kClients, "ListClients lost a client");
  const std::vector<server::GpuView> gpus = state.ListGpus();
  for (size_t i = 0; i < kClients; ++i) {
    Check(state.GetClient(f->ids[i]).ok(), "GetClient");
    auto profile = state.GetKernelProfile(f->ids[i]);
    Check(profile.ok(), "GetKernelProfile");
  }
  const server::MetricsSnapshot snap = state.Snapshot();
  Check(snap.clients.size() == kClients, "Snapshot lost a client");
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, f->metrics->Collect());
  for (uint32_t g = 0; g < 2; ++g) {
    auto window = state.TimelineWindow(g, 0, 0, 0);
    Check(window.ok(), "TimelineWindow of a GPU of the board");
    auto after = state.TimelineAfter(g, 0, 0);
    Check(after.ok(), "TimelineAfter of a GPU of the board");
  }

  static const bool debug = std::getenv("ORION_FUZZ_DEBUG") != nullptr;
  if (debug) {
    std::fprintf(stderr, "board_drain_fuzz: %zu bytes, %zu events drained, %zu metrics bytes\n",
                 size, drained, text.str().size());
    for (const server::ClientView& c : clients) {
      std::fprintf(stderr, "  client %u gpu %u: kernels %lu, dropped %lu\n", c.client_id, c.gpu,
                   static_cast<unsigned long>(c.kernels_launched),
                   static_cast<unsigned long>(c.events_dropped));
    }
    for (const server::GpuView& g : gpus) {
      auto policy = state.GetPolicy(g.index);
      std::fprintf(stderr, "  gpu %u: %u clients, be_budget_us %lu\n", g.index, g.clients,
                   policy.ok() ? static_cast<unsigned long>(policy->knobs.be_budget_ns / 1000) : 0ul);
    }
  }

  // Clients go away (their rings drained once more) and come back on a clean board.
  std::memcpy(f->head(), f->pristine_head.data(), kHeadBytes);
  for (size_t i = 0; i < kClients; ++i) state.Unregister(f->ids[i]);
  f->RegisterAll();
  return 0;
}
