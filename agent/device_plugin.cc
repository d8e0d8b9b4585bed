// Kubelet device plugin server, registration and kubelet-restart handling (see device_plugin.h).
#include "agent/device_plugin.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace orion::agent {

constexpr char kKubeletSocket[] = "kubelet.sock";
constexpr char kApiVersion[] = "v1beta1";

// DevicePlugin service of one serving period; a kubelet restart gets a fresh one.
class DevicePlugin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(DevicePlugin::Inventory* inventory, int shares_per_gpu)
      : inventory_(inventory), shares_per_gpu_(shares_per_gpu) {}

  // Ends open ListAndWatch streams so the server can shut down.
  void Close() {
    std::lock_guard<std::mutex> lock(inventory_->mu);
    closed_ = true;
    inventory_->changed.notify_all();
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    out->set_pre_start_required(false);
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    uint64_t sent = 0;
    std::unique_lock<std::mutex> lock(inventory_->mu);
    while (!closed_ && !ctx->IsCancelled()) {
      if (inventory_->generation != sent) {
        v1beta1::ListAndWatchResponse response = DeviceListLocked();
        sent = inventory_->generation;
        lock.unlock();
        if (!writer->Write(response)) return grpc::Status::OK;  // kubelet went away
        lock.lock();
        continue;
      }
      // Timed wait: a cancelled stream (kubelet gone) is noticed without a notification.
      inventory_->changed.wait_for(lock, std::chrono::milliseconds(200));
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* out) override {
    for (const auto& c : request->container_requests()) {
      std::vector<std::string> available(c.available_deviceids().begin(),
                                         c.available_deviceids().end());
      std::vector<std::string> must(c.must_include_deviceids().begin(),
                                    c.must_include_deviceids().end());
      auto* r = out->add_container_responses();
      for (std::string& id : PreferredShares(available, must, c.allocation_size())) {
        r->add_deviceids(std::move(id));
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* out) override {
    std::lock_guard<std::mutex> lock(inventory_->mu);
    for (const auto& c : request->container_requests()) {
      std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
      for (const std::string& id : ids) {
        const std::string gpu = GpuOfShare(id);
        if (std::find(inventory_->gpus.begin(), inventory_->gpus.end(), gpu) ==
            inventory_->gpus.end()) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrCat("unknown device \"", id, "\""));
        }
      }
      *out->add_container_responses() = ContainerAllocation(ids, inventory_->layout);
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  v1beta1::ListAndWatchResponse DeviceListLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inventory_->mu) {
    v1beta1::ListAndWatchResponse response;
    for (const std::string& gpu : inventory_->gpus) {
      const bool healthy = std::find(inventory_->unhealthy.begin(), inventory_->unhealthy.end(),
                                     gpu) == inventory_->unhealthy.end();
      for (int i = 0; i < shares_per_gpu_; ++i) {
        v1beta1::Device* d = response.add_devices();
        d->set_id(ShareId(gpu, i));
        d->set_health(healthy ? "Healthy" : "Unhealthy");
      }
    }
    return response;
  }

  DevicePlugin::Inventory* inventory_;
  const int shares_per_gpu_;
  bool closed_ = false;  // guarded by inventory_->mu
};

DevicePlugin::DevicePlugin(DevicePluginConfig config) : config_(std::move(config)) {
  std::lock_guard<std::mutex> lock(inventory_.mu);
  inventory_.layout = config_.layout;
}

DevicePlugin::~DevicePlugin() { Stop(); }

void DevicePlugin::SetGpus(const std::vector<std::string>& gpu_uuids) {
  std::lock_guard<std::mutex> lock(inventory_.mu);
  if (inventory_.gpus == gpu_uuids) return;
  inventory_.gpus = gpu_uuids;
  ++inventory_.generation;
  inventory_.changed.notify_all();
}

void DevicePlugin::SetGpuHealthy(const std::string& gpu_uuid, bool healthy) {
  std::lock_guard<std::mutex> lock(inventory_.mu);
  auto& u = inventory_.unhealthy;
  const bool listed = std::find(u.begin(), u.end(), gpu_uuid) != u.end();
  if (healthy == !listed) return;
  if (healthy) {
    u.erase(std::remove(u.begin(), u.end(), gpu_uuid), u.end());
  } else {
    u.push_back(gpu_uuid);
  }
  ++inventory_.generation;
  inventory_.changed.notify_all();
}

void DevicePlugin::SetHostLibDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(inventory_.mu);
  inventory_.layout.host_lib_dir = dir;
}

void DevicePlugin::Start() {
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void DevicePlugin::Stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  StopServing();
}

uint64_t DevicePlugin::KubeletSocketInode() const {
  struct stat st {};
  const std::string path = absl::StrCat(config_.plugin_dir, "/", kKubeletSocket);
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

bool DevicePlugin::OwnSocketExists() const {
  struct stat st {};
  const std::string path = absl::StrCat(config_.plugin_dir, "/", config_.endpoint);
  return stat(path.c_str(), &st) == 0;
}

absl::Status DevicePlugin::ServeAndRegister() {
  const std::string own = absl::StrCat(config_.plugin_dir, "/", config_.endpoint);
  unlink(own.c_str());  // a stale socket from an earlier run would make bind fail
  service_ = std::make_unique<Service>(&inventory_, config_.shares_per_gpu);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix://", own), grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    service_.reset();
    return absl::UnavailableError(absl::StrCat("cannot serve on ", own));
  }
  const uint64_t inode = KubeletSocketInode();
  auto channel = grpc::CreateChannel(
      absl::StrCat("unix://", config_.plugin_dir, "/", kKubeletSocket),
      grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version(kApiVersion);
  request.set_endpoint(config_.endpoint);
  request.set_resource_name(config_.resource_name);
  request.mutable_options()->set_pre_start_required(false);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::Empty reply;
  const grpc::Status status = stub->Register(&ctx, request, &reply);
  if (!status.ok()) {
    StopServing();
    return absl::UnavailableError(
        absl::StrCat("kubelet registration failed: ", status.error_message()));
  }
  registered_kubelet_inode_ = inode;
  registered_ = true;
  ++registrations_;
  std::fprintf(stderr, "orion-agent: registered %s with the kubelet (endpoint %s)\n",
               config_.resource_name.c_str(), config_.endpoint.c_str());
  return absl::OkStatus();
}

void DevicePlugin::StopServing() {
  registered_ = false;
  if (service_ != nullptr) service_->Close();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
  service_.reset();
}

void DevicePlugin::Run() {
  std::string last_error;
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_) {
    lock.unlock();
    if (registered_) {
      // A restarted kubelet replaces kubelet.sock and removes our socket: start over.
      const uint64_t inode = KubeletSocketInode();
      if (inode != registered_kubelet_inode_ || !OwnSocketExists()) {
        std::fprintf(stderr, "orion-agent: kubelet restarted; registering again\n");
        StopServing();
      }
    }
    if (!registered_ && KubeletSocketInode() != 0) {
      absl::Status s = ServeAndRegister();
      if (!s.ok() && std::string(s.message()) != last_error) {
        last_error = std::string(s.message());
        std::fprintf(stderr, "orion-agent: %s\n", last_error.c_str());
      } else if (s.ok()) {
        last_error.clear();
      }
    }
    lock.lock();
    stop_cv_.wait_for(lock, config_.poll_interval, [this] { return stop_.load(); });
  }
}

}  // namespace orion::agent
