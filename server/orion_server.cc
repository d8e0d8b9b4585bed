// Wiring of orion-server's parts and its drain/policy thread (see orion_server.h).
#include "server/orion_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kube/kube_api.h"
#include "server/token_review.h"

namespace orion::server {

std::vector<std::string> DiscoverGpuUuids(const std::string& dir) {
  std::vector<std::string> pci;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') pci.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(pci.begin(), pci.end());
  std::vector<std::string> uuids;
  for (const std::string& bus : pci) {
    std::ifstream in(dir + "/" + bus + "/information");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("GPU UUID:", 0) == 0) {
        uuids.emplace_back(absl::StripAsciiWhitespace(line.substr(9)));
        break;
      }
    }
  }
  return uuids;
}

bool IsLoopbackAddress(const std::string& host_port) {
  const std::string host = host_port.substr(0, host_port.rfind(':'));
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "[::1]" ||
         host_port.rfind("unix:", 0) == 0;
}

absl::Status EnsureSocketFolder(const std::string& socket_path, const char* key,
                                const std::string& source) {
  const std::string folder = socket_path.substr(0, socket_path.rfind('/'));
  if (folder.empty()) return absl::OkStatus();  // "/x.sock": the root folder
  const auto fix = [&](const std::string& what, int err) {
    return absl::PermissionDeniedError(absl::StrCat(
        source, ": ", key, ": ", what, " ", folder, ": ", std::strerror(err),
        " (run orion-server as root, e.g. with sudo, or set ", key,
        " to a path in a folder this user may write)"));
  };
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    // Missing parents first, then the folder; each created 0755 whatever the umask.
    size_t at = 0;
    do {
      at = folder.find('/', at + 1);
      const std::string part = folder.substr(0, at);  // npos: the whole folder
      if (::mkdir(part.c_str(), 0755) != 0) {
        if (errno != EEXIST) return fix("cannot create the folder", errno);
      } else if (::chmod(part.c_str(), 0755) != 0) {
        return fix("cannot set mode 0755 on", errno);
      }
    } while (at != std::string::npos);
    std::fprintf(stderr, "orion-server: created %s (mode 0755) for %s\n", folder.c_str(), key);
  } else if (!S_ISDIR(st.st_mode)) {
    return fix("not a folder:", ENOTDIR);
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) return fix("cannot write in", errno);
  return absl::OkStatus();
}

