// The DRA kubelet plugin: registration, prepare and unprepare, ResourceSlice publication
// (see dra_plugin.h).
#include "agent/dra_plugin.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/cdi_spec.h"
#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "pluginregistration/v1/api.grpc.pb.h"

namespace orion::agent {

namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

namespace {

// What the kubelet may send in one call: a pod has a few claims; 256 bounds a broken caller.
constexpr int kMaxClaimsPerCall = 256;

// A DNS label (RFC 1123): 1..63 of lowercase letters, digits and '-', beginning and ending
// with a letter or digit. A namespace's name is one.
bool ValidDnsLabel(std::string_view label) {
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (label.empty() || label.size() > 63 || !alnum(label.front()) || !alnum(label.back())) {
    return false;
  }
  return std::all_of(label.begin(), label.end(), [&](char c) { return alnum(c) || c == '-'; });
}

// A DNS subdomain (RFC 1123): DNS labels joined by '.', 1..253 in all. A claim's name is one.
// Neither "." nor ".." nor "a..b" is: such names would change the API path they go into.
bool ValidDnsSubdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  while (true) {
    const size_t dot = name.find('.');
    if (!ValidDnsLabel(name.substr(0, dot))) return false;
    if (dot == std::string_view::npos) return true;
    name.remove_prefix(dot + 1);
  }
}

// The v1beta1 messages are v1's field for field: convert through the wire format.
template <typename To, typename From>
To Convert(const From& from) {
  To to;
  to.ParseFromString(from.SerializeAsString());
  return to;
}

}  // namespace

class DraPlugin::Registration final : public ::pluginregistration::Registration::Service {
 public:
  explicit Registration(DraPlugin* plugin) : plugin_(plugin) {}

  grpc::Status GetInfo(grpc::ServerContext*, const ::pluginregistration::InfoRequest*,
                       ::pluginregistration::PluginInfo* out) override {
    out->set_type("DRAPlugin");
    out->set_name(std::string(kDraDriverName));
    out->set_endpoint(plugin_->plugin_socket());
    out->add_supported_versions("v1.DRAPlugin");
    out->add_supported_versions("v1beta1.DRAPlugin");
    return grpc::Status::OK;
  }

  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const ::pluginregistration::RegistrationStatus* status,
                                        ::pluginregistration::RegistrationStatusResponse*) override {
    plugin_->registered_ = status->plugin_registered();
    if (status->plugin_registered()) {
      std::fprintf(stderr, "orion-agent: DRA driver %s registered with the kubelet\n",
                   std::string(kDraDriverName).c_str());
    } else {
      std::fprintf(stderr, "orion-agent: the kubelet refused DRA driver %s: %s\n",
                   std::string(kDraDriverName).c_str(), status->error().c_str());
    }
    return grpc::Status::OK;
  }

 private:
  DraPlugin* const plugin_;
};

class DraPlugin::ServiceV1 final : public drav1::DRAPlugin::Service {
 public:
  explicit ServiceV1(DraPlugin* plugin) : plugin_(plugin) {}
  grpc::Status NodePrepareResources(grpc::ServerContext*,
                                    const drav1::NodePrepareResourcesRequest* request,
                                    drav1::NodePrepareResourcesResponse* out) override {
    *out = plugin_->Prepare(*request);
    return grpc::Status::OK;
  }
  grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                      const drav1::NodeUnprepareResourcesRequest* request,
                                      drav1::NodeUnprepareResourcesResponse* out) override {
    *out = plugin_->Unprepare(*request);
    return grpc::Status::OK;
  }

 private:
  DraPlugin* const plugin_;
};

class DraPlugin::ServiceV1beta1 final : public drav1beta1::DRAPlugin::Service {
 public:
  explicit ServiceV1beta1(DraPlugin* plugin) : plugin_(plugin) {}
  grpc::Status NodePrepareResources(grpc::ServerContext*,
                                    const drav1beta1::NodePrepareResourcesRequest* request,
                                    drav1beta1::NodePrepareResourcesResponse* out) override {
    *out = Convert<drav1beta1::NodePrepareResourcesResponse>(
        plugin_->Prepare(Convert<drav1::NodePrepareResourcesRequest>(*request)));
    return grpc::Status::OK;
  }
  grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                      const drav1beta1::NodeUnprepareResourcesRequest* request,
                                      drav1beta1::NodeUnprepareResourcesResponse* out) override {
    *out = Convert<drav1beta1::NodeUnprepareResourcesResponse>(
        plugin_->Unprepare(Convert<drav1::NodeUnprepareResourcesRequest>(*request)));
    return grpc::Status::OK;
  }

 private:
  DraPlugin* const plugin_;
};

