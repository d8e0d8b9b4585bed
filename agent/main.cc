// orion-agent: one per GPU node. Installs the interposer on the host, serves the kubelet device
// plugin for orion.io/gpu and orion.io/gpu-high (and, with --dra, the DRA kubelet plugin of
// driver gpu-share.orion.io), watches this node's pods and feeds their orion/* annotations (or
// their DRA claims' settings) to orion-server, and answers /healthz and /readyz. `orion-agent webhook` instead serves the
// mutating admission webhook (a Deployment in the chart).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "agent/agent_sync_client.h"
#include "agent/claim_policy_sink.h"
#include "agent/device_plugin.h"
#include "agent/dra_plugin.h"
#include "agent/gpu_discovery.h"
#include "agent/http_endpoint.h"
#include "agent/interposer_install.h"
#include "kube/kube_api.h"
#include "agent/pod_gpus.h"
#include "agent/pod_watcher.h"
#include "agent/webhook_routes.h"
#include "orion_version.h"

namespace orion::agent {
namespace {

constexpr char kUsage[] =
    "usage: orion-agent [FLAGS]            node agent (DaemonSet)\n"
    "       orion-agent webhook [FLAGS]    mutating admission webhook\n"
    "       orion-agent gpus [--proc-gpus-dir DIR]   list GPUs and whether they are shared\n"
    "node agent flags (--name=value):\n"
    "  --node-name            default $NODE_NAME\n"
    "  --resource-name        extended resource (orion.io/gpu)\n"
    "  --shares-per-gpu       devices advertised per GPU (8)\n"
    "  --high-resource-name   extended resource of high-priority containers (orion.io/gpu-high)\n"
    "  --high-priority-per-gpu  its devices per GPU (1; 0: not advertised, and the webhook\n"
    "                         must then run with --high-resource-name= so high pods get shares)\n"
    "  --gpus                 comma-separated GPU UUIDs (default: discover)\n"
    "  --proc-gpus-dir        /proc/driver/nvidia/gpus\n"
    "  --server-address       orion-server AgentSync target (unix:RUN_DIR-agent/agent.sock,\n"
    "                         orion-server's default beside the pods' run folder)\n"
    "  --device-plugin-dir    /var/lib/kubelet/device-plugins\n"
    "  --pod-resources-socket the kubelet's pod resources API, which tells the GPUs allocated\n"
    "                         to each pod to orion-server (/var/lib/kubelet/pod-resources/\n"
    "                         kubelet.sock; empty: not used, pods may use any GPU of the node)\n"
    "  --interposer           library to install (/opt/orion/lib/liborion_interpose.so)\n"
    "  --host-lib-dir         host folder receiving versions of it (/var/lib/orion)\n"
    "  --container-lib-dir    where pods see it (/usr/local/orion/lib)\n"
    "  --run-dir              server socket + board folder (/run/orion)\n"
    "  --device-list-strategy envvar | cdi-cri | cdi-annotations (envvar)\n"
    "  --cdi-kind             CDI device kind; names are KIND=<GPU UUID> (nvidia.com/gpu)\n"
    "  --mps-pipe-dir         MPS daemon pipe folder handed to containers (none)\n"
    "  --mps-shm-dir          host folder shared as /dev/shm with the MPS daemon (none)\n"
    "  --health-address       /healthz and /readyz (0.0.0.0:8081)\n"
    "  --kube-api-url         API server URL (default: in-cluster)\n"
    "  --kube-token-file, --kube-ca-file   with --kube-api-url\n"
    "  --no-device-plugin, --no-pod-watcher   run parts only\n"
    "  --dra                  also serve the DRA kubelet plugin of driver gpu-share.orion.io\n"
    "                         (resource.k8s.io/v1, Kubernetes 1.34): publishes this node's\n"
    "                         ResourceSlice, prepares claims as CDI specs\n"
    "  --dra-plugin-dir       its socket and checkpoint\n"
    "                         (/var/lib/kubelet/plugins/gpu-share.orion.io)\n"
    "  --dra-registry-dir     the kubelet's plugin registration folder\n"
    "                         (/var/lib/kubelet/plugins_registry)\n"
    "  --cdi-dir              where prepared claims' CDI specs go (/var/run/cdi)\n"
    "  --min-latency-target-ms  orion-server's policy.min_latency_target_ms (5): claims asking\n"
    "                         for a lower latencyTargetMs are refused at prepare (0: no floor)\n"
    "webhook flags:\n"
    "  --listen-address (0.0.0.0:8443) --tls-cert FILE --tls-key FILE --resource-name\n"
    "  --high-resource-name   what high-priority containers get instead of a share\n"
    "                         (orion.io/gpu-high; empty: a share like the others)\n"
    "  --high-priority-namespaces  comma-separated namespaces whose pods may be high priority\n"
    "                         (default: all); elsewhere a high pod gets a share\n"
    "  --health-address       /healthz and /readyz, plain HTTP on a listener of their own\n"
    "                         (0.0.0.0:8081)\n"
    "  --be-mps-thread-percentage (50)  SM share under MPS of best-effort pods (0: not set)\n";

using Flags = std::map<std::string, std::string>;

bool ParseFlags(int argc, char** argv, int first, Flags* flags) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) return false;
    a = a.substr(2);
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      (*flags)[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (a.rfind("no-", 0) == 0 || a == "help" || a == "dra") {
      (*flags)[a] = "true";
    } else if (i + 1 < argc) {
      (*flags)[a] = argv[++i];
    } else {
      return false;
    }
  }
  return true;
}

