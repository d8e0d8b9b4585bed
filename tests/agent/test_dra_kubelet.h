// A test kubelet for DRA (a double of the kubelet's plugin watcher and DRA manager) speaking the
// real protocols over Unix sockets: Register() finds the plugin's registration socket, calls
// GetInfo, checks the type and that it speaks v1.DRAPlugin, dials the endpoint and reports
// the outcome with NotifyRegistrationStatus, as the kubelet does; Prepare() and Unprepare()
// call NodePrepareResources and NodeUnprepareResources (v1, or v1beta1 when asked).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "pluginregistration/v1/api.grpc.pb.h"

namespace orion::agent::testing {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

struct TestClaim {
  std::string ns, uid, name;
};

class TestDraKubelet {
 public:
  absl::StatusOr<::pluginregistration::PluginInfo> Register(const std::string& registration_socket,
                                                           bool accept = true) {
    auto reg = ::pluginregistration::Registration::NewStub(grpc::CreateChannel(
        "unix://" + registration_socket, grpc::InsecureChannelCredentials()));
    ::pluginregistration::PluginInfo info;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc::Status s = reg->GetInfo(&ctx, {}, &info);
      if (!s.ok()) return absl::UnavailableError("GetInfo: " + s.error_message());
    }
    const auto& v = info.supported_versions();
    const bool v1 = std::find(v.begin(), v.end(), "v1.DRAPlugin") != v.end();
    std::string error;
    if (info.type() != "DRAPlugin") error = "type is not DRAPlugin";
    if (!v1) error = "no supported version this kubelet speaks";
    if (!accept) error = "refused by the test";
    ::pluginregistration::RegistrationStatus status;
    status.set_plugin_registered(error.empty());
    status.set_error(error);
    grpc::ClientContext ctx;
    ::pluginregistration::RegistrationStatusResponse reply;
    grpc::Status s = reg->NotifyRegistrationStatus(&ctx, status, &reply);
    if (!s.ok()) return absl::UnavailableError("NotifyRegistrationStatus: " + s.error_message());
    if (error.empty()) channel_ = grpc::CreateChannel("unix://" + info.endpoint(),
                                                      grpc::InsecureChannelCredentials());
    return info;
  }

  absl::StatusOr<drav1::NodePrepareResourcesResponse> Prepare(const std::vector<TestClaim>& claims,
                                                              bool v1beta1 = false) {
    drav1::NodePrepareResourcesRequest request;
    AddClaims(claims, request.mutable_claims());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s;
    drav1::NodePrepareResourcesResponse out;
    if (v1beta1) {
      drav1beta1::NodePrepareResourcesRequest old;
      old.ParseFromString(request.SerializeAsString());
      drav1beta1::NodePrepareResourcesResponse reply;
      s = drav1beta1::DRAPlugin::NewStub(channel_)->NodePrepareResources(&ctx, old, &reply);
      out.ParseFromString(reply.SerializeAsString());
    } else {
      s = drav1::DRAPlugin::NewStub(channel_)->NodePrepareResources(&ctx, request, &out);
    }
    if (!s.ok()) return absl::UnavailableError("NodePrepareResources: " + s.error_message());
    return out;
  }

  absl::StatusOr<drav1::NodeUnprepareResourcesResponse> Unprepare(
      const std::vector<TestClaim>& claims) {
    drav1::NodeUnprepareResourcesRequest request;
    AddClaims(claims, request.mutable_claims());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    drav1::NodeUnprepareResourcesResponse out;
    grpc::Status s = drav1::DRAPlugin::NewStub(channel_)->NodeUnprepareResources(&ctx, request,
                                                                               &out);
    if (!s.ok()) return absl::UnavailableError("NodeUnprepareResources: " + s.error_message());
    return out;
  }

 private:
  static void AddClaims(const std::vector<TestClaim>& claims,
                        google::protobuf::RepeatedPtrField<drav1::Claim>* out) {
    for (const TestClaim& c : claims) {
      drav1::Claim* claim = out->Add();
      claim->set_namespace_(c.ns);
      claim->set_uid(c.uid);
      claim->set_name(c.name);
    }
  }

  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace orion::agent::testing