DraPlugin::DraPlugin(DraPluginConfig config, kube::KubeApi* api)
    : config_(std::move(config)), api_(api), publisher_(api, config_.node_name) {
  std::lock_guard<std::mutex> lock(mu_);
  inventory_.node_name = config_.node_name;
  inventory_.shares_per_gpu = config_.shares_per_gpu;
  inventory_.high_per_gpu = config_.high_per_gpu;
  layout_ = config_.layout;
}

DraPlugin::~DraPlugin() { Stop(); }

std::string DraPlugin::registration_socket() const {
  return absl::StrCat(config_.registry_dir, "/", kDraDriverName, "-reg.sock");
}

void DraPlugin::SetGpus(std::vector<DraGpu> gpus) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto same = [](const DraGpu& a, const DraGpu& b) {
      return a.index == b.index && a.uuid == b.uuid && a.product == b.product &&
             a.memory_bytes == b.memory_bytes;
    };
    if (std::equal(gpus.begin(), gpus.end(), inventory_.gpus.begin(), inventory_.gpus.end(),
                   same)) {
      return;
    }
    for (const DraGpu& g : inventory_.gpus) inventory_.departed[g.index] = g.uuid;
    for (const DraGpu& g : gpus) inventory_.departed.erase(g.index);
    inventory_.gpus = std::move(gpus);
    ++inventory_generation_;
    published_ = false;
  }
  stop_cv_.notify_all();
}

void DraPlugin::SetHostLibDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  layout_.host_lib_dir = dir;
}

void DraPlugin::OnClaimsChanged(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

void DraPlugin::NotifyChanged() {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener = listener_;
  }
  if (listener) listener();
}

