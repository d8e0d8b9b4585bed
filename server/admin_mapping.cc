// orion.v1 messages to and from the node's plain views (admin_mapping.h).
#include "server/admin_mapping.h"

#include <algorithm>
#include <iterator>
#include <string>

#include <google/protobuf/descriptor.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/jobs.h"
#include "server/utf8.h"

namespace orion::server {

orion::v1::Priority ToProto(contract::Priority p) {
  return p == contract::Priority::kHigh ? orion::v1::PRIORITY_HIGH
                                        : orion::v1::PRIORITY_BEST_EFFORT;
}

orion::v1::GateMode ToProto(contract::GateMode m) {
  switch (m) {
    case contract::GateMode::kPassThrough: return orion::v1::GATE_MODE_PASS_THROUGH;
    case contract::GateMode::kPriority: return orion::v1::GATE_MODE_PRIORITY;
    case contract::GateMode::kMps: return orion::v1::GATE_MODE_MPS;
  }
  return orion::v1::GATE_MODE_UNSPECIFIED;
}

absl::StatusOr<contract::Priority> PriorityFromProto(orion::v1::Priority p, const char* what) {
  if (p == orion::v1::PRIORITY_HIGH) return contract::Priority::kHigh;
  if (p == orion::v1::PRIORITY_BEST_EFFORT) return contract::Priority::kBestEffort;
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be PRIORITY_HIGH or PRIORITY_BEST_EFFORT"));
}

void ToProto(const ClientView& v, orion::v1::Client* out) {
  out->set_client_id(v.client_id);
  out->set_slot(v.slot);
  out->set_gpu(v.gpu);
  out->set_host_pid(v.host_pid);
  out->set_uid(v.uid);
  out->set_process_name(v.process_name);
  out->set_pod_uid(v.pod_uid);
  out->set_container_id(v.container_id);
  out->set_pod(v.pod);
  out->set_namespace_(v.ns);
  out->set_priority(ToProto(v.policy.priority));
  out->set_priority_source(v.policy.source);
  out->set_paused(v.paused);
  out->set_memory_used_bytes(v.memory_used_bytes);
  out->set_memory_peak_bytes(v.memory_peak_bytes);
  out->set_memory_limit_bytes(v.policy.memory_limit_bytes);
  out->set_kernels_launched(v.kernels_launched);
  out->set_throttled_ns(v.throttled_ns);
  out->set_events_dropped(v.events_dropped);
  out->set_registered_unix_ms(v.registered_unix_ms);
  out->set_latency_target_us(v.policy.latency_target_us);
  out->set_usable_millicpus(v.usable_millicpus);
  out->set_exited(v.exited);
  out->set_quarantined(v.quarantined);
  out->set_events_quarantined(v.events_quarantined);
  out->set_job(v.job.key);
  out->set_gpu_busy_seconds(v.gpu_busy_seconds);
}

void ToProto(const JobView& v, orion::v1::Job* out) {
  out->set_key(v.key);
  out->set_namespace_(v.ns);
  out->set_name(v.name);
  out->set_priority(v.mixed_priority ? orion::v1::PRIORITY_UNSPECIFIED : ToProto(v.priority));
  out->set_paused(v.paused);
  out->set_ranks(v.ranks);
  for (const auto& [g, ranks] : v.ranks_per_gpu) out->add_gpus(g);
  for (const std::string& p : v.pods) out->add_pods(p);
  for (uint32_t id : v.client_ids) out->add_client_ids(id);
  out->set_held_seconds(v.held_seconds);
  out->set_busy_seconds(v.busy_seconds);
  out->set_memory_used_bytes(v.memory_used_bytes);
  out->set_gpus_beside_services(v.gpus_beside_services);
}

void ToProto(const GpuView& v, orion::v1::Gpu* out) {
  out->set_index(v.index);
  out->set_uuid(v.uuid);
  out->set_node(v.node);
  out->set_mode(ToProto(v.mode));
  out->set_clients(v.clients);
  out->set_high_priority_clients(v.high_priority_clients);
  out->set_high_priority_busy(v.high_priority_busy);
  out->set_high_priority_pods(v.high_priority_pods);
  out->set_high_priority_pods_allowed(v.high_priority_pods_allowed);
  out->set_high_priority_overcommitted(v.high_priority_overcommitted);
  out->set_busy_seconds(v.busy_seconds);
}

void ToProto(const GpuPolicy& p, orion::v1::PolicyKnobs* out) {
  out->set_mode(ToProto(p.knobs.mode));
  out->set_be_budget_us(p.knobs.be_budget_ns / 1000);
  out->set_sm_threshold(p.knobs.sm_threshold);
  out->set_spin_us(p.knobs.spin_ns / 1000);
  out->set_hp_stale_ms(static_cast<uint32_t>(p.knobs.hp_stale_ns / 1000000));
  out->set_hp_grace_us(static_cast<uint32_t>(p.knobs.hp_grace_ns / 1000));
  out->set_adapt_budget(p.adapt_budget);
  out->set_gpu_hold(p.knobs.gpu_hold);
  out->set_gpu_hold_max_ms(static_cast<uint32_t>(p.knobs.gpu_hold_max_ns / 1000000));
  out->set_gpu_hold_release_ms(static_cast<uint32_t>(p.knobs.gpu_hold_release_ns / 1000000));
}

void ToProto(const KernelProfileView& v, orion::v1::KernelProfileResponse* out) {
  for (const KernelProfileView::Kernel& k : v.kernels) {
    orion::v1::KernelProfile* p = out->add_kernels();
    p->set_name(k.name);
    p->set_launches(k.launches);
    p->set_samples(k.samples);
    p->set_mean_duration_us(k.mean_duration_us);
    p->set_p99_duration_us(k.p99_duration_us);
    p->set_max_blocks(k.max_blocks);
    p->set_threads_per_block(k.threads_per_block);
    p->set_kind(k.kind);
  }
  out->set_orion_csv(v.orion_csv);
}

void ToProto(const std::vector<RecordingWindow>& v, orion::v1::RecordingState* out) {
  for (const RecordingWindow& w : v) {
    orion::v1::GpuRecording* g = out->add_gpus();
    g->set_gpu(w.gpu);
    g->set_from_unix_ms(w.from_unix_ms);
    g->set_until_unix_ms(w.until_unix_ms);
    g->set_spans_recorded(w.spans_recorded);
  }
}

void ToProto(const NamedSpan& n, orion::v1::TimelineSpan* p) {
  const Span& s = n.span;
  p->set_client_id(s.client_id);
  p->set_priority(ToProto(static_cast<contract::Priority>(s.priority)));
  p->set_kind(SpanKindName(s.kind));
  p->set_name(n.name);
  if (s.kind == SpanKind::kStep) {
    p->set_depth(s.depth);
    p->set_cpu_start_unix_ns(s.cpu_start_unix_ns);
    p->set_cpu_duration_ns(s.cpu_duration_ns);
  }
  p->set_start_unix_ns(s.start_unix_ns);
  p->set_duration_ns(s.duration_ns);
  p->set_bytes(s.bytes);
  p->set_measured(s.measured);
}

void ToProto(const TimelineView& v, orion::v1::TimelineResponse* out) {
  out->set_truncated(v.truncated);
  out->set_server_now_unix_ns(v.server_now_unix_ns);
  for (const NamedSpan& n : v.spans) ToProto(n, out->add_spans());
}

void ToProto(const TimelineView& v, orion::v1::TimelineChunk* out) {
  out->set_cursor(v.cursor);
  out->set_lost(v.lost);
  out->set_server_now_unix_ns(v.server_now_unix_ns);
  for (const NamedSpan& n : v.spans) ToProto(n, out->add_spans());
}

void ToProto(const PodSync& v, orion::v1::UpsertPodsResponse* out) {
  out->set_pods_known(v.pods_known);
  out->set_clients_updated(v.clients_updated);
}

ClientFilter FilterFromProto(const orion::v1::ListClientsRequest& r) {
  ClientFilter f;
  if (r.has_gpu_filter()) f.gpu = r.gpu();
  f.ns = r.namespace_();
  f.pod = r.pod();
  f.include_exited = r.include_exited();
  return f;
}

absl::StatusOr<PolicyChange> PolicyChangeFromProto(const orion::v1::SetPolicyRequest& r) {
  // The knobs are PolicyKnobs' fields (admin.proto): a field named that is not one is refused.
  const google::protobuf::Descriptor* knobs = orion::v1::PolicyKnobs::descriptor();
  std::vector<std::string> known;
  for (int i = 0; i < knobs->field_count(); ++i) known.push_back(knobs->field(i)->name());
  std::vector<std::string> fields(r.fields().begin(), r.fields().end());
  if (fields.empty()) fields = known;
  for (const std::string& f : fields) {
    if (knobs->FindFieldByName(f) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown field '", f, "' (expected ",
                                                     absl::StrJoin(known, ", "), ")"));
    }
  }
  auto has = [&](const char* f) {
    return std::find(fields.begin(), fields.end(), f) != fields.end();
  };
  const orion::v1::PolicyKnobs& k = r.knobs();
  PolicyChange c;
  c.all_gpus = r.all_gpus();
  c.gpu = r.gpu();
  if (has("mode")) {
    switch (k.mode()) {
      case orion::v1::GATE_MODE_PASS_THROUGH: c.mode = contract::GateMode::kPassThrough; break;
      case orion::v1::GATE_MODE_PRIORITY: c.mode = contract::GateMode::kPriority; break;
      case orion::v1::GATE_MODE_MPS: c.mode = contract::GateMode::kMps; break;
      default:
        return absl::InvalidArgumentError(
            "knobs.mode is unset: use GATE_MODE_PASS_THROUGH, GATE_MODE_PRIORITY or "
            "GATE_MODE_MPS, or leave 'mode' out of fields");
    }
  }
  if (has("be_budget_us")) c.be_budget_us = k.be_budget_us();
  if (has("sm_threshold")) c.sm_threshold = k.sm_threshold();
  if (has("spin_us")) c.spin_us = k.spin_us();
  if (has("hp_stale_ms")) c.hp_stale_ms = k.hp_stale_ms();
  if (has("hp_grace_us")) c.hp_grace_us = k.hp_grace_us();
  if (has("adapt_budget")) c.adapt_budget = k.adapt_budget();
  if (has("gpu_hold")) c.gpu_hold = k.gpu_hold();
  if (has("gpu_hold_max_ms")) c.gpu_hold_max_ms = k.gpu_hold_max_ms();
  if (has("gpu_hold_release_ms")) c.gpu_hold_release_ms = k.gpu_hold_release_ms();
  return c;
}