namespace {

// The whole of a PEM file; the error names the config key and the path.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* key,
                                    const std::string& source) {
  std::ifstream in(path);
  std::stringstream ss;
  if (in) ss << in.rdbuf();
  if (!in || ss.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": admin_auth.", key, ": ", path,
                                                   " is not a readable PEM file"));
  }
  return ss.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> AdminCredentials(
    const ServerConfig& config) {
  if (config.admin_tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  auto cert = ReadPem(config.admin_tls_cert_file, "tls_cert_file", config.source);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(config.admin_tls_key_file, "tls_key_file", config.source);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!config.admin_client_ca_file.empty()) {
    auto ca = ReadPem(config.admin_client_ca_file, "client_ca_file", config.source);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<int> LockServerFiles(const ServerConfig& config, std::string* created_dir) {
  // The lock sits beside the agent socket, in a folder only root reaches: in socket_path's
  // folder, which pods mount, a pod's root could take it and keep the server from starting.
  const std::string dir = config.agent_socket.substr(0, config.agent_socket.rfind('/'));
  if (!dir.empty() && ::mkdir(dir.c_str(), 0700) == 0) *created_dir = dir;
  const std::string path = config.agent_socket + ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat(config.source, ": agent_socket: cannot open ",
                                                    path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::AlreadyExistsError(absl::StrCat(
        config.source, ": another orion-server runs with this config (it holds ", path,
        "); not starting, and nothing of it was touched"));
  }
  return fd;
}

uint64_t RaiseDescriptorLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur;
}

absl::StatusOr<std::unique_ptr<OrionServer>> OrionServer::Start(ServerConfig config,
                                                                ServerOptions options) {
  std::unique_ptr<OrionServer> s(new OrionServer());
  // Every client holds a connection, and every connection not yet registered a descriptor too.
  RaiseDescriptorLimit();
  if (config.gpus.empty() && options.discover_gpus) {
    config.gpus = DiscoverGpuUuids("/proc/driver/nvidia/gpus");
    if (config.gpus.size() > contract::kMaxGpus) config.gpus.resize(contract::kMaxGpus);
  }
  std::vector<std::vector<OrionProfileRow>> profiles;
  for (const std::string& path : config.kernel_profiles) {
    std::ifstream in(path);
    if (!in) {
      return absl::NotFoundError(absl::StrCat(config.source, ": kernel_profiles: cannot read ",
                                              path));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    auto rows = ParseOrionCsv(ss.str(), path);
    if (!rows.ok()) return rows.status();
    profiles.push_back(std::move(*rows));
  }
  auto board = NodeBoard::Create();
  if (!board.ok()) return board.status();
  if (!(*board)->sealed()) {
    std::fprintf(stderr,
                 "orion-server: WARNING: this kernel cannot seal the board against writable "
                 "mappings (F_SEAL_FUTURE_WRITE, Linux 5.1): tenants can write it, and the server "
                 "puts back what they write once per policy tick\n");
  }
  s->state_ = std::make_unique<NodeState>(config, std::move(*board));
  for (const auto& rows : profiles) s->state_->ImportOrionProfile(rows);

  // The client socket's folder (made when missing), then the lock: nothing of another server's
  // may be touched before it, and no socket is unlinked without it. The lock makes the agent
  // socket's folder 0700 when missing; EnsureSocketFolder then finds it there.
  if (absl::Status st = EnsureSocketFolder(config.socket_path, "socket_path", config.source);
      !st.ok()) {
    return st;
  }
  absl::StatusOr<int> lock = LockServerFiles(config, &s->created_agent_dir_);
  if (!lock.ok()) return lock.status();
  s->lock_fd_ = *lock;
  s->agent_socket_ = config.agent_socket;
  if (absl::Status st = EnsureSocketFolder(config.agent_socket, "agent_socket", config.source);
      !st.ok()) {
    return st;
  }
  s->listener_ = std::make_unique<RegistrationListener>(s->state_.get(), config.socket_path,
                                                        options.proc_root);
  if (absl::Status st = s->listener_->Start(); !st.ok()) return st;

  std::vector<AdminToken> tokens;
  if (!config.admin_tokens_file.empty()) {
    auto loaded = LoadAdminTokens(config.admin_tokens_file);
    if (!loaded.ok()) return loaded.status();
    tokens = std::move(*loaded);
  }
  s->auth_ = std::make_unique<AdminAuth>(std::move(tokens), !config.admin_client_ca_file.empty());
  if (!config.admin_service_account_operators.empty() ||
      !config.admin_service_account_readers.empty()) {
    kube::KubeApiConfig api;
    if (config.admin_kubernetes_api.empty()) {
      absl::StatusOr<kube::KubeApiConfig> in_cluster = kube::InClusterKubeApiConfig();
      if (!in_cluster.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            config.source, ": admin_auth.service_accounts needs the Kubernetes API: run in a "
            "cluster or set admin_auth.kubernetes_api (", in_cluster.status().message(), ")"));
      }
      api = *in_cluster;
    } else {
      api.base_url = config.admin_kubernetes_api;
    }
    api.timeout_s = TokenReviewLimits{}.api_timeout.count();
    s->auth_->AllowServiceAccounts(
        config.admin_service_account_operators, config.admin_service_account_readers,
        std::make_shared<KubeTokenReviewer>(std::make_unique<kube::CurlKubeApi>(api)));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> admin_credentials =
      AdminCredentials(config);
  if (!admin_credentials.ok()) return admin_credentials.status();
  if (!s->auth_->enabled() && !IsLoopbackAddress(config.admin_address)) {
    std::fprintf(stderr,
                 "orion-server: warning: the admin API on %s takes calls from anyone who can "
                 "reach it (set admin_auth.tokens_file, or listen on 127.0.0.1)\n",
                 config.admin_address.c_str());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  s->admin_ = std::make_unique<AdminServiceImpl>(s->state_.get(), s->auth_.get());
  s->agent_sync_ = std::make_unique<AgentSyncServiceImpl>(s->state_.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.admin_address, *admin_credentials, &s->admin_port_);
  builder.RegisterService(s->admin_.get());
  s->grpc_ = builder.BuildAndStart();
  if (!s->grpc_ || s->admin_port_ == 0) {
    return absl::UnavailableError(absl::StrCat(config.source, ": admin_address: cannot listen on ",
                                               config.admin_address,
                                               " (in use, or not a local address?)"));
  }
  // AgentSync sets pod priorities: only root on the node (the agent) may reach it.
  if (SocketAnswers(config.agent_socket)) {
    return absl::AlreadyExistsError(absl::StrCat(
        config.source, ": agent_socket: another process listens on ", config.agent_socket,
        "; not starting, and its socket is left alone"));
  }
  ::unlink(config.agent_socket.c_str());
  grpc::ServerBuilder agent_builder;
  agent_builder.AddListeningPort("unix:" + config.agent_socket, grpc::InsecureServerCredentials());
  agent_builder.RegisterService(s->agent_sync_.get());
  s->agent_grpc_ = agent_builder.BuildAndStart();
  if (!s->agent_grpc_ || ::chmod(config.agent_socket.c_str(), 0600) != 0) {
    return absl::UnavailableError(absl::StrCat(config.source, ": agent_socket: cannot listen on ",
                                               config.agent_socket));
  }
  try {
    s->exposer_ = std::make_unique<prometheus::Exposer>(config.metrics_address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(config.source,
                                               ": metrics_address: cannot listen on ",
                                               config.metrics_address, ": ", e.what()));
  }
  s->collector_ = std::make_shared<MetricsCollector>(s->state_.get(), config.node_name);
  s->exposer_->RegisterCollectable(s->collector_);
  const auto ports = s->exposer_->GetListeningPorts();
  s->metrics_port_ = ports.empty() ? 0 : ports.front();
  s->drain_thread_ = std::thread([p = s.get()] { p->DrainLoop(); });
  s->heartbeat_thread_ = std::thread([p = s.get()] { p->HeartbeatLoop(); });
  return s;
}

void OrionServer::DrainLoop() {
  uint64_t next_tick = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    const size_t n = state_->DrainOnce(MonotonicNs());
    // Read again after the pass: the policy tick also beats the heartbeat.
    const uint64_t now = MonotonicNs();
    if (now >= next_tick) {
      state_->PolicyTick(now);
      next_tick = now + 100000000;  // 100 ms
    }
    // Busy rings are drained back to back; idle ones are polled every millisecond.
    if (n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void OrionServer::HeartbeatLoop() {
  NodeBoard& board = state_->board();
  do {
    board.Heartbeat(MonotonicNs());
  } while (!stopping_.WaitForNotificationWithTimeout(absl::Milliseconds(kHeartbeatPeriodMs)));
}

void OrionServer::Shutdown() {
  if (stop_.exchange(true)) return;
  if (!stopping_.HasBeenNotified()) stopping_.Notify();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (grpc_) grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (agent_grpc_) {
    agent_grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  if (drain_thread_.joinable()) drain_thread_.join();
  if (listener_) listener_->Stop();  // unregisters every client, removes the socket
  if (exposer_ && collector_) exposer_->RemoveCollectable(collector_);
  exposer_.reset();
  if (lock_fd_ >= 0) {
    if (agent_grpc_) ::unlink(agent_socket_.c_str());
    if (!created_agent_dir_.empty()) ::rmdir(created_agent_dir_.c_str());  // only if empty
    ::close(lock_fd_);  // the lock goes last; the file stays (deleting it would race)
    lock_fd_ = -1;
  }
}

OrionServer::~OrionServer() { Shutdown(); }

}  // namespace orion::server
