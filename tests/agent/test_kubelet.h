// A test kubelet speaking the real v1beta1 device plugin protocol: it serves Registration on
// <dir>/kubelet.sock and, like the kubelet's device manager, dials the registered plugin back,
// keeps a ListAndWatch stream open and records every device list. Restart() behaves like a
// kubelet restart: stop, delete every socket in the folder, serve a new kubelet.sock.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace orion::agent::testing {

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
    if (watch_ctx_ != nullptr) watch_ctx_->TryCancel();
    if (watcher_.joinable()) watcher_.join();
    watch_ctx_.reset();
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(*request);
    }
    cv_.notify_all();
    // The real kubelet dials back asynchronously after answering.
    if (watcher_.joinable()) {
      if (watch_ctx_) watch_ctx_->TryCancel();
      watcher_.join();
    }
    watch_ctx_ = std::make_unique<grpc::ClientContext>();
    const std::string endpoint = request->endpoint();
    watcher_ = std::thread([this, endpoint] { Watch(endpoint); });
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
  std::vector<v1beta1::ListAndWatchResponse> lists() {
    std::lock_guard<std::mutex> lock(mu_);
    return lists_;
  }
  size_t num_requests_unlocked() const { return requests_.size(); }
  size_t num_lists_unlocked() const { return lists_.size(); }

 private:
  void Watch(const std::string& endpoint) {
    auto stub = DialPlugin(endpoint);
    v1beta1::Empty empty;
    auto reader = stub->ListAndWatch(watch_ctx_.get(), empty);
    v1beta1::ListAndWatchResponse response;
    while (reader->Read(&response)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        lists_.push_back(response);
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
  std::vector<v1beta1::ListAndWatchResponse> lists_;
  std::unique_ptr<grpc::ClientContext> watch_ctx_;
  std::thread watcher_;
};

}  // namespace orion::agent::testing
