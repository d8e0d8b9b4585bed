// Kubelet device plugin server, registration and kubelet-restart handling (see device_plugin.h).
#include "agent/device_plugin.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"

namespace orion::agent {

constexpr char kKubeletSocket[] = "kubelet.sock";
constexpr char kApiVersion[] = "v1beta1";

// DevicePlugin service of one serving period; a kubelet restart gets a fresh one.
class DevicePlugin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  Service(DevicePlugin::Inventory* inventory, DeviceKind kind, int per_gpu, std::string resource)
      : inventory_(inventory), kind_(kind), per_gpu_(per_gpu), resource_(std::move(resource)) {}

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
    GpuIdle idle;
    {
      std::lock_guard<std::mutex> lock(inventory_->mu);
      idle = inventory_->idle;
    }
    for (const auto& c : request->container_requests()) {
      std::vector<std::string> available(c.available_deviceids().begin(),
                                         c.available_deviceids().end());
      std::vector<std::string> must(c.must_include_deviceids().begin(),
                                    c.must_include_deviceids().end());
      auto* r = out->add_container_responses();
      for (std::string& id : PreferredShares(available, must, c.allocation_size(), idle)) {
        r->add_deviceids(std::move(id));
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* out) override {
    std::lock_guard<std::mutex> lock(inventory_->mu);
    // Every ID is checked before anything is answered: a bad one fails the whole request (the
    // kubelet then fails the pod's admission with this message) and hands nothing out.
    for (const auto& c : request->container_requests()) {
      if (c.devices_ids().empty()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("Allocate of ", resource_, ": a container with no devices"));
      }
      for (const std::string& id : c.devices_ids()) {
        const absl::Status s = CheckDeviceId(id, kind_, per_gpu_, inventory_->gpus,
                                             inventory_->departed, resource_);
        if (!s.ok()) {
          std::fprintf(stderr, "orion-agent: Allocate refused: %s\n",
                       std::string(s.message()).c_str());
          return grpc::Status(s.code() == absl::StatusCode::kFailedPrecondition
                                  ? grpc::StatusCode::FAILED_PRECONDITION
                                  : grpc::StatusCode::INVALID_ARGUMENT,
                              std::string(s.message()));
        }
      }
    }
    for (const auto& c : request->container_requests()) {
      std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
      // The kubelet may hand devices other than the preferred ones (it takes any free ones when
      // GetPreferredAllocation is short, or under the topology manager), and Allocate cannot
      // change them: the container gets the GPUs they name, each once, and the log says when
      // its devices share a GPU (a job of N ranks then finds fewer than N GPUs).
      const std::vector<std::string> gpus = GpusOfDevices(ids, inventory_->gpus);
      if (ids.size() > 1 && gpus.size() < ids.size()) {
        std::fprintf(stderr,
                     "orion-agent: Allocate of %s: %zu devices on %zu GPU(s) (%s), fewer GPUs "
                     "than devices (the node had no %zu GPUs with a free one, or the kubelet "
                     "chose the devices itself); the container sees %zu GPU(s)\n",
                     resource_.c_str(), ids.size(), gpus.size(), absl::StrJoin(gpus, ", ").c_str(),
                     ids.size(), gpus.size());
      }
      *out->add_container_responses() = ContainerAllocation(ids, inventory_->layout,
                                                            inventory_->gpus);
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
      for (int i = 0; i < per_gpu_; ++i) {
        v1beta1::Device* d = response.add_devices();
        d->set_id(kind_ == DeviceKind::kShare ? ShareId(gpu, i) : HighSlotId(gpu, i));
        d->set_health(healthy ? "Healthy" : "Unhealthy");
      }
    }
    return response;
  }

  DevicePlugin::Inventory* inventory_;
  const DeviceKind kind_;
  const int per_gpu_;
  const std::string resource_;
  bool closed_ = false;  // guarded by inventory_->mu
};

DevicePlugin::DevicePlugin(DevicePluginConfig config) : config_(std::move(config)) {
  std::lock_guard<std::mutex> lock(inventory_.mu);
  inventory_.layout = config_.layout;
  endpoints_.push_back({.resource = config_.resource_name,
                        .socket = config_.endpoint,
                        .kind = DeviceKind::kShare,
                        .per_gpu = config_.shares_per_gpu});
  if (config_.high_per_gpu > 0) {
    endpoints_.push_back({.resource = config_.high_resource_name,
                          .socket = config_.high_endpoint,
                          .kind = DeviceKind::kHighSlot,
                          .per_gpu = config_.high_per_gpu});
  }
}

DevicePlugin::~DevicePlugin() { Stop(); }

void DevicePlugin::SetGpus(const std::vector<std::string>& gpu_uuids) {
  std::lock_guard<std::mutex> lock(inventory_.mu);
  if (inventory_.gpus == gpu_uuids) return;
  for (const std::string& g : inventory_.gpus) inventory_.departed.insert(g);
  for (const std::string& g : gpu_uuids) inventory_.departed.erase(g);
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

void DevicePlugin::SetGpuIdle(GpuIdle idle) {
  std::lock_guard<std::mutex> lock(inventory_.mu);
  inventory_.idle = std::move(idle);
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
  for (const Endpoint& e : endpoints_) {
    struct stat st {};
    const std::string path = absl::StrCat(config_.plugin_dir, "/", e.socket);
    if (stat(path.c_str(), &st) != 0) return false;
  }
  return true;
}

absl::Status DevicePlugin::ServeAndRegister() {
  for (Endpoint& e : endpoints_) {
    const std::string own = absl::StrCat(config_.plugin_dir, "/", e.socket);
    unlink(own.c_str());  // a stale socket from an earlier run would make bind fail
    e.service = std::make_unique<Service>(&inventory_, e.kind, e.per_gpu, e.resource);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("unix://", own), grpc::InsecureServerCredentials());
    builder.RegisterService(e.service.get());
    e.server = builder.BuildAndStart();
    if (e.server == nullptr) {
      StopServing();
      return absl::UnavailableError(absl::StrCat("cannot serve ", e.resource, " on ", own));
    }
  }
  const uint64_t inode = KubeletSocketInode();
  auto channel = grpc::CreateChannel(
      absl::StrCat("unix://", config_.plugin_dir, "/", kKubeletSocket),
      grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  for (const Endpoint& e : endpoints_) {
    v1beta1::RegisterRequest request;
    request.set_version(kApiVersion);
    request.set_endpoint(e.socket);
    request.set_resource_name(e.resource);
    request.mutable_options()->set_pre_start_required(false);
    request.mutable_options()->set_get_preferred_allocation_available(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1beta1::Empty reply;
    const grpc::Status status = stub->Register(&ctx, request, &reply);
    if (!status.ok()) {
      StopServing();
      return absl::UnavailableError(absl::StrCat("kubelet registration of ", e.resource,
                                                 " failed: ", status.error_message()));
    }
    std::fprintf(stderr, "orion-agent: registered %s with the kubelet (endpoint %s)\n",
                 e.resource.c_str(), e.socket.c_str());
  }
  registered_kubelet_inode_ = inode;
  registered_ = true;
  ++registrations_;
  return absl::OkStatus();
}

void DevicePlugin::StopServing() {
  registered_ = false;
  for (Endpoint& e : endpoints_) {
    if (e.service != nullptr) e.service->Close();
    if (e.server != nullptr) {
      e.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      e.server->Wait();
      e.server.reset();
    }
    e.service.reset();
  }
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
