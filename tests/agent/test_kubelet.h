// A test kubelet (a double of the kubelet's device manager) speaking the real v1beta1 device
// plugin protocol: it serves Registration on <dir>/kubelet.sock and, like the kubelet, dials each
// registered plugin back, keeps one ListAndWatch stream open per resource and records every
// device list. Restart() behaves like a kubelet restart: stop, delete every socket in the
// folder, serve a new kubelet.sock.
// AdmitContainer() plays what the kube-scheduler's resource fit and the kubelet's device manager
// do for one container: refuse it when a resource has fewer free healthy devices than asked
// (the scheduler's "Insufficient <resource>"), else per resource ask the plugin's
// GetPreferredAllocation over the free devices, take its answer (only IDs that are free, at
// most as many as asked), fill what it lacks with free devices of the kubelet's own choosing
// (as devicesToAllocate does; Admission::use_preferred = false skips the plugin's answer, as a
// kubelet under the topology manager's alignment may), call Allocate with the IDs in an order
// of its own (the kubelet passes a Go set's UnsortedList) and keep the devices as used until
// Release().
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace orion::agent::testing {

// How the device manager picks a container's devices: with or without the plugin's preferred
// ones (TestKubelet::AdmitContainer).
struct KubeletAdmission {
  bool use_preferred = true;
};

class TestKubelet final : public v1beta1::Registration::Service {
 public:
  explicit TestKubelet(std::string dir) : dir_(std::move(dir)) {}
  ~TestKubelet() override { Stop(); }

  void Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix://" + dir_ + "/kubelet.sock",
                             grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }

  void Stop() {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
      server_.reset();
    }
    std::map<std::string, Watch> watches;
    {
      std::lock_guard<std::mutex> lock(mu_);
      watches.swap(watches_);
    }
    for (auto& [resource, w] : watches) {
      w.ctx->TryCancel();
      if (w.thread.joinable()) w.thread.join();
    }
  }

  // A restarting kubelet removes every socket in the device-plugins folder.
  void Restart() {
    Stop();
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() > 5 && name.substr(name.size() - 5) == ".sock") {
          unlink((dir_ + "/" + name).c_str());
        }
      }
      closedir(d);
    }
    Start();
  }

  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    Watch old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(*request);
      endpoints_[request->resource_name()] = request->endpoint();
      if (auto it = watches_.find(request->resource_name()); it != watches_.end()) {
        old = std::move(it->second);
        watches_.erase(it);
      }
    }
    cv_.notify_all();
    if (old.ctx != nullptr) {
      old.ctx->TryCancel();
      if (old.thread.joinable()) old.thread.join();
    }
    // The real kubelet dials back asynchronously after answering.
    Watch w;
    w.ctx = std::make_unique<grpc::ClientContext>();
    grpc::ClientContext* ctx = w.ctx.get();
    const std::string endpoint = request->endpoint();
    const std::string resource = request->resource_name();
    w.thread = std::thread([this, endpoint, resource, ctx] { WatchPlugin(endpoint, resource, ctx); });
    std::lock_guard<std::mutex> lock(mu_);
    watches_[resource] = std::move(w);
    return grpc::Status::OK;
  }

  std::unique_ptr<v1beta1::DevicePlugin::Stub> DialPlugin(const std::string& endpoint) {
    return v1beta1::DevicePlugin::NewStub(grpc::CreateChannel(
        "unix://" + dir_ + "/" + endpoint, grpc::InsecureChannelCredentials()));
  }

  // Waits until `pred` holds over the recorded state (or times out).
  bool WaitFor(const std::function<bool()>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, pred);
  }

  // Accessors; call with WaitFor or after it returned.
  std::vector<v1beta1::RegisterRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<v1beta1::ListAndWatchResponse> lists(const std::string& resource = "orion.io/gpu") {
    std::lock_guard<std::mutex> lock(mu_);
    return lists_[resource];
  }
  size_t num_requests_unlocked() const { return requests_.size(); }
  size_t num_lists_unlocked(const std::string& resource = "orion.io/gpu") const {
    auto it = lists_.find(resource);
    return it == lists_.end() ? 0 : it->second.size();
  }

  using Admission = KubeletAdmission;

  // One container's admission: `limits` resource -> count. Returns the Allocate answers by
  // resource and fills *devices with what it got (in the order Allocate was given them); an
  // error says which resource did not fit (nothing is kept then) or what the plugin answered.
  absl::StatusOr<std::map<std::string, v1beta1::ContainerAllocateResponse>> AdmitContainer(
      const std::string& container, const std::map<std::string, int>& limits,
      std::map<std::string, std::vector<std::string>>* devices = nullptr,
      Admission how = Admission{}) {
    std::map<std::string, std::vector<std::string>> free;
    std::map<std::string, std::string> endpoints;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [resource, count] : limits) {
        auto it = lists_.find(resource);
        const std::set<std::string>& used = used_[resource];
        if (it != lists_.end() && !it->second.empty()) {
          for (const auto& d : it->second.back().devices()) {
            if (d.health() == "Healthy" && used.count(d.id()) == 0) free[resource].push_back(d.id());
          }
        }
        // The scheduler's fit, which the kubelet's admission repeats.
        if (static_cast<int>(free[resource].size()) < count) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "0/1 nodes are available: 1 Insufficient ", resource, " (", container, " asks ",
              count, ", ", free[resource].size(), " free)"));
        }
        endpoints[resource] = endpoints_[resource];
      }
    }
    std::map<std::string, v1beta1::ContainerAllocateResponse> out;
    std::map<std::string, std::vector<std::string>> got;
    for (const auto& [resource, count] : limits) {
      auto stub = DialPlugin(endpoints[resource]);
      v1beta1::PreferredAllocationRequest pref;
      auto* c = pref.add_container_requests();
      for (const std::string& id : free[resource]) c->add_available_deviceids(id);
      c->set_allocation_size(count);
      v1beta1::PreferredAllocationResponse pref_out;
      grpc::ClientContext pctx;
      grpc::Status s = stub->GetPreferredAllocation(&pctx, pref, &pref_out);
      if (!s.ok()) return absl::InternalError("GetPreferredAllocation: " + s.error_message());
      const std::vector<std::string>& avail = free[resource];
      auto is_free = [&](const std::string& id) {
        return std::find(avail.begin(), avail.end(), id) != avail.end();
      };
      std::vector<std::string> ids;
      if (how.use_preferred) {
        for (const std::string& id : pref_out.container_responses(0).deviceids()) {
          if (static_cast<int>(ids.size()) < count && is_free(id) &&
              std::find(ids.begin(), ids.end(), id) == ids.end()) {
            ids.push_back(id);
          }
        }
      }
      // What the answer lacks comes from the free devices, last listed first (not the plugin's
      // order: the kubelet's own choice).
      for (auto it = avail.rbegin(); it != avail.rend() && static_cast<int>(ids.size()) < count;
           ++it) {
        if (std::find(ids.begin(), ids.end(), *it) == ids.end()) ids.push_back(*it);
      }
      // Allocate gets them in an order of the kubelet's (here: reversed), not the plugin's.
      std::reverse(ids.begin(), ids.end());
      v1beta1::AllocateRequest alloc;
      auto* a = alloc.add_container_requests();
      for (const std::string& id : ids) a->add_devices_ids(id);
      v1beta1::AllocateResponse alloc_out;
      grpc::ClientContext actx;
      s = stub->Allocate(&actx, alloc, &alloc_out);
      if (!s.ok()) return absl::InternalError("Allocate: " + s.error_message());
      out[resource] = alloc_out.container_responses(0);
      got[resource] = ids;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [resource, ids] : got) {
      used_[resource].insert(ids.begin(), ids.end());
      held_[container][resource] = ids;
    }
    if (devices != nullptr) *devices = got;
    return out;
  }

  // The container's pod went away: its devices are free again.
  void Release(const std::string& container) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [resource, ids] : held_[container]) {
      for (const std::string& id : ids) used_[resource].erase(id);
    }
    held_.erase(container);
  }

 private:
  struct Watch {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::thread thread;
  };

  void WatchPlugin(const std::string& endpoint, const std::string& resource,
                   grpc::ClientContext* ctx) {
    auto stub = DialPlugin(endpoint);
    v1beta1::Empty empty;
    auto reader = stub->ListAndWatch(ctx, empty);
    v1beta1::ListAndWatchResponse response;
    while (reader->Read(&response)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        lists_[resource].push_back(response);
      }
      cv_.notify_all();
    }
    reader->Finish();
  }

  const std::string dir_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1beta1::RegisterRequest> requests_;
  std::map<std::string, std::vector<v1beta1::ListAndWatchResponse>> lists_;
  std::map<std::string, std::string> endpoints_;  // resource -> plugin socket
  std::map<std::string, Watch> watches_;          // resource -> ListAndWatch stream
  std::map<std::string, std::set<std::string>> used_;  // resource -> allocated device IDs
  std::map<std::string, std::map<std::string, std::vector<std::string>>> held_;  // container
};

}  // namespace orion::agent::testing