std::string Flag(const Flags& flags, const std::string& name, const std::string& fallback) {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

// Blocks SIGTERM/SIGINT in all threads; WaitForSignal returns when one arrives.
sigset_t BlockSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int WaitForSignal(const sigset_t& set) {
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

HttpReply Text(int status, const char* body) { return {status, "text/plain", body}; }

int RunWebhook(const Flags& flags) {
  const sigset_t signals = BlockSignals();
  AdmissionOptions options;
  options.resource_name = Flag(flags, "resource-name", options.resource_name);
  options.high_resource_name = Flag(flags, "high-resource-name", options.high_resource_name);
  for (absl::string_view ns :
       absl::StrSplit(Flag(flags, "high-priority-namespaces", ""), ',', absl::SkipEmpty())) {
    options.high_priority_namespaces.emplace_back(ns.data(), ns.size());
  }
  const std::string percentage = Flag(flags, "be-mps-thread-percentage",
                                      std::to_string(options.best_effort_mps_thread_percentage));
  if (!absl::SimpleAtoi(percentage, &options.best_effort_mps_thread_percentage) ||
      options.best_effort_mps_thread_percentage < 0 ||
      options.best_effort_mps_thread_percentage > 100) {
    std::fprintf(stderr, "orion-agent webhook: --be-mps-thread-percentage: expected an integer in "
                         "[0, 100] (0: leave unset), got \"%s\"\n", percentage.c_str());
    return 2;
  }
  HttpEndpoint::Options http;
  http.listen_address = Flag(flags, "listen-address", "0.0.0.0:8443");
  http.tls_cert_file = Flag(flags, "tls-cert", "");
  http.tls_key_file = Flag(flags, "tls-key", "");
  if (http.tls_cert_file.empty() || http.tls_key_file.empty()) {
    std::fprintf(stderr, "orion-agent webhook: --tls-cert and --tls-key are required "
                         "(the API server calls webhooks over HTTPS only)\n");
    return 2;
  }
  http.threads = 8;
  auto endpoint = HttpEndpoint::Start(http, WebhookRoutes(options));
  if (!endpoint.ok()) {
    std::fprintf(stderr, "orion-agent webhook: %s\n",
                 std::string(endpoint.status().message()).c_str());
    return 1;
  }
  const std::string health_address = Flag(flags, "health-address", "0.0.0.0:8081");
  auto health = HttpEndpoint::Start({.listen_address = health_address}, WebhookHealthRoutes());
  if (!health.ok()) {
    std::fprintf(stderr, "orion-agent webhook: health: %s\n",
                 std::string(health.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr,
               "orion-agent webhook: serving /mutate on %s (HTTPS, port %d), /healthz and "
               "/readyz on %s (HTTP, port %d)\n",
               http.listen_address.c_str(), (*endpoint)->port(), health_address.c_str(),
               (*health)->port());
  WaitForSignal(signals);
  return 0;
}

int RunNodeAgent(const Flags& flags) {
  const sigset_t signals = BlockSignals();
  const char* env_node = std::getenv("NODE_NAME");
  const std::string node_name = Flag(flags, "node-name", env_node ? env_node : "");
  const bool with_plugin = flags.count("no-device-plugin") == 0;
  const bool with_watcher = flags.count("no-pod-watcher") == 0;
  const bool with_dra = Flag(flags, "dra", "false") == "true";
  if ((with_watcher || with_dra) && node_name.empty()) {
    std::fprintf(stderr, "orion-agent: --node-name or $NODE_NAME is required\n");
    return 2;
  }

  std::atomic<bool> installed{false};
  DevicePluginConfig plugin_config;
  plugin_config.resource_name = Flag(flags, "resource-name", plugin_config.resource_name);
  plugin_config.plugin_dir = Flag(flags, "device-plugin-dir", plugin_config.plugin_dir);
  plugin_config.shares_per_gpu = std::atoi(Flag(flags, "shares-per-gpu", "8").c_str());
  if (plugin_config.shares_per_gpu < 1 || plugin_config.shares_per_gpu > 1000) {
    std::fprintf(stderr, "orion-agent: --shares-per-gpu must be 1..1000\n");
    return 2;
  }
  plugin_config.high_resource_name =
      Flag(flags, "high-resource-name", plugin_config.high_resource_name);
  const std::string high_per_gpu = Flag(flags, "high-priority-per-gpu", "1");
  if (!absl::SimpleAtoi(high_per_gpu, &plugin_config.high_per_gpu) ||
      plugin_config.high_per_gpu < 0 || plugin_config.high_per_gpu > 64 ||
      (plugin_config.high_per_gpu > 0 &&
       (plugin_config.high_resource_name.empty() ||
        plugin_config.high_resource_name == plugin_config.resource_name))) {
    std::fprintf(stderr, "orion-agent: --high-priority-per-gpu: expected 0..64 (0: no %s), got "
                 "\"%s\"; --high-resource-name must differ from --resource-name\n",
                 plugin_config.high_resource_name.c_str(), high_per_gpu.c_str());
    return 2;
  }
  plugin_config.layout.container_lib_dir =
      Flag(flags, "container-lib-dir", plugin_config.layout.container_lib_dir);
  plugin_config.layout.run_dir = Flag(flags, "run-dir", plugin_config.layout.run_dir);
  const std::string strategy = Flag(flags, "device-list-strategy", "envvar");
  if (!ParseDeviceListStrategy(strategy, &plugin_config.layout.device_list)) {
    std::fprintf(stderr, "orion-agent: --device-list-strategy: expected envvar, cdi-cri or "
                 "cdi-annotations, got \"%s\"\n", strategy.c_str());
    return 2;
  }
  plugin_config.layout.cdi_kind = Flag(flags, "cdi-kind", plugin_config.layout.cdi_kind);
  if (plugin_config.layout.cdi_kind.find('/') == std::string::npos ||
      plugin_config.layout.cdi_kind.find('=') != std::string::npos) {
    std::fprintf(stderr, "orion-agent: --cdi-kind: expected VENDOR/CLASS (nvidia.com/gpu), got "
                 "\"%s\"\n", plugin_config.layout.cdi_kind.c_str());
    return 2;
  }
  plugin_config.layout.mps_pipe_dir = Flag(flags, "mps-pipe-dir", "");
  plugin_config.layout.mps_shm_dir = Flag(flags, "mps-shm-dir", "");

  // 1. The interposer must be on the host before any pod is handed LD_PRELOAD of it.
  const std::string host_lib_dir = Flag(flags, "host-lib-dir", "/var/lib/orion");
  absl::StatusOr<std::string> version_dir = InstallInterposer(
      Flag(flags, "interposer", "/opt/orion/lib/liborion_interpose.so"), host_lib_dir);
  if (!version_dir.ok()) {
    std::fprintf(stderr, "orion-agent: interposer not installed: %s\n",
                 std::string(version_dir.status().message()).c_str());
  } else {
    std::fprintf(stderr, "orion-agent: interposer installed in %s\n", version_dir->c_str());
    plugin_config.layout.host_lib_dir = *version_dir;
    installed = true;
  }

  // 2. Device plugin.
  std::unique_ptr<DevicePlugin> plugin;
  const std::string gpus_flag = Flag(flags, "gpus", "");
  const std::string proc_gpus = Flag(flags, "proc-gpus-dir", "/proc/driver/nvidia/gpus");
  NvmlMigProbe nvml;
  std::mutex gpus_mu;
  std::string gpus_text;  // last discovery, for /gpus and the log
  // The node's shared GPUs: --gpus (numbered by their place in it) or those discovered.
  auto current_gpus = [&]() -> std::vector<Gpu> {
    if (!gpus_flag.empty()) {
      std::vector<Gpu> out;
      for (absl::string_view g : absl::StrSplit(gpus_flag, ',', absl::SkipEmpty())) {
        Gpu gpu;
        gpu.uuid = std::string(g.data(), g.size());
        gpu.minor = static_cast<int>(out.size());
        out.push_back(std::move(gpu));
      }
      return out;
    }
    const std::vector<Gpu> gpus = DiscoverGpus(proc_gpus, &nvml);
    const std::string text = DescribeGpus(gpus);
    std::lock_guard<std::mutex> lock(gpus_mu);
    if (text != gpus_text) {  // log each change once: a refused GPU is said plainly
      for (const Gpu& g : gpus) {
        if (!g.Shareable()) {
          std::fprintf(stderr, "orion-agent: GPU %s not shared: %s. Disable MIG on it "
                       "(nvidia-smi -i %s -mig 0) or keep this node out of the chart's "
                       "nodeSelector.\n", g.uuid.c_str(), g.refusal.c_str(), g.uuid.c_str());
        }
      }
      std::fprintf(stderr, "orion-agent: GPUs:\n%s", text.empty() ? "  (none found)\n" : text.c_str());
      gpus_text = text;
    }
    std::vector<Gpu> shared;
    for (const Gpu& g : gpus) {
      if (g.Shareable()) shared.push_back(g);
    }
    return shared;
  };
  auto uuids_of = [](const std::vector<Gpu>& gpus) {
    std::vector<std::string> out;
    for (const Gpu& g : gpus) out.push_back(g.uuid);
    return out;
  };
  // DRA devices are named by the GPU's device minor, which stays with the GPU across restarts.
  auto dra_gpus_of = [](const std::vector<Gpu>& gpus) {
    std::vector<DraGpu> out;
    for (size_t i = 0; i < gpus.size(); ++i) {
      out.push_back({.index = gpus[i].minor >= 0 ? gpus[i].minor : static_cast<int>(i),
                     .uuid = gpus[i].uuid,
                     .product = gpus[i].model,
                     .memory_bytes = gpus[i].memory_bytes});
    }
    return out;
  };
  if (with_plugin && installed) {
    plugin = std::make_unique<DevicePlugin>(plugin_config);
    plugin->SetGpus(uuids_of(current_gpus()));
    plugin->Start();
  }

  // The API server: pods for the watcher, claims and ResourceSlices for the DRA plugin.
  std::unique_ptr<kube::KubeApi> api;
  if (with_watcher || with_dra) {
    kube::KubeApiConfig api_config;
    if (flags.count("kube-api-url") > 0) {
      api_config.base_url = Flag(flags, "kube-api-url", "");
      api_config.token_file = Flag(flags, "kube-token-file", "");
      api_config.ca_file = Flag(flags, "kube-ca-file", "");
    } else {
      absl::StatusOr<kube::KubeApiConfig> in_cluster = kube::InClusterKubeApiConfig();
      if (!in_cluster.ok()) {
        std::fprintf(stderr, "orion-agent: %s\n",
                     std::string(in_cluster.status().message()).c_str());
        return 2;
      }
      api_config = *in_cluster;
    }
    api = std::make_unique<kube::CurlKubeApi>(api_config);
  }

  // 2b. DRA kubelet plugin: claims of driver gpu-share.orion.io.
  std::unique_ptr<DraPlugin> dra;
  if (with_dra && installed) {
    DraPluginConfig dra_config;
    dra_config.node_name = node_name;
    dra_config.plugin_dir = Flag(flags, "dra-plugin-dir", dra_config.plugin_dir);
    dra_config.registry_dir = Flag(flags, "dra-registry-dir", dra_config.registry_dir);
    dra_config.cdi_dir = Flag(flags, "cdi-dir", dra_config.cdi_dir);
    dra_config.shares_per_gpu = plugin_config.shares_per_gpu;
    dra_config.high_per_gpu = plugin_config.high_per_gpu;
    dra_config.layout = plugin_config.layout;
    const std::string floor_ms = Flag(flags, "min-latency-target-ms", "5");
    uint64_t floor = 0;
    if (!absl::SimpleAtoi(floor_ms, &floor) || floor > 60000) {
      std::fprintf(stderr, "orion-agent: --min-latency-target-ms: expected an integer 0..60000 "
                   "(orion-server's policy.min_latency_target_ms), got \"%s\"\n",
                   floor_ms.c_str());
      return 2;
    }
    dra_config.min_latency_target_us = floor * 1000;
    dra = std::make_unique<DraPlugin>(dra_config, api.get());
    dra->SetGpus(dra_gpus_of(current_gpus()));
    if (absl::Status s = dra->Start(); !s.ok()) {
      std::fprintf(stderr, "orion-agent: DRA plugin: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }

  // 3. Pod watcher -> orion-server.
  std::atomic<bool> stop{false};
  std::unique_ptr<AgentSyncClient> sink;
  std::unique_ptr<ClaimPolicySink> claim_sink;
  std::unique_ptr<PodResourcesClient> pod_resources_client;
  std::unique_ptr<GpuAllocationSink> gpu_sink;
  std::unique_ptr<PodWatcher> watcher;
  std::thread watcher_thread;
  std::thread server_check_thread;
  if (with_watcher) {
    sink = std::make_unique<AgentSyncClient>(
        Flag(flags, "server-address",
             "unix:" + plugin_config.layout.run_dir + "-agent/agent.sock"));
    PolicySink* server_sink = sink.get();
    // Pods of prepared DRA claims get their claims' priority, limits and GPUs.
    if (dra != nullptr) {
      claim_sink = std::make_unique<ClaimPolicySink>(sink.get(), [&] { return dra->PodPolicies(); });
      dra->OnClaimsChanged([&] {
        if (absl::StatusOr<int> sent = claim_sink->Refresh(); !sent.ok()) {
          std::fprintf(stderr, "orion-agent: claim settings not sent to orion-server: %s\n",
                       std::string(sent.status().message()).c_str());
        }
      });
      server_sink = claim_sink.get();
    }
    // Each pod's policy carries the GPUs the device plugin allocated to it (the kubelet's pod
    // resources API), so the server refuses the pod's registrations on any other GPU.
    PolicySink* watcher_sink = server_sink;
    const std::string pod_resources = Flag(flags, "pod-resources-socket",
                                           "/var/lib/kubelet/pod-resources/kubelet.sock");
    if (!pod_resources.empty()) {
      pod_resources_client = std::make_unique<PodResourcesClient>(pod_resources);
      gpu_sink = std::make_unique<GpuAllocationSink>(
          server_sink, [&] { return pod_resources_client->List(); },
          std::vector<std::string>{plugin_config.resource_name, plugin_config.high_resource_name},
          plugin_config.high_per_gpu > 0 ? plugin_config.high_resource_name : "");
      watcher_sink = gpu_sink.get();
    }
    watcher = std::make_unique<PodWatcher>(PodWatcherConfig{.node_name = node_name}, api.get(),
                                           watcher_sink);
    watcher_thread = std::thread([&] { watcher->Run(&stop); });
    // A restarted orion-server knows no pods: every 250 ms the agent asks how many it knows and
    // sends them all again where that differs, so high-priority pods get their priority back
    // within about a quarter of a second of their re-registration.
    // Every second, pods whose allocation became known (their containers were created after
    // the pod was first sent) are sent again with their GPUs.
    server_check_thread = std::thread([&] {
      for (uint64_t round = 1; !stop.load(); ++round) {
        for (int i = 0; i < 5 && !stop.load(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (stop.load()) break;
        (void)watcher->CheckServer();
        if (gpu_sink != nullptr && round % 4 == 0) (void)gpu_sink->Refresh();
      }
    });
  }

  // Idle time per GPU for the placement of shares: orion-server's busy seconds, every 5 s.
  std::unique_ptr<AgentSyncClient> load_client;
  std::thread load_thread;
  if (plugin != nullptr) {
    load_client = std::make_unique<AgentSyncClient>(
        Flag(flags, "server-address",
             "unix:" + plugin_config.layout.run_dir + "-agent/agent.sock"));
    load_thread = std::thread([&] {
      GpuIdleEstimator estimator;
      std::string last_error;
      while (!stop.load()) {
        absl::StatusOr<std::vector<orion::v1::Gpu>> gpus = load_client->ListGpuLoad();
        if (gpus.ok()) {
          std::map<std::string, double> busy;
          for (const orion::v1::Gpu& g : *gpus) busy[g.uuid()] = g.busy_seconds();
          const double now_s = std::chrono::duration<double>(
              std::chrono::steady_clock::now().time_since_epoch()).count();
          plugin->SetGpuIdle(estimator.Update(busy, now_s));
          last_error.clear();
        } else if (std::string(gpus.status().message()) != last_error) {
          last_error = std::string(gpus.status().message());
          std::fprintf(stderr, "orion-agent: no GPU busy figures (shares spread instead): %s\n",
                       last_error.c_str());
          plugin->SetGpuIdle({});
        }
        for (int i = 0; i < 50 && !stop.load(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
    });
  }

  // 4. Health: live while the process runs; ready when every enabled part works.
  auto ready = [&]() -> std::string {
    if (!installed) return "interposer not installed";
    if (plugin != nullptr && !plugin->Registered()) return "device plugin not registered";
    if (dra != nullptr && !dra->Published()) return "DRA ResourceSlices not published";
    if (watcher != nullptr && !watcher->Synced()) return "pods not synced to orion-server";
    return "";
  };
  auto health = HttpEndpoint::Start(
      {.listen_address = Flag(flags, "health-address", "0.0.0.0:8081")},
      {{"/healthz", [](const HttpRequest&) { return Text(200, "ok\n"); }},
       {"/gpus", [&](const HttpRequest&) {
          std::lock_guard<std::mutex> lock(gpus_mu);
          return HttpReply{200, "text/plain", gpus_text};
        }},
       {"/readyz", [&](const HttpRequest&) {
          const std::string why = ready();
          return why.empty() ? Text(200, "ok\n") : HttpReply{503, "text/plain", why + "\n"};
        }}});
  if (!health.ok()) {
    std::fprintf(stderr, "orion-agent: %s\n", std::string(health.status().message()).c_str());
  }

  // GPUs can come and go (driver reload, hot-plug on some systems): rediscover periodically.
  std::thread rediscover([&] {
    while (!stop) {
      for (int i = 0; i < 300 && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (stop) break;
      if (plugin != nullptr || dra != nullptr) {
        const std::vector<Gpu> gpus = current_gpus();
        if (plugin != nullptr) plugin->SetGpus(uuids_of(gpus));
        if (dra != nullptr) dra->SetGpus(dra_gpus_of(gpus));
      }
    }
  });

  const int sig = WaitForSignal(signals);
  std::fprintf(stderr, "orion-agent: signal %d, stopping\n", sig);
  stop = true;
  if (plugin != nullptr) plugin->Stop();
  if (watcher_thread.joinable()) watcher_thread.join();
  if (server_check_thread.joinable()) server_check_thread.join();
  if (load_thread.joinable()) load_thread.join();
  rediscover.join();
  if (dra != nullptr) {
    dra->OnClaimsChanged(nullptr);
    dra->Stop();
  }
  return 0;
}

}  // namespace
}  // namespace orion::agent

int main(int argc, char** argv) {
  using namespace orion::agent;
  const bool webhook = argc > 1 && std::string(argv[1]) == "webhook";
  const bool gpus = argc > 1 && std::string(argv[1]) == "gpus";
  Flags flags;
  if (argc > 1 && std::string(argv[1]) == "--version") {
    std::printf("orion-agent %s\n", ORION_VERSION_LINE);
    return 0;
  }
  if (!ParseFlags(argc, argv, webhook || gpus ? 2 : 1, &flags) || flags.count("help") > 0) {
    std::fputs(kUsage, flags.count("help") > 0 ? stdout : stderr);
    return flags.count("help") > 0 ? 0 : 2;
  }
  if (gpus) {
    NvmlMigProbe nvml;
    const std::vector<Gpu> found =
        DiscoverGpus(Flag(flags, "proc-gpus-dir", "/proc/driver/nvidia/gpus"), &nvml);
    std::printf("%s", DescribeGpus(found).c_str());
    std::printf("MIG mode read from: %s\n", nvml.Loaded() ? "NVML" : "/proc capabilities");
    return found.empty() ? 1 : 0;
  }
  return webhook ? RunWebhook(flags) : RunNodeAgent(flags);
}
