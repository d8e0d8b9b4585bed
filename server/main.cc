// orion-server: the per-node GPU sharing scheduler. Reads a YAML config, serves the client socket
// and board, the admin gRPC API and /metrics; SIGTERM/SIGINT shut it down cleanly (socket and board
// removed, clients released).
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "orion_version.h"
#include "server/config.h"
#include "server/orion_server.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: orion-server [--config FILE] [--print-default-config] [--check-config]\n"
               "                    [--version]\n"
               "  --config FILE            YAML config (default: built-in defaults)\n"
               "  --print-default-config   print the documented default config and exit\n"
               "  --check-config           validate the config and exit\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (a == "--print-default-config") {
      std::fputs(orion::server::DefaultConfigYaml(), stdout);
      return 0;
    } else if (a == "--check-config") {
      check_only = true;
    } else if (a == "--version") {
      std::printf("orion-server %s\n", ORION_VERSION_LINE);
      return 0;
    } else if (a == "-h" || a == "--help") {
      Usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "orion-server: unknown argument '%s'\n", a.c_str());
      Usage(stderr);
      return 2;
    }
  }
  auto config = config_path.empty()
                    ? orion::server::ParseServerConfig("", "<defaults>")
                    : orion::server::LoadServerConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "orion-server: invalid config: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  if (check_only) {
    std::printf("%s: ok\n", config->source.c_str());
    return 0;
  }
  // Block the signals in every thread; one thread waits for them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = orion::server::OrionServer::Start(*config, {});
  if (!server.ok()) {
    std::fprintf(stderr, "orion-server: cannot start: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr,
               "orion-server: node %s, %u GPU(s) known, mode %s\n"
               "  clients:  %s (board %s)\n  admin:    %s (port %d; gRPC health + reflection)\n"
               "  metrics:  http://%s/metrics (port %d)\n",
               config->node_name.c_str(), (*server)->state().board().num_gpus(),
               orion::server::GateModeName(config->policy.mode), config->socket_path.c_str(),
               (*server)->state().board().sealed() ? "sealed read-only" : "NOT sealed",
               config->admin_address.c_str(), (*server)->admin_port(),
               config->metrics_address.c_str(), (*server)->metrics_port());
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "orion-server: %s received, shutting down\n", strsignal(sig));
  (*server)->Shutdown();
  return 0;
}