RecordingChange RecordingFromProto(const orion::v1::RecordingRequest& r) {
  return RecordingChange{r.all_gpus(), r.gpu(), r.from_unix_ms(), r.until_unix_ms()};
}

absl::StatusOr<std::vector<PodPolicy>> PodsFromProto(const orion::v1::UpsertPodsRequest& r) {
  std::vector<PodPolicy> pods;
  pods.reserve(r.pods_size());
  for (int i = 0; i < r.pods_size(); ++i) {
    const orion::v1::PodPolicy& p = r.pods(i);
    if (p.priority() == orion::v1::PRIORITY_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("pods[", i, "] (", p.namespace_(), "/", p.name(), "): priority is unset"));
    }
    absl::StatusOr<contract::Priority> priority =
        PriorityFromProto(p.priority(), absl::StrCat("pods[", i, "].priority").c_str());
    if (!priority.ok()) return priority.status();
    PodPolicy pod{p.pod_uid(), p.name(), p.namespace_(), *priority, p.memory_limit_bytes(),
                  p.latency_target_us()};
    if (!p.job().empty()) {
      if (absl::Status s = CheckJobName(p.job(), absl::StrCat("pods[", i, "].job (", p.namespace_(),
                                                             "/", p.name(), ")"));
          !s.ok()) {
        return s;
      }
      pod.job = p.job();
    }
    if (p.gpu_uuids_size() > static_cast<int>(contract::kMaxGpus)) {
      return absl::InvalidArgumentError(
          absl::StrCat("pods[", i, "] (", p.namespace_(), "/", p.name(), "): ",
                       p.gpu_uuids_size(), " gpu_uuids, more than a node has (",
                       contract::kMaxGpus, ")"));
    }
    for (int g = 0; g < p.gpu_uuids_size(); ++g) {
      const std::string& uuid = p.gpu_uuids(g);
      if (uuid.empty() || uuid.size() >= contract::kGpuUuidBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("pods[", i, "].gpu_uuids[", g, "] (", p.namespace_(), "/", p.name(),
                         "): '", SanitizeUtf8(uuid.substr(0, 64)), "' is not a GPU UUID (1 to ",
                         contract::kGpuUuidBytes - 1, " characters)"));
      }
      pod.gpu_uuids.push_back(SanitizeUtf8(uuid));
    }
    // A high device's GPU is one of the pod's GPUs: anything else is refused whole.
    for (int g = 0; g < p.high_gpu_uuids_size(); ++g) {
      const std::string uuid = SanitizeUtf8(p.high_gpu_uuids(g));
      if (std::find(pod.gpu_uuids.begin(), pod.gpu_uuids.end(), uuid) == pod.gpu_uuids.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("pods[", i, "].high_gpu_uuids[", g, "] (", p.namespace_(), "/",
                         p.name(), "): '", uuid.substr(0, 64), "' is not one of its gpu_uuids"));
      }
      pod.high_gpu_uuids.push_back(uuid);
    }
    pods.push_back(std::move(pod));
  }
  return pods;
}

}  // namespace orion::server