absl::Status DraPlugin::Start() {
  std::error_code ec;
  for (const std::string& dir : {config_.plugin_dir, config_.registry_dir, config_.cdi_dir}) {
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  absl::StatusOr<PreparedClaims> claims = LoadClaimCheckpoint(CheckpointPath());
  if (!claims.ok()) {
    // Kept for a person to read; the plugin starts with no prepared claims.
    const std::string aside = absl::StrCat(CheckpointPath(), ".bad-", time(nullptr));
    rename(CheckpointPath().c_str(), aside.c_str());
    std::fprintf(stderr, "orion-agent: DRA checkpoint unreadable (%s); moved to %s\n",
                 std::string(claims.status().message()).c_str(), aside.c_str());
    claims = PreparedClaims{};
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    claims_ = std::move(*claims);
    if (!claims_.empty()) {
      std::fprintf(stderr, "orion-agent: DRA: %zu prepared claim(s) from the checkpoint\n",
                   claims_.size());
    }
  }
  unlink(plugin_socket().c_str());  // a stale socket from an earlier run would make bind fail
  service_v1_ = std::make_unique<ServiceV1>(this);
  service_v1beta1_ = std::make_unique<ServiceV1beta1>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix://", plugin_socket()),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(service_v1_.get());
  builder.RegisterService(service_v1beta1_.get());
  plugin_server_ = builder.BuildAndStart();
  if (plugin_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve the DRA plugin on ", plugin_socket()));
  }
  if (absl::Status s = ServeRegistration(); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = false;
  }
  publish_thread_ = std::thread([this] { PublishLoop(); });
  std::fprintf(stderr, "orion-agent: DRA driver %s serving %s, registration %s, CDI specs in %s\n",
               std::string(kDraDriverName).c_str(), plugin_socket().c_str(),
               registration_socket().c_str(), config_.cdi_dir.c_str());
  return absl::OkStatus();
}

absl::Status DraPlugin::ServeRegistration() {
  if (registration_server_ != nullptr) {
    registration_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    registration_server_->Wait();
    registration_server_.reset();
  }
  registered_ = false;
  unlink(registration_socket().c_str());
  registration_ = std::make_unique<Registration>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix://", registration_socket()),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(registration_.get());
  registration_server_ = builder.BuildAndStart();
  if (registration_server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve DRA registration on ", registration_socket()));
  }
  return absl::OkStatus();
}

void DraPlugin::Stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (publish_thread_.joinable()) publish_thread_.join();
  for (std::unique_ptr<grpc::Server>* server : {&registration_server_, &plugin_server_}) {
    if (*server == nullptr) continue;
    (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    (*server)->Wait();
    server->reset();
  }
  // Gone from plugins_registry: the kubelet deregisters the driver.
  if (registration_ != nullptr) unlink(registration_socket().c_str());
  registered_ = false;
}

void DraPlugin::PublishLoop() {
  uint64_t published = 0;
  std::string last_error, last_owner_problem;
  int rounds_without_owner = 0;
  std::unique_lock<std::mutex> stop_lock(stop_mu_);
  while (!stop_) {
    stop_lock.unlock();
    DraInventory inventory;
    uint64_t generation;
    std::string mode;
    {
      std::lock_guard<std::mutex> lock(mu_);
      inventory = inventory_;
      generation = inventory_generation_;
      mode = layout_.mps_pipe_dir.empty() ? "time-sliced" : "mps";
    }
    if (generation != published) {
      absl::Status s = publisher_.Publish(inventory, mode);
      if (s.ok()) {
        published = generation;
        published_ = true;
        last_error.clear();
        if (publisher_.owner_problem() != last_owner_problem) {
          last_owner_problem = publisher_.owner_problem();
          if (!last_owner_problem.empty()) {
            std::fprintf(stderr, "orion-agent: DRA: ResourceSlices have no owner, so they outlive "
                         "a deleted node (%s); trying again every minute\n",
                         last_owner_problem.c_str());
          }
        }
        std::fprintf(stderr, "orion-agent: DRA: ResourceSlices of %zu GPU(s) published "
                     "(pool %s, generation %lld)\n", inventory.gpus.size(),
                     inventory.node_name.c_str(), static_cast<long long>(publisher_.generation()));
      } else if (std::string(s.message()) != last_error) {
        last_error = std::string(s.message());
        std::fprintf(stderr, "orion-agent: DRA: ResourceSlices not published (retrying): %s\n",
                     last_error.c_str());
      }
    }
    // Slices published without an owner get one once the Node can be read (every 12 rounds,
    // a minute by default: a node without RBAC for it asks no more often than that).
    if (published == generation && !publisher_.owner_problem().empty() &&
        ++rounds_without_owner % 12 == 0 && publisher_.LearnOwner()) {
      published = 0;  // publish again, now with the owner
    }
    // A registration socket removed by someone else (a kubelet cleaning up) is served again,
    // so the kubelet's plugin watcher finds the driver.
    struct stat st {};
    if (stat(registration_socket().c_str(), &st) != 0) {
      std::fprintf(stderr, "orion-agent: DRA registration socket gone; serving it again\n");
      if (absl::Status s = ServeRegistration(); !s.ok()) {
        std::fprintf(stderr, "orion-agent: %s\n", std::string(s.message()).c_str());
      }
    }
    stop_lock.lock();
    stop_cv_.wait_for(stop_lock, config_.retry_interval, [&] {
      if (stop_) return true;
      std::lock_guard<std::mutex> lock(mu_);
      return inventory_generation_ != published && published != 0;
    });
  }
}

drav1::NodePrepareResourcesResponse DraPlugin::Prepare(
    const drav1::NodePrepareResourcesRequest& request) {
  drav1::NodePrepareResourcesResponse out;
  bool changed = false;
  // The answer is a map by claim UID: a UID listed twice would get one answer for two claims
  // (the first's devices, twice). Neither is prepared; the error names the UID.
  std::map<std::string, int> times_listed;
  for (int i = 0; i < request.claims_size() && i < kMaxClaimsPerCall; ++i) {
    ++times_listed[request.claims(i).uid()];
  }
  for (int i = 0; i < request.claims_size(); ++i) {
    const drav1::Claim& claim = request.claims(i);
    drav1::NodePrepareResourceResponse& r = (*out.mutable_claims())[claim.uid()];
    if (i >= kMaxClaimsPerCall) {
      r.set_error(absl::StrCat("more than ", kMaxClaimsPerCall, " claims in one call"));
      continue;
    }
    if (const int n = times_listed[claim.uid()]; n > 1) {
      r.clear_devices();
      r.set_error(absl::StrCat("claim UID \"", absl::CHexEscape(claim.uid().substr(0, 64)),
                               "\" is listed ", n, " times in one NodePrepareResources call ",
                               "(claim ", absl::CHexEscape(claim.namespace_().substr(0, 253)), "/",
                               absl::CHexEscape(claim.name().substr(0, 253)),
                               " among them); none of them is prepared"));
      continue;
    }
    absl::StatusOr<PreparedClaim> prepared = PrepareClaim(claim);
    if (!prepared.ok()) {
      r.set_error(std::string(prepared.status().message()));
      std::fprintf(stderr, "orion-agent: DRA: claim %s/%s not prepared: %s\n",
                   claim.namespace_().c_str(), claim.name().c_str(), r.error().c_str());
      continue;
    }
    changed = true;
    for (const PreparedClaim::Device& d : prepared->devices) {
      drav1::Device* device = r.add_devices();
      device->add_request_names(d.request);
      device->set_pool_name(d.pool);
      device->set_device_name(d.device);
      for (const std::string& id : d.cdi_device_ids) device->add_cdi_device_ids(id);
    }
  }
  if (changed) NotifyChanged();
  return out;
}

absl::StatusOr<PreparedClaim> DraPlugin::PrepareClaim(const drav1::Claim& claim) {
  if (!ValidClaimUid(claim.uid())) {
    return absl::InvalidArgumentError(absl::StrCat("claim UID \"", claim.uid().substr(0, 64),
                                                   "\" is not a Kubernetes UID"));
  }
  if (!ValidDnsLabel(claim.namespace_()) || !ValidDnsSubdomain(claim.name())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "claim \"", absl::CHexEscape(claim.namespace_().substr(0, 253)), "/",
        absl::CHexEscape(claim.name().substr(0, 253)), "\" (UID ", claim.uid(), "): ",
        ValidDnsLabel(claim.namespace_()) ? "the name is not a DNS subdomain"
                                          : "the namespace is not a DNS label",
        " (lowercase letters, digits, '-', beginning and ending with a letter or digit)"));
  }
  std::lock_guard<std::mutex> one_at_a_time(prepare_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = claims_.find(claim.uid());
    if (it != claims_.end()) return it->second;  // prepared already: the same answer
  }
  const std::string ref = absl::StrCat(claim.namespace_(), "/", claim.name());
  const std::string path = absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", claim.namespace_(),
                                        "/resourceclaims/", claim.name());
  absl::StatusOr<kube::HttpResponse> reply = api_->Get(path);
  if (!reply.ok()) {
    return absl::UnavailableError(absl::StrCat("claim ", ref, ": reading it from the API server: ",
                                               reply.status().message()));
  }
  if (reply->status != 200) {
    return absl::UnavailableError(absl::StrCat("claim ", ref, ": the API server answered HTTP ",
                                               reply->status, reply->status == 404 ? " (not found)"
                                                                                    : ""));
  }
  absl::StatusOr<DraClaim> parsed = ParseResourceClaim(reply->body, claim.uid());
  if (!parsed.ok()) {
    // The parser names the claim when it got that far; say which one in any case.
    const std::string message(parsed.status().message());
    return absl::Status(parsed.status().code(),
                        message.find(ref) != std::string::npos
                            ? message
                            : absl::StrCat("claim ", ref, ": ", message));
  }
  if (const uint64_t target = parsed->config.latency_target_us;
      target != 0 && target < config_.min_latency_target_us) {
    return absl::InvalidArgumentError(absl::StrCat(
        "claim ", ref, ": latencyTargetMs ", target / 1000.0, " is below orion-server's floor of ",
        config_.min_latency_target_us / 1000.0,
        " ms (policy.min_latency_target_ms); ask for at least that"));
  }
  DraInventory inventory;
  ContainerLayout layout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inventory = inventory_;
    layout = layout_;
  }
  absl::StatusOr<std::vector<DraClaimGpu>> gpus = ResolveClaimDevices(*parsed, inventory);
  if (!gpus.ok()) return gpus.status();

  if (absl::Status s = CheckPodClaimsAgree(*parsed, *gpus); !s.ok()) return s;

  PreparedClaim prepared{.uid = claim.uid(),
                         .namespace_name = claim.namespace_(),
                         .name = claim.name(),
                         .pod_uids = parsed->pod_uids,
                         .settings = ClaimSettings(*parsed, *gpus)};
  std::vector<std::string> claim_gpus;
  for (const DraClaimGpu& g : *gpus) {
    prepared.devices.push_back(
        {.request = g.device.request, .pool = g.device.pool, .device = g.device.device});
    claim_gpus.push_back(g.gpu.uuid);
  }
  // The claim's GPUs, each once, in the node's order (by index), whatever the order of the
  // allocation results: NVIDIA_VISIBLE_DEVICES and the server's GPUs of the pod name the same.
  std::vector<std::string> node_gpus;
  for (const DraGpu& g : inventory.gpus) node_gpus.push_back(g.uuid);
  prepared.gpu_uuids = InNodeOrder(claim_gpus, node_gpus);
  if (prepared.gpu_uuids.size() < claim_gpus.size()) {
    // Not an error (a claim may ask for two shares of one GPU), but a job of N ranks finds
    // fewer GPUs than devices: say so; docs/kubernetes.md shows claims that keep them apart.
    std::fprintf(stderr, "orion-agent: DRA: claim %s has %zu devices on %zu GPU(s) (%s); its "
                 "containers see each GPU once\n", ref.c_str(), claim_gpus.size(),
                 prepared.gpu_uuids.size(), absl::StrJoin(prepared.gpu_uuids, ", ").c_str());
  }
  const std::string cdi_file = absl::StrCat(config_.cdi_dir, "/", ClaimCdiFileName(claim.uid()));
  if (!prepared.devices.empty()) {
    // One spec for the claim, named on its first device: the runtime applies it once.
    ClaimCdi cdi = ClaimCdiSpec(claim.uid(), prepared.gpu_uuids, prepared.settings, layout);
    if (absl::Status s = WriteFileAtomically(cdi_file, WriteJson(cdi.spec)); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("claim ", ref, ": CDI spec: ", s.message()));
    }
    prepared.devices.front().cdi_device_ids = std::move(cdi.device_ids);
  }
  std::lock_guard<std::mutex> lock(mu_);
  claims_[prepared.uid] = prepared;
  if (absl::Status s = SaveClaimCheckpoint(CheckpointPath(), claims_); !s.ok()) {
    claims_.erase(prepared.uid);
    unlink(cdi_file.c_str());
    return absl::UnavailableError(absl::StrCat("claim ", ref, ": checkpoint: ", s.message()));
  }
  std::fprintf(stderr, "orion-agent: DRA: claim %s prepared: %zu device(s) on %s, priority %s\n",
               ref.c_str(), prepared.devices.size(),
               prepared.gpu_uuids.empty() ? "no GPU"
                                          : absl::StrJoin(prepared.gpu_uuids, ", ").c_str(),
               std::string(PriorityName(prepared.settings.priority)).c_str());
  return prepared;
}

