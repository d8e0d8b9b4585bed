// The node's ResourceSlices and their publication (see resource_slice.h).
#include "agent/resource_slice.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace orion::agent {
namespace {

// This node's slices of the driver: a few, each at most 128 devices of about 300 bytes.
JsonLimits SliceListLimits() { return {.max_bytes = 8 << 20, .max_values = 200'000}; }

JsonValue Device(const std::string& name, const DraGpu& gpu, bool high, const std::string& mode) {
  JsonValue attributes = {{"uuid", {{"string", gpu.uuid}}},
                          {"index", {{"int", gpu.index}}},
                          {"high", {{"bool", high}}},
                          {"mode", {{"string", mode}}}};
  // Attribute strings are at most 64 characters.
  if (!gpu.product.empty()) attributes["product"] = {{"string", gpu.product.substr(0, 64)}};
  JsonValue device = {{"name", name}, {"attributes", std::move(attributes)}};
  if (gpu.memory_bytes > 0) {
    device["capacity"] = {{"memory", {{"value", std::to_string(gpu.memory_bytes)}}}};
  }
  return device;
}

std::string HttpError(const std::string& what, const kube::HttpResponse& r) {
  return absl::StrCat(what, ": HTTP ", r.status, " ", r.body.substr(0, 300));
}

}  // namespace

std::string ResourceSliceName(const std::string& node_name, size_t index) {
  // A name is at most 253 characters; node names of more than 220 are cut (they are rare).
  return absl::StrCat(node_name.substr(0, 220), "-", kDraDriverName, "-", index);
}

std::vector<JsonValue> NodeResourceSlices(const DraInventory& inventory, const std::string& mode,
                                          int64_t generation, const std::string& node_uid) {
  std::vector<JsonValue> devices;
  for (const DraGpu& gpu : inventory.gpus) {
    for (int i = 0; i < inventory.shares_per_gpu; ++i) {
      devices.push_back(Device(DraShareDeviceName(gpu.index, i), gpu, false, mode));
    }
    for (int i = 0; i < inventory.high_per_gpu; ++i) {
      devices.push_back(Device(DraHighDeviceName(gpu.index, i), gpu, true, mode));
    }
  }
  const size_t count =
      std::max<size_t>(1, (devices.size() + kMaxDevicesPerSlice - 1) / kMaxDevicesPerSlice);
  std::vector<JsonValue> slices;
  for (size_t s = 0; s < count; ++s) {
    JsonValue part = JsonValue::array();
    for (size_t i = s * kMaxDevicesPerSlice;
         i < std::min(devices.size(), (s + 1) * kMaxDevicesPerSlice); ++i) {
      part.push_back(std::move(devices[i]));
    }
    slices.push_back(
        {{"apiVersion", "resource.k8s.io/v1"},
         {"kind", "ResourceSlice"},
         {"metadata", {{"name", ResourceSliceName(inventory.node_name, s)}}},
         {"spec",
          {{"driver", kDraDriverName},
           {"nodeName", inventory.node_name},
           {"pool",
            {{"name", inventory.node_name},
             {"generation", generation},
             {"resourceSliceCount", static_cast<int64_t>(count)}}},
           {"devices", std::move(part)}}}});
    if (!node_uid.empty()) {
      slices.back()["metadata"]["ownerReferences"] =
          JsonValue::array({{{"apiVersion", "v1"},
                             {"kind", "Node"},
                             {"name", inventory.node_name},
                             {"uid", node_uid},
                             {"controller", true}}});
    }
  }
  return slices;
}

absl::StatusOr<std::vector<ResourceSlicePublisher::Existing>> ResourceSlicePublisher::ListOwn() {
  const std::string path = absl::StrCat(
      kResourceSlicesPath, "?fieldSelector=",
      kube::UrlEncode(absl::StrCat("spec.nodeName=", node_name_, ",spec.driver=", kDraDriverName)));
  absl::StatusOr<kube::HttpResponse> r = api_->Get(path);
  if (!r.ok()) return r.status();
  if (r->status != 200) return absl::UnavailableError(HttpError("listing ResourceSlices", *r));
  absl::StatusOr<JsonValue> list = ParseJson(r->body, SliceListLimits());
  if (!list.ok()) {
    return absl::UnavailableError(
        absl::StrCat("listing ResourceSlices: ", list.status().message()));
  }
  std::vector<Existing> out;
  const JsonValue* items = Member(*list, "items");
  if (items == nullptr || !items->is_array()) return out;
  for (const JsonValue& item : *items) {
    // The field selector should have done this; a server that ignores it must not make the
    // agent delete other nodes' or drivers' slices.
    if (StringAt(item, {"spec", "nodeName"}) != node_name_ ||
        StringAt(item, {"spec", "driver"}) != kDraDriverName) {
      continue;
    }
    Existing e{.name = StringAt(item, {"metadata", "name"}),
               .resource_version = StringAt(item, {"metadata", "resourceVersion"})};
    const JsonValue* g = At(item, {"spec", "pool", "generation"});
    if (g != nullptr && g->is_number_integer()) e.generation = g->get<int64_t>();
    if (!e.name.empty()) out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::string> ResourceSlicePublisher::NodeUid() {
  if (!node_uid_.empty()) return node_uid_;
  absl::StatusOr<kube::HttpResponse> r =
      api_->Get(absl::StrCat("/api/v1/nodes/", kube::UrlEncode(node_name_)));
  if (!r.ok()) return r.status();
  if (r->status != 200) return absl::UnavailableError(HttpError("reading the Node", *r));
  // A Node object is a few KB to a few tens of KB (images, conditions).
  absl::StatusOr<JsonValue> node = ParseJson(r->body, {.max_bytes = 1 << 20});
  if (!node.ok()) {
    return absl::UnavailableError(absl::StrCat("reading the Node: ", node.status().message()));
  }
  const std::string uid = StringAt(*node, {"metadata", "uid"});
  if (StringAt(*node, {"metadata", "name"}) != node_name_ || uid.empty() || uid.size() > 64) {
    return absl::UnavailableError("reading the Node: not this node's object, or no UID");
  }
  node_uid_ = uid;
  return node_uid_;
}

absl::Status ResourceSlicePublisher::Publish(const DraInventory& inventory,
                                             const std::string& mode) {
  absl::StatusOr<std::string> owner = NodeUid();
  owner_problem_ = owner.ok() ? "" : std::string(owner.status().message());
  absl::StatusOr<std::vector<Existing>> existing = ListOwn();
  if (!existing.ok()) return existing.status();
  int64_t newest = generation_;
  for (const Existing& e : *existing) newest = std::max(newest, e.generation);
  // A new generation tells the scheduler that slices of older ones are stale.
  const int64_t generation = newest + 1;
  std::vector<JsonValue> slices =
      NodeResourceSlices(inventory, mode, generation, owner.ok() ? *owner : "");
  std::set<std::string> wanted;
  for (JsonValue& slice : slices) {
    const std::string name = StringAt(slice, {"metadata", "name"});
    wanted.insert(name);
    auto found = std::find_if(existing->begin(), existing->end(),
                              [&](const Existing& e) { return e.name == name; });
    absl::StatusOr<kube::HttpResponse> r;
    if (found == existing->end()) {
      r = api_->Post(kResourceSlicesPath, WriteJson(slice));
    } else {
      slice["metadata"]["resourceVersion"] = found->resource_version;
      r = api_->Put(absl::StrCat(kResourceSlicesPath, "/", name), WriteJson(slice));
    }
    if (!r.ok()) return r.status();
    if (r->status != 200 && r->status != 201) {
      return absl::UnavailableError(HttpError(absl::StrCat("writing ResourceSlice ", name), *r));
    }
  }
  for (const Existing& e : *existing) {
    if (wanted.count(e.name) > 0) continue;
    absl::StatusOr<kube::HttpResponse> r = api_->Delete(absl::StrCat(kResourceSlicesPath, "/", e.name));
    if (!r.ok()) return r.status();
    if (r->status != 200 && r->status != 202 && r->status != 404) {
      return absl::UnavailableError(HttpError(absl::StrCat("deleting ResourceSlice ", e.name), *r));
    }
  }
  generation_ = generation;
  return absl::OkStatus();
}

absl::Status ResourceSlicePublisher::Withdraw() {
  absl::StatusOr<std::vector<Existing>> existing = ListOwn();
  if (!existing.ok()) return existing.status();
  for (const Existing& e : *existing) {
    absl::StatusOr<kube::HttpResponse> r = api_->Delete(absl::StrCat(kResourceSlicesPath, "/", e.name));
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

}  // namespace orion::agent
