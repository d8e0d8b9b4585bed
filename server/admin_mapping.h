// The gRPC adapter's mapping between orion.v1 messages and the node's plain views
// (node_views.h): requests are checked for what only the wire can get wrong (unset enums,
// unknown field names) and turned into plain values; answers are turned into messages. The one
// place where the server's state meets proto types.
//
// Usage:
//   absl::StatusOr<PolicyChange> change = PolicyChangeFromProto(request);
//   ToProto(state.GetClient(id).value(), &client_message);
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "orion/v1/admin.pb.h"
#include "orion/v1/agent.pb.h"
#include "server/node_views.h"

namespace orion::server {

orion::v1::Priority ToProto(contract::Priority p);
orion::v1::GateMode ToProto(contract::GateMode m);
// PRIORITY_HIGH or PRIORITY_BEST_EFFORT; `what` names the field in the error.
absl::StatusOr<contract::Priority> PriorityFromProto(orion::v1::Priority p, const char* what);

void ToProto(const ClientView& v, orion::v1::Client* out);
void ToProto(const GpuView& v, orion::v1::Gpu* out);
void ToProto(const JobView& v, orion::v1::Job* out);
void ToProto(const GpuPolicy& p, orion::v1::PolicyKnobs* out);
void ToProto(const KernelProfileView& v, orion::v1::KernelProfileResponse* out);
void ToProto(const std::vector<RecordingWindow>& v, orion::v1::RecordingState* out);
void ToProto(const NamedSpan& n, orion::v1::TimelineSpan* out);
void ToProto(const TimelineView& v, orion::v1::TimelineResponse* out);
void ToProto(const TimelineView& v, orion::v1::TimelineChunk* out);
void ToProto(const PodSync& v, orion::v1::UpsertPodsResponse* out);

ClientFilter FilterFromProto(const orion::v1::ListClientsRequest& r);
// The fields named in r.fields (all when empty), with the mode set when it is among them.
absl::StatusOr<PolicyChange> PolicyChangeFromProto(const orion::v1::SetPolicyRequest& r);
RecordingChange RecordingFromProto(const orion::v1::RecordingRequest& r);
absl::StatusOr<std::vector<PodPolicy>> PodsFromProto(const orion::v1::UpsertPodsRequest& r);

}  // namespace orion::server