absl::Status DraPlugin::CheckPodClaimsAgree(const DraClaim& claim,
                                            const std::vector<DraClaimGpu>& gpus) const {
  if (gpus.empty()) return absl::OkStatus();  // none of our devices: no priority to give
  const bool high = gpus.front().high;       // ResolveClaimDevices refused a mix already
  auto names = [](const auto& devices) {
    std::vector<std::string> out;
    for (const auto& d : devices) out.push_back(d.device);
    return absl::StrJoin(out, ", ");
  };
  std::vector<std::string> mine;
  for (const DraClaimGpu& g : gpus) mine.push_back(g.device.device);
  const std::string ref = absl::StrCat("claim ", claim.namespace_name, "/", claim.name);
  // A high device is one pod's place on its GPU: shared by several pods, each would be high.
  if (high && claim.pod_uids.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        ref, " holds high devices (", absl::StrJoin(mine, ", "), ") and is reserved for ",
        claim.pod_uids.size(), " pods (", absl::StrJoin(claim.pod_uids, ", "),
        "): a high device is for one pod; give each pod a claim of its own (a "
        "ResourceClaimTemplate)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [uid, other] : claims_) {
    if (uid == claim.uid) continue;
    bool other_high = false, other_shares = false;
    for (const PreparedClaim::Device& d : other.devices) {
      const std::optional<DraDeviceName> name = ParseDraDeviceName(d.device);
      if (!name) continue;
      (name->high ? other_high : other_shares) = true;
    }
    if (!(high ? other_shares : other_high)) continue;
    for (const std::string& pod : claim.pod_uids) {
      if (std::find(other.pod_uids.begin(), other.pod_uids.end(), pod) == other.pod_uids.end()) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          ref, " (", high ? "high devices " : "shares ", absl::StrJoin(mine, ", "), ") and claim ",
          other.namespace_name, "/", other.name, " (", high ? "shares " : "high devices ",
          names(other.devices), "), prepared already, are both for pod ", pod,
          ": a pod is high priority only on the GPUs of its high devices, so its claims hold "
          "either high devices or shares, never both"));
    }
  }
  return absl::OkStatus();
}

