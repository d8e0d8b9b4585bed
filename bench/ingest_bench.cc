// Event ingestion benchmark: how many launch events per second orion-server's drain loop
// consumes on one core (goal: >= 5 million). Rings of 64 clients are filled with launch events
// (kernel names known, timings sampled, as the interposer produces them), then drained through
// NodeState::DrainOnce, which does all the per-event work: profiles, timeline, busy time.
//   orion-bench-ingest [rounds]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "server/node_state.h"

using namespace orion;

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 200;
  auto cfg = *server::ParseServerConfig("", "<bench>");
  cfg.gpus = {"GPU-00000000-0000-0000-0000-000000000000"};
  auto board = server::NodeBoard::Create();
  if (!board.ok()) {
    std::fprintf(stderr, "%s\n", std::string(board.status().message()).c_str());
    return 1;
  }
  server::NodeState state(cfg, std::move(*board));
  server::PeerIdentity peer = server::IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  constexpr int kClients = 64;
  std::vector<uint32_t> slots;
  for (int c = 0; c < kClients; ++c) {
    contract::RegisterRequest r{};
    std::snprintf(r.gpu_uuid, sizeof(r.gpu_uuid), "%s", cfg.gpus[0].c_str());
    r.requested_priority = c % 4 == 0 ? 1 : 0;
    slots.push_back(state.Register(peer, r).slot);
  }
  server::NodeBoard& b = state.board();
  // Names once per function, as the interposer sends them.
  for (uint32_t s : slots) {
    for (uint64_t f = 0; f < 200; ++f) {
      contract::Event e{};
      e.kind = contract::EventKind::kKernelName;
      e.func = 0x1000 + f;
      std::snprintf(e.name, sizeof(e.name), "void at::native::kernel_%lu<float>", f);
      b.area(s)->ring.TryPush(e);
    }
  }
  state.DrainOnce(server::MonotonicNs());
  uint64_t events = 0;
  double drain_s = 0;
  for (int round = 0; round < rounds; ++round) {
    for (uint32_t s : slots) {
      contract::Event e{};
      for (uint32_t i = 0; i < contract::kRingCapacity; ++i) {
        e.kind = i % 64 == 63 ? contract::EventKind::kKernelTime : contract::EventKind::kLaunch;
        e.func = 0x1000 + (i * 7) % 200;  // ~200 distinct kernels, like a ResNet50 step
        e.cpu_ns = server::MonotonicNs();
        e.grid[0] = 80; e.grid[1] = 1; e.grid[2] = 1;
        e.block[0] = 256; e.block[1] = 1; e.block[2] = 1;
        e.duration_ns = 25000;
        b.area(s)->ring.TryPush(e);
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    events += state.DrainOnce(server::MonotonicNs());
    drain_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("result events=%lu seconds=%.3f events_per_s=%.0f ns_per_event=%.1f\n",
              static_cast<unsigned long>(events), drain_s, events / drain_s,
              drain_s * 1e9 / static_cast<double>(events));
  return 0;
}