drav1::NodeUnprepareResourcesResponse DraPlugin::Unprepare(
    const drav1::NodeUnprepareResourcesRequest& request) {
  drav1::NodeUnprepareResourcesResponse out;
  for (int i = 0; i < request.claims_size(); ++i) {
    const drav1::Claim& claim = request.claims(i);
    drav1::NodeUnprepareResourceResponse& r = (*out.mutable_claims())[claim.uid()];
    if (i >= kMaxClaimsPerCall) {
      r.set_error(absl::StrCat("more than ", kMaxClaimsPerCall, " claims in one call"));
      continue;
    }
    if (absl::Status s = UnprepareClaim(claim); !s.ok()) {
      r.set_error(std::string(s.message()));
      std::fprintf(stderr, "orion-agent: DRA: claim %s/%s not unprepared: %s\n",
                   claim.namespace_().c_str(), claim.name().c_str(), r.error().c_str());
    }
  }
  NotifyChanged();
  return out;
}

absl::Status DraPlugin::UnprepareClaim(const drav1::Claim& claim) {
  if (!ValidClaimUid(claim.uid())) {
    return absl::InvalidArgumentError(absl::StrCat("claim UID \"", claim.uid().substr(0, 64),
                                                   "\" is not a Kubernetes UID"));
  }
  std::lock_guard<std::mutex> one_at_a_time(prepare_mu_);
  // The spec goes by the claim's UID even when the checkpoint does not know the claim (a lost
  // checkpoint): unpreparing twice, or a claim never prepared, is no error.
  const std::string cdi_file = absl::StrCat(config_.cdi_dir, "/", ClaimCdiFileName(claim.uid()));
  if (unlink(cdi_file.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat("claim ", claim.namespace_(), "/", claim.name(),
                                               ": cannot remove ", cdi_file, ": ",
                                               std::strerror(errno)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = claims_.find(claim.uid());
  if (it == claims_.end()) return absl::OkStatus();
  PreparedClaim removed = it->second;
  claims_.erase(it);
  if (absl::Status s = SaveClaimCheckpoint(CheckpointPath(), claims_); !s.ok()) {
    claims_[removed.uid] = std::move(removed);
    return absl::UnavailableError(absl::StrCat("claim ", claim.namespace_(), "/", claim.name(),
                                               ": checkpoint: ", s.message()));
  }
  std::fprintf(stderr, "orion-agent: DRA: claim %s/%s unprepared\n", claim.namespace_().c_str(),
               claim.name().c_str());
  return absl::OkStatus();
}

std::map<std::string, ClaimPodPolicy> DraPlugin::PodPolicies() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, ClaimPodPolicy> out;
  for (const auto& [uid, claim] : claims_) {
    for (const std::string& pod : claim.pod_uids) {
      auto [it, first] = out.try_emplace(pod);
      ClaimPodPolicy& p = it->second;
      // A pod with several claims: high only if every one is (prepare refuses a pod's claims
      // that mix high devices and shares; a checkpoint of an older agent may still hold such),
      // the largest memory limit, the tightest latency target, every GPU.
      if (first || claim.settings.priority == PodPriority::kBestEffort) {
        p.settings.priority = claim.settings.priority;
      }
      p.settings.memory_limit_bytes =
          std::max(p.settings.memory_limit_bytes, claim.settings.memory_limit_bytes);
      if (claim.settings.latency_target_us > 0 &&
          (p.settings.latency_target_us == 0 ||
           claim.settings.latency_target_us < p.settings.latency_target_us)) {
        p.settings.latency_target_us = claim.settings.latency_target_us;
      }
      for (const std::string& g : claim.gpu_uuids) {
        if (std::find(p.gpu_uuids.begin(), p.gpu_uuids.end(), g) == p.gpu_uuids.end()) {
          p.gpu_uuids.push_back(g);
        }
      }
      p.claims.push_back(absl::StrCat(claim.namespace_name, "/", claim.name));
    }
  }
  return out;
}

PreparedClaims DraPlugin::Claims() const {
  std::lock_guard<std::mutex> lock(mu_);
  return claims_;
}

}  // namespace orion::agent
