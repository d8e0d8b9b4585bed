// Node scheduler state: admission, ring draining, policy loop and admin queries (node_state.h).
#include "server/node_state.h"

#include <cstdio>

#include <fnmatch.h>
#include <time.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace orion::server {

using contract::Event;
using contract::EventKind;
using contract::Priority;
using contract::RegisterStatus;

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

int64_t RealtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000ll + ts.tv_nsec;
}

orion::v1::Priority ToProtoPriority(Priority p) {
  return p == Priority::kHigh ? orion::v1::PRIORITY_HIGH : orion::v1::PRIORITY_BEST_EFFORT;
}

namespace {

// Copies a fixed-size char field that a client filled; never trusts the terminator.
template <size_t N>
std::string FixedString(const char (&field)[N]) {
  return std::string(field, strnlen(field, N));
}

orion::v1::GateMode ToProtoMode(contract::GateMode m) {
  switch (m) {
    case contract::GateMode::kPassThrough: return orion::v1::GATE_MODE_PASS_THROUGH;
    case contract::GateMode::kPriority: return orion::v1::GATE_MODE_PRIORITY;
    case contract::GateMode::kMps: return orion::v1::GATE_MODE_MPS;
  }
  return orion::v1::GATE_MODE_UNSPECIFIED;
}

constexpr uint64_t kStuckEntryTimeoutNs = 200ull * 1000000ull;        // 200 ms
constexpr size_t kMaxDrainPerClient = 1u << 16;

// A high-priority slot is busy as the gate sees it (the contract's rule).
bool SlotBusy(const contract::SlotGate& s, uint64_t now, const GateKnobs& knobs) {
  return contract::HighPriorityActivityOf(s, now, knobs.hp_stale_ns, knobs.hp_grace_ns) !=
         contract::HighPriorityActivity::kIdle;
}

}  // namespace

absl::Status ValidateRegisterRequest(const contract::RegisterRequest& r, size_t bytes_read) {
  if (bytes_read != sizeof(contract::RegisterRequest)) {
    return absl::InvalidArgumentError(absl::StrCat("register request has ", bytes_read,
                                                   " bytes, expected ",
                                                   sizeof(contract::RegisterRequest)));
  }
  if (r.header.magic != contract::kWireMagic) {
    return absl::InvalidArgumentError(absl::StrCat("bad magic 0x", absl::Hex(r.header.magic),
                                                   " (not an orion client?)"));
  }
  if (r.header.version != contract::kWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat("protocol version ", r.header.version,
                                                   " not supported (server speaks ",
                                                   contract::kWireVersion, ")"));
  }
  if (r.header.type != static_cast<uint32_t>(contract::MessageType::kRegister) ||
      r.header.bytes != sizeof(contract::RegisterRequest)) {
    return absl::InvalidArgumentError(absl::StrCat("message type ", r.header.type, " with ",
                                                   r.header.bytes,
                                                   " bytes is not a register request"));
  }
  if (r.requested_priority != contract::kNoValue32 && r.requested_priority > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("requested_priority ", r.requested_priority, " is not 0, 1 or unset"));
  }
  if (r.device_ordinal > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_ordinal ", r.device_ordinal, " is out of range"));
  }
  return absl::OkStatus();
}

ClientPolicy DecidePolicy(const PeerIdentity& peer, const contract::RegisterRequest& request,
                          const ServerConfig& config, const orion::v1::PodPolicy* pod,
                          const Priority* pod_override) {
  ClientPolicy p;
  p.latency_target_us = config.policy.default_latency_target_us;
  const bool in_pod = !peer.cgroup.pod_uid.empty();
  if (in_pod) {
    if (pod) {
      p.priority = pod->priority() == orion::v1::PRIORITY_HIGH ? Priority::kHigh
                                                              : Priority::kBestEffort;
      p.source = "pod-annotation";
      p.memory_limit_bytes = pod->memory_limit_bytes();
      if (pod->latency_target_us()) p.latency_target_us = pod->latency_target_us();
    }
  } else {
    const std::string requested_name = FixedString(request.process_name);
    bool matched = false;
    for (const PriorityRule& rule : config.rules) {
      if (rule.uid && *rule.uid != peer.uid) continue;
      if (!rule.process_glob.empty() &&
          fnmatch(rule.process_glob.c_str(), peer.process_name.c_str(), 0) != 0 &&
          fnmatch(rule.process_glob.c_str(), requested_name.c_str(), 0) != 0) {
        continue;
      }
      p.priority = rule.priority;
      p.memory_limit_bytes = rule.memory_limit_bytes;
      if (rule.latency_target_us) p.latency_target_us = rule.latency_target_us;
      p.source = "config-rule";
      matched = true;
      break;
    }
    if (!matched && config.trust_client_requests) {
      if (request.requested_priority != contract::kNoValue32) {
        p.priority = static_cast<Priority>(request.requested_priority);
        p.source = "orion-run";
      }
      if (request.requested_memory_limit) {
        p.memory_limit_bytes = request.requested_memory_limit;
        p.source = "orion-run";
      }
      if (request.requested_latency_target_us) {
        p.latency_target_us = request.requested_latency_target_us;
      }
    }
  }
  if (pod_override) {
    p.priority = *pod_override;
    p.source = "admin";
  }
  return p;
}

NodeState::NodeState(ServerConfig config, std::unique_ptr<NodeBoard> board)
    : config_(std::move(config)),
      board_(std::move(board)),
      mono_to_unix_(RealtimeNs() - static_cast<int64_t>(MonotonicNs())),
      ingest_options_{mono_to_unix_, config_.request_range_prefix, config_.hp_latency_window},
      budget_controller_(BudgetLimits{}) {
  absl::MutexLock lock(&mu_);
  gpu_policy_.resize(contract::kMaxGpus);
  timelines_.reserve(contract::kMaxGpus);
  for (uint32_t i = 0; i < contract::kMaxGpus; ++i) {
    timelines_.emplace_back(config_.timeline_spans_per_gpu);
    GpuPolicy& g = gpu_policy_[i];
    g.knobs.mode = config_.policy.mode;
    g.knobs.be_budget_ns = config_.policy.be_budget_us * 1000;
    g.budget_set = config_.policy.be_budget_set;
    g.knobs.sm_threshold = config_.policy.sm_threshold;
    g.knobs.spin_ns = config_.policy.spin_us * 1000;
    g.knobs.hp_stale_ns = static_cast<uint64_t>(config_.policy.hp_stale_ms) * 1000000;
    g.knobs.hp_grace_ns = static_cast<uint64_t>(config_.policy.hp_grace_us) * 1000;
    g.adapt_budget = config_.policy.adapt_budget;
  }
  for (const std::string& uuid : config_.gpus) {
    const int idx = board_->FindOrAddGpu(uuid);
    if (idx >= 0) board_->PublishKnobs(idx, gpu_policy_[idx].knobs);
  }
}

int NodeState::GpuIndexFor(const contract::RegisterRequest& r) {
  std::string uuid = FixedString(r.gpu_uuid);
  if (uuid.empty()) uuid = absl::StrCat("ordinal-", r.device_ordinal);
  const bool known = board_->FindGpu(uuid) >= 0;
  const int idx = board_->FindOrAddGpu(uuid);
  if (idx >= 0 && !known) board_->PublishKnobs(idx, gpu_policy_[idx].knobs);
  return idx;
}

NodeState::Admission NodeState::Register(const PeerIdentity& peer,
                                         const contract::RegisterRequest& request) {
  absl::MutexLock lock(&mu_);
  Admission a;
  const int gpu = GpuIndexFor(request);
  if (gpu < 0) {
    a.status = RegisterStatus::kUnknownGpu;
    a.message = absl::StrCat("GPU '", FixedString(request.gpu_uuid), "' is not on this board (",
                             contract::kMaxGpus, " GPUs at most)");
    ++registrations_failed_["unknown-gpu"];
    return a;
  }
  const orion::v1::PodPolicy* pod = nullptr;
  const Priority* pod_override = nullptr;
  if (!peer.cgroup.pod_uid.empty()) {
    if (auto it = pods_.find(peer.cgroup.pod_uid); it != pods_.end()) pod = &it->second;
    if (auto it = pod_overrides_.find(peer.cgroup.pod_uid); it != pod_overrides_.end()) {
      pod_override = &it->second;
    }
  }
  ClientPolicy policy = DecidePolicy(peer, request, config_, pod, pod_override);
  const uint32_t id = next_client_id_++;
  auto slot = board_->AssignSlot(id, static_cast<uint32_t>(peer.pid), static_cast<uint32_t>(gpu),
                                 policy.priority, policy.memory_limit_bytes);
  if (!slot) {
    a.status = RegisterStatus::kNoSlot;
    a.message = absl::StrCat("all ", contract::kMaxSlots, " client slots of this node are in use");
    ++registrations_failed_["no-slot"];
    return a;
  }
  ClientRecord& c = clients_.try_emplace(id, id, &ingest_options_).first->second;
  c.slot = *slot;
  c.gpu = static_cast<uint32_t>(gpu);
  c.peer = peer;
  c.process_name = peer.process_name.empty() ? FixedString(request.process_name)
                                             : peer.process_name;
  c.policy = policy;
  c.admin_priority = pod_override != nullptr;
  c.registered_unix_ms = RealtimeNs() / 1000000;
  ++registrations_ok_;
  a.client_id = id;
  a.slot = *slot;
  a.generation = board_->board().slots[*slot].generation.load(std::memory_order_relaxed);
  a.gpu = static_cast<uint32_t>(gpu);
  a.board_fd = board_->board_fd();
  a.gate_fd = board_->gate_fd(a.gpu);
  a.area_fd = board_->area_fd(*slot);
  a.priority = policy.priority;
  a.memory_limit_bytes = policy.memory_limit_bytes;
  return a;
}

void NodeState::RecordRegistrationFailure(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  ++registrations_failed_[reason];
}

void NodeState::RecordRepair(const std::string& what) {
  absl::MutexLock lock(&mu_);
  ++repairs_[what];
}

void NodeState::Unregister(uint32_t client_id) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return;
  // Take what the client left in its ring before the slot is reused.
  ClientRecord& c = it->second;
  Event e{};
  auto& ring = board_->area(c.slot)->ring;
  // The client is gone, so no entry will be published any more: skip holes (a writer killed
  // mid-write) and keep reading the published entries behind them.
  for (size_t n = 0; n < contract::kRingCapacity; ++n) {
    if (ring.TryPop(&e)) {
      ConsumeEvent(c, e);
      ++events_ingested_;
    } else if (ring.HasPendingHole()) {
      ring.SkipStuckEntry();
      ++events_skipped_;
      c.ingest.CountMalformed(1);
    } else {
      break;
    }
  }
  // More than a ring's worth claimed but not read means the client wrote garbage into its
  // ring's indices: counted as skipped, never silently lost.
  const uint64_t head = ring.head.load(std::memory_order_acquire);
  const uint64_t tail = ring.tail.load(std::memory_order_acquire);
  const uint64_t left = head > tail ? std::min<uint64_t>(head - tail, contract::kRingCapacity) : 0;
  events_skipped_ += left;
  departed_written_ += tail + left;
  departed_dropped_ += ring.dropped.load(std::memory_order_relaxed);
  board_->FreeSlot(c.slot);
  if (c.policy.priority == Priority::kBestEffort && c.gpu < contract::kMaxGpus) {
    // A best-effort client that died with kernels in flight never gives its budget charges
    // back; start the GPU's count afresh (briefly over-admitting is the safe side).
    if (contract::GateArea* gate = board_->gate(c.gpu); gate != nullptr) {
      gate->words.be_outstanding_ns.store(0, std::memory_order_relaxed);
    }
  }
  clients_.erase(it);
}

void NodeState::ConsumeEvent(ClientRecord& c, const Event& e) {
  IngestSinks sinks{timelines_[c.gpu],
                    gpu_policy_[c.gpu].busy_ns[static_cast<size_t>(c.policy.priority)],
                    range_names_, known_kernels_};
  c.ingest.Consume(e, c.policy.priority, sinks);
}

size_t NodeState::DrainOnce(uint64_t now) {
  absl::MutexLock lock(&mu_);
  size_t total = 0;
  Event e{};
  for (auto& [id, c] : clients_) {
    auto& ring = board_->area(c.slot)->ring;
    // More than a ring's worth between tail and head cannot come from producers (they stop at a
    // full ring): the indices were written over. Start reading afresh at head, counted as
    // skipped, instead of skipping one phantom entry per timeout for the rest of the run.
    const uint64_t head = ring.head.load(std::memory_order_acquire);
    const uint64_t tail = ring.tail.load(std::memory_order_relaxed);
    if (head - tail > contract::kRingCapacity) {
      ring.tail.store(head, std::memory_order_release);
      events_skipped_ += contract::kRingCapacity;
      c.ingest.CountMalformed(contract::kRingCapacity);
      c.hole_since_ns = 0;
      continue;
    }
    size_t n = 0;
    while (n < kMaxDrainPerClient && ring.TryPop(&e)) {
      ConsumeEvent(c, e);
      ++n;
    }
    if (ring.HasPendingHole()) {
      // A producer claimed an entry and never published it (killed mid-write): skip it later.
      if (c.hole_since_ns == 0) {
        c.hole_since_ns = now;
      } else if (now - c.hole_since_ns > kStuckEntryTimeoutNs) {
        ring.SkipStuckEntry();
        c.ingest.CountMalformed(1);
        ++events_skipped_;
        c.hole_since_ns = 0;
      }
    } else {
      c.hole_since_ns = 0;
    }
    total += n;
  }
  events_ingested_ += total;
  return total;
}

std::vector<uint64_t> NodeState::BusySinceChange(const ClientRecord& c) const {
  return c.ingest.BusyPeriodsSince(c.busy_count_at_change);
}

void NodeState::RestartBudgetEvidence(uint32_t g) {
  for (auto& [id, c] : clients_) {
    if (c.gpu == g) c.busy_count_at_change = c.ingest.busy().count;
  }
}

void NodeState::PolicyTick(uint64_t now) {
  absl::MutexLock lock(&mu_);
  board_->Heartbeat(now);
  // Clients map the board read-only where the kernel can seal it; where it cannot, put back
  // whatever a tenant wrote over the server's fields.
  const bool log_now = now - last_correction_log_ns_ > 10'000'000'000ull;  // a line per 10 s
  if (const uint32_t fixed = board_->Reassert(); fixed > 0) {
    board_corrections_ += fixed;
    if (log_now) {
      last_correction_log_ns_ = now;
      std::fprintf(stderr,
                   "orion-server: %u server-owned board fields had been overwritten (by a "
                   "tenant with the board mapped); put back (%llu so far)\n",
                   fixed, static_cast<unsigned long long>(board_corrections_));
    }
  }
  // The gate areas are shared by the clients of a GPU: clear what no honest client writes.
  const GateRepairs gate = board_->CheckGates(now);
  if (gate.values_reset > 0) repairs_["gate-value"] += gate.values_reset;
  for (const uint32_t slot : gate.claimed_by) {
    ++repairs_["gate-claim"];
    for (auto& [id, c] : clients_) {
      if (c.slot != slot) continue;
      ++c.gate_claims_ignored;
      if (log_now) {
        last_correction_log_ns_ = now;
        std::fprintf(stderr,
                     "orion-server: client %u (%s, pid %d) is best-effort but claimed "
                     "high-priority work in its GPU's gate area; ignored and cleared (%llu "
                     "times)\n",
                     c.id, c.process_name.c_str(), c.peer.pid,
                     static_cast<unsigned long long>(c.gate_claims_ignored));
      }
    }
  }
  const uint32_t ngpus = board_->num_gpus();
  for (uint32_t g = 0; g < ngpus; ++g) {
    GpuPolicy& gp = gpu_policy_[g];
    if (!gp.adapt_budget || gp.knobs.mode == contract::GateMode::kPassThrough) continue;
    bool targeted = false;
    BudgetVerdict verdict = BudgetVerdict::kWait;
    for (const auto& [id, c] : clients_) {
      if (c.gpu != g || c.policy.priority != Priority::kHigh || c.policy.latency_target_us == 0) {
        continue;
      }
      targeted = true;
      const std::vector<uint64_t> fresh = BusySinceChange(c);
      const TailEvidence e =
          budget_controller_.Judge(fresh.data(), fresh.size(), c.policy.latency_target_us * 1000);
      verdict = BudgetController::Combine(verdict, budget_controller_.Verdict(e));
    }
    if (!targeted) continue;
    const uint64_t next = budget_controller_.Update(gp.knobs.be_budget_ns, verdict);
    if (next != gp.knobs.be_budget_ns) {
      gp.knobs.be_budget_ns = next;
      gp.budget_set = true;
      board_->PublishKnobs(g, gp.knobs);
      RestartBudgetEvidence(g);
    }
  }
}

orion::v1::Client NodeState::ToProto(const ClientRecord& c) const {
  const contract::ClientArea& area = *board_->area(c.slot);
  const contract::ClientArea::Counters& s = area.counters;
  orion::v1::Client out;
  out.set_client_id(c.id);
  out.set_slot(c.slot);
  out.set_gpu(c.gpu);
  out.set_host_pid(static_cast<uint32_t>(c.peer.pid));
  out.set_uid(c.peer.uid);
  out.set_process_name(c.process_name);
  out.set_pod_uid(c.peer.cgroup.pod_uid);
  out.set_container_id(c.peer.cgroup.container_id);
  if (auto it = pods_.find(c.peer.cgroup.pod_uid); it != pods_.end()) {
    out.set_pod(it->second.name());
    out.set_namespace_(it->second.namespace_());
  }
  out.set_priority(ToProtoPriority(c.policy.priority));
  out.set_priority_source(c.policy.source);
  out.set_paused(c.paused);
  // Client-written counters: read, never trusted for decisions.
  out.set_memory_used_bytes(s.memory_used_bytes.load(std::memory_order_relaxed));
  out.set_memory_peak_bytes(s.memory_peak_bytes.load(std::memory_order_relaxed));
  out.set_memory_limit_bytes(c.policy.memory_limit_bytes);
  const uint64_t slot_launches = s.launches.load(std::memory_order_relaxed);
  out.set_kernels_launched(std::max(slot_launches, c.ingest.launch_events()));
  out.set_throttled_ns(s.throttled_ns.load(std::memory_order_relaxed));
  out.set_events_dropped(area.ring.dropped.load(std::memory_order_relaxed));
  out.set_registered_unix_ms(c.registered_unix_ms);
  out.set_latency_target_us(c.policy.latency_target_us);
  return out;
}

std::vector<orion::v1::Gpu> NodeState::ListGpus() {
  absl::MutexLock lock(&mu_);
  std::vector<orion::v1::Gpu> out;
  const uint64_t now = MonotonicNs();
  for (uint32_t g = 0; g < board_->num_gpus(); ++g) {
    orion::v1::Gpu gpu;
    gpu.set_index(g);
    gpu.set_uuid(board_->gpu_uuid(g));
    gpu.set_node(config_.node_name);
    gpu.set_mode(ToProtoMode(gpu_policy_[g].knobs.mode));
    uint32_t n = 0, hp = 0;
    bool busy = false;
    for (const auto& [id, c] : clients_) {
      if (c.gpu != g) continue;
      ++n;
      if (c.policy.priority != Priority::kHigh) continue;
      ++hp;
      busy = busy || SlotBusy(board_->gate(g)->slots[c.slot], now, gpu_policy_[g].knobs);
    }
    gpu.set_clients(n);
    gpu.set_high_priority_clients(hp);
    gpu.set_high_priority_busy(busy);
    out.push_back(std::move(gpu));
  }
  return out;
}

std::vector<orion::v1::Client> NodeState::ListClients(const orion::v1::ListClientsRequest& f) {
  absl::MutexLock lock(&mu_);
  std::vector<orion::v1::Client> out;
  for (const auto& [id, c] : clients_) {
    if (f.has_gpu_filter() && c.gpu != f.gpu()) continue;
    orion::v1::Client p = ToProto(c);
    if (!f.namespace_().empty() && p.namespace_() != f.namespace_()) continue;
    if (!f.pod().empty() && p.pod() != f.pod()) continue;
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<orion::v1::Client> NodeState::GetClient(uint32_t client_id) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("no client with id ", client_id,
                                            " (list them with ListClients)"));
  }
  return ToProto(it->second);
}

absl::StatusOr<std::vector<orion::v1::Client>> NodeState::SetPriority(
    const orion::v1::SetPriorityRequest& r) {
  if (r.priority() != orion::v1::PRIORITY_HIGH && r.priority() != orion::v1::PRIORITY_BEST_EFFORT) {
    return absl::InvalidArgumentError(
        "priority must be PRIORITY_HIGH or PRIORITY_BEST_EFFORT");
  }
  const Priority p = r.priority() == orion::v1::PRIORITY_HIGH ? Priority::kHigh
                                                               : Priority::kBestEffort;
  absl::MutexLock lock(&mu_);
  std::vector<orion::v1::Client> changed;
  if (r.target_case() == orion::v1::SetPriorityRequest::kClientId) {
    auto it = clients_.find(r.client_id());
    if (it == clients_.end()) {
      return absl::NotFoundError(absl::StrCat("no client with id ", r.client_id()));
    }
    it->second.policy.priority = p;
    it->second.policy.source = "admin";
    it->second.admin_priority = true;
    board_->SetPriority(it->second.slot, p);
    changed.push_back(ToProto(it->second));
  } else if (r.target_case() == orion::v1::SetPriorityRequest::kPodUid) {
    if (r.pod_uid().empty()) return absl::InvalidArgumentError("pod_uid is empty");
    pod_overrides_[r.pod_uid()] = p;
    for (auto& [id, c] : clients_) {
      if (c.peer.cgroup.pod_uid != r.pod_uid()) continue;
      c.policy.priority = p;
      c.policy.source = "admin";
      c.admin_priority = true;
      board_->SetPriority(c.slot, p);
      changed.push_back(ToProto(c));
    }
  } else {
    return absl::InvalidArgumentError("set either client_id or pod_uid");
  }
  return changed;
}

absl::StatusOr<orion::v1::Client> NodeState::SetPaused(uint32_t client_id, bool paused) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("no client with id ", client_id));
  }
  it->second.paused = paused;
  board_->SetPaused(it->second.slot, paused);
  return ToProto(it->second);
}

orion::v1::PolicyKnobs NodeState::KnobsToProto(const GpuPolicy& p) const {
  orion::v1::PolicyKnobs k;
  k.set_mode(ToProtoMode(p.knobs.mode));
  k.set_be_budget_us(p.knobs.be_budget_ns / 1000);
  k.set_sm_threshold(p.knobs.sm_threshold);
  k.set_spin_us(p.knobs.spin_ns / 1000);
  k.set_hp_stale_ms(static_cast<uint32_t>(p.knobs.hp_stale_ns / 1000000));
  k.set_hp_grace_us(static_cast<uint32_t>(p.knobs.hp_grace_ns / 1000));
  k.set_adapt_budget(p.adapt_budget);
  return k;
}

absl::StatusOr<orion::v1::PolicyKnobs> NodeState::GetPolicy(uint32_t gpu) {
  absl::MutexLock lock(&mu_);
  if (gpu >= board_->num_gpus()) {
    return absl::NotFoundError(absl::StrCat("no GPU with index ", gpu, "; this node has ",
                                            board_->num_gpus(), " (see ListGpus)"));
  }
  return KnobsToProto(gpu_policy_[gpu]);
}

absl::StatusOr<orion::v1::PolicyKnobs> NodeState::SetPolicy(const orion::v1::SetPolicyRequest& r) {
  static const char* kFields[] = {"mode",        "be_budget_us", "sm_threshold", "spin_us",
                                  "hp_stale_ms", "hp_grace_us",  "adapt_budget"};
  std::vector<std::string> fields(r.fields().begin(), r.fields().end());
  if (fields.empty()) fields.assign(std::begin(kFields), std::end(kFields));
  for (const std::string& f : fields) {
    if (std::find(std::begin(kFields), std::end(kFields), f) == std::end(kFields)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown field '", f,
          "' (expected mode, be_budget_us, sm_threshold, spin_us, hp_stale_ms, hp_grace_us, "
          "adapt_budget)"));
    }
  }
  auto has = [&](const char* f) { return std::find(fields.begin(), fields.end(), f) != fields.end(); };
  const orion::v1::PolicyKnobs& k = r.knobs();
  if (has("mode") && k.mode() == orion::v1::GATE_MODE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "knobs.mode is unset: use GATE_MODE_PASS_THROUGH, GATE_MODE_PRIORITY or GATE_MODE_MPS, "
        "or leave 'mode' out of fields");
  }
  if (has("be_budget_us") && k.be_budget_us() > 1000000) {
    return absl::InvalidArgumentError("knobs.be_budget_us must be at most 1000000 (1 s)");
  }
  if (has("spin_us") && k.spin_us() > 10000) {
    return absl::InvalidArgumentError("knobs.spin_us must be at most 10000");
  }
  if (has("hp_stale_ms") && (k.hp_stale_ms() < 10 || k.hp_stale_ms() > 600000)) {
    return absl::InvalidArgumentError("knobs.hp_stale_ms must be in [10, 600000]");
  }
  if (has("hp_grace_us") && k.hp_grace_us() > 100000) {
    return absl::InvalidArgumentError("knobs.hp_grace_us must be at most 100000 (100 ms)");
  }
  absl::MutexLock lock(&mu_);
  if (!r.all_gpus() && r.gpu() >= board_->num_gpus()) {
    return absl::NotFoundError(absl::StrCat("no GPU with index ", r.gpu(), "; this node has ",
                                            board_->num_gpus(), " (see ListGpus)"));
  }
  // --all also covers GPUs that join the board later (discovered at a client's registration).
  const uint32_t first = r.all_gpus() ? 0 : r.gpu();
  const uint32_t last = r.all_gpus() ? contract::kMaxGpus : r.gpu() + 1;
  for (uint32_t g = first; g < last; ++g) {
    GpuPolicy& gp = gpu_policy_[g];
    if (has("mode")) {
      gp.knobs.mode = k.mode() == orion::v1::GATE_MODE_PASS_THROUGH ? contract::GateMode::kPassThrough
                      : k.mode() == orion::v1::GATE_MODE_MPS        ? contract::GateMode::kMps
                                                                     : contract::GateMode::kPriority;
      // A budget never set follows the mode's default; a set or adapted one stays.
      if (!has("be_budget_us") && !gp.budget_set) {
        gp.knobs.be_budget_ns = DefaultBeBudgetUs(gp.knobs.mode) * 1000;
      }
    }
    if (has("be_budget_us")) {
      gp.knobs.be_budget_ns = k.be_budget_us() * 1000;
      gp.budget_set = true;
    }
    if (has("be_budget_us") || has("mode")) RestartBudgetEvidence(g);
    if (has("sm_threshold")) gp.knobs.sm_threshold = k.sm_threshold();
    if (has("spin_us")) gp.knobs.spin_ns = k.spin_us() * 1000;
    if (has("hp_stale_ms")) gp.knobs.hp_stale_ns = static_cast<uint64_t>(k.hp_stale_ms()) * 1000000;
    if (has("hp_grace_us")) gp.knobs.hp_grace_ns = static_cast<uint64_t>(k.hp_grace_us()) * 1000;
    if (has("adapt_budget")) gp.adapt_budget = k.adapt_budget();
    board_->PublishKnobs(g, gp.knobs);
  }
  return KnobsToProto(gpu_policy_[first]);
}

std::string NodeState::SpanName(const Span& s) const {
  if (s.kind == SpanKind::kKernel) {
    auto it = clients_.find(s.client_id);
    const std::string* name =
        it == clients_.end() ? nullptr : it->second.ingest.profile().NameOf(s.func);
    return name ? *name : absl::StrCat("func@0x", absl::Hex(s.func));
  }
  return s.kind == SpanKind::kStep ? range_names_.NameOf(s.func) : std::string();
}

TimelineView NodeState::ViewOf(std::vector<Span> spans) const {
  TimelineView view;
  view.spans.reserve(spans.size());
  for (const Span& s : spans) view.spans.push_back(NamedSpan{s, SpanName(s)});
  view.server_now_unix_ns = RealtimeNs();
  return view;
}

absl::StatusOr<TimelineView> NodeState::TimelineAfter(uint32_t gpu, uint64_t cursor,
                                                      uint32_t max_spans) {
  absl::MutexLock lock(&mu_);
  if (gpu >= board_->num_gpus()) {
    return absl::NotFoundError(absl::StrCat("no GPU with index ", gpu, "; this node has ",
                                            board_->num_gpus()));
  }
  const size_t max = max_spans == 0 ? 1000 : std::min<uint32_t>(max_spans, 100000);
  uint64_t lost = 0;
  TimelineView view = ViewOf(timelines_[gpu].After(&cursor, max, &lost));
  view.cursor = cursor;
  view.lost = lost;
  return view;
}

absl::StatusOr<orion::v1::RecordingState> NodeState::SetRecording(
    const orion::v1::RecordingRequest& r) {
  absl::MutexLock lock(&mu_);
  constexpr int64_t kMaxUnixMs = INT64_MAX / 1000000;
  for (const auto& [name, ms] : {std::pair{"from_unix_ms", r.from_unix_ms()},
                                 std::pair{"until_unix_ms", r.until_unix_ms()}}) {
    if (ms < 0 || ms > kMaxUnixMs) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be in [0, ", kMaxUnixMs, "], got ", ms));
    }
  }
  if (r.until_unix_ms() != 0 && r.until_unix_ms() < r.from_unix_ms()) {
    return absl::InvalidArgumentError("until_unix_ms is before from_unix_ms");
  }
  if (!r.all_gpus() && r.gpu() >= board_->num_gpus()) {
    return absl::NotFoundError(absl::StrCat("no GPU with index ", r.gpu(), "; this node has ",
                                            board_->num_gpus()));
  }
  orion::v1::RecordingState out;
  for (uint32_t g = 0; g < board_->num_gpus(); ++g) {
    if (r.all_gpus() || g == r.gpu()) {
      timelines_[g].SetRecording(r.from_unix_ms() * 1000000, r.until_unix_ms() * 1000000);
    }
    auto* state = out.add_gpus();
    state->set_gpu(g);
    state->set_from_unix_ms(timelines_[g].record_from_ns() / 1000000);
    state->set_until_unix_ms(timelines_[g].record_until_ns() / 1000000);
    state->set_spans_recorded(timelines_[g].added());
  }
  return out;
}

absl::StatusOr<TimelineView> NodeState::TimelineWindow(uint32_t gpu, int64_t since_unix_ms,
                                                       int64_t until_unix_ms,
                                                       uint32_t max_spans) {
  absl::MutexLock lock(&mu_);
  if (gpu >= board_->num_gpus()) {
    return absl::NotFoundError(absl::StrCat("no GPU with index ", gpu, "; this node has ",
                                            board_->num_gpus()));
  }
  // Milliseconds that fit nanoseconds in an int64 (until year 2262); beyond, the multiplication
  // below would overflow.
  constexpr int64_t kMaxUnixMs = INT64_MAX / 1000000;
  for (const auto& [name, ms] : {std::pair{"since_unix_ms", since_unix_ms},
                                 std::pair{"until_unix_ms", until_unix_ms}}) {
    if (ms < 0 || ms > kMaxUnixMs) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be in [0, ", kMaxUnixMs, "], got ", ms));
    }
  }
  if (until_unix_ms != 0 && until_unix_ms < since_unix_ms) {
    return absl::InvalidArgumentError("until_unix_ms is before since_unix_ms");
  }
  const int64_t since = since_unix_ms * 1000000;
  const int64_t until = until_unix_ms ? until_unix_ms * 1000000 : INT64_MAX;
  const size_t max = max_spans ? std::min<uint32_t>(max_spans, 1000000) : 10000;
  bool truncated = false;
  TimelineView view = ViewOf(timelines_[gpu].Window(since, until, max, &truncated));
  view.truncated = truncated;
  return view;
}

absl::StatusOr<orion::v1::KernelProfileResponse> NodeState::GetKernelProfile(uint32_t client_id) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("no client with id ", client_id));
  }
  const KernelProfileBook& book = it->second.ingest.profile();
  orion::v1::KernelProfileResponse out;
  for (const auto& [func, k] : book.kernels()) {
    auto* p = out.add_kernels();
    p->set_name(k.name.empty() ? absl::StrCat("func@0x", absl::Hex(func)) : k.name);
    p->set_launches(k.launches);
    p->set_samples(k.duration.samples);
    p->set_mean_duration_us(k.MeanUs());
    p->set_p99_duration_us(k.P99Us());
    p->set_max_blocks(k.max_blocks);
    p->set_threads_per_block(k.threads_per_block);
    p->set_kind(KernelClassName(k.kclass));
  }
  std::sort(out.mutable_kernels()->begin(), out.mutable_kernels()->end(),
            [](const auto& a, const auto& b) { return a.launches() > b.launches(); });
  out.set_orion_csv(book.ToOrionCsv());
  return out;
}

void NodeState::ApplyPolicyToClient(ClientRecord& c) {
  if (c.peer.cgroup.pod_uid.empty()) return;
  auto it = pods_.find(c.peer.cgroup.pod_uid);
  if (it == pods_.end()) return;
  const orion::v1::PodPolicy& pod = it->second;
  if (!c.admin_priority) {
    c.policy.priority = pod.priority() == orion::v1::PRIORITY_HIGH ? Priority::kHigh
                                                                  : Priority::kBestEffort;
    c.policy.source = "pod-annotation";
    board_->SetPriority(c.slot, c.policy.priority);
  }
  c.policy.memory_limit_bytes = pod.memory_limit_bytes();
  board_->SetMemoryLimit(c.slot, pod.memory_limit_bytes());
  c.policy.latency_target_us =
      pod.latency_target_us() ? pod.latency_target_us() : config_.policy.default_latency_target_us;
}

absl::StatusOr<orion::v1::UpsertPodsResponse> NodeState::UpsertPods(
    const orion::v1::UpsertPodsRequest& r) {
  for (int i = 0; i < r.pods_size(); ++i) {
    const auto& p = r.pods(i);
    if (p.pod_uid().size() != 36) {
      return absl::InvalidArgumentError(absl::StrCat("pods[", i, "].pod_uid '", p.pod_uid(),
                                                     "' is not a pod UID (36 characters)"));
    }
    if (p.priority() == orion::v1::PRIORITY_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("pods[", i, "] (", p.namespace_(), "/", p.name(), "): priority is unset"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (r.full_sync()) {
    std::unordered_map<std::string, orion::v1::PodPolicy> next;
    for (const auto& p : r.pods()) next[p.pod_uid()] = p;
    pods_ = std::move(next);
  } else {
    for (const auto& p : r.pods()) pods_[p.pod_uid()] = p;
  }
  uint32_t updated = 0;
  for (auto& [id, c] : clients_) {
    if (c.peer.cgroup.pod_uid.empty() || !pods_.count(c.peer.cgroup.pod_uid)) continue;
    const ClientPolicy before = c.policy;
    ApplyPolicyToClient(c);
    if (before.priority != c.policy.priority ||
        before.memory_limit_bytes != c.policy.memory_limit_bytes ||
        before.latency_target_us != c.policy.latency_target_us) {
      ++updated;
    }
  }
  orion::v1::UpsertPodsResponse out;
  out.set_pods_known(static_cast<uint32_t>(pods_.size()));
  out.set_clients_updated(updated);
  return out;
}

absl::Status NodeState::DeletePod(const std::string& pod_uid) {
  absl::MutexLock lock(&mu_);
  if (pods_.erase(pod_uid) == 0) {
    return absl::NotFoundError(absl::StrCat("pod ", pod_uid, " is not known to this server"));
  }
  pod_overrides_.erase(pod_uid);
  return absl::OkStatus();
}

void NodeState::ImportOrionProfile(const std::vector<OrionProfileRow>& rows) {
  absl::MutexLock lock(&mu_);
  for (const auto& r : rows) known_kernels_[OrionKernelKey(r.name)] = r;
  for (auto& [id, c] : clients_) c.ingest.profile().ApplyKnown(known_kernels_);
}

MetricsSnapshot NodeState::Snapshot() {
  absl::MutexLock lock(&mu_);
  MetricsSnapshot snap;
  const uint32_t ngpus = board_->num_gpus();
  snap.gpus.resize(ngpus);
  const uint64_t now = MonotonicNs();
  for (uint32_t g = 0; g < ngpus; ++g) {
    GpuSample& gs = snap.gpus[g];
    gs.gpu = std::to_string(g);
    gs.busy_seconds[0] = gpu_policy_[g].busy_ns[0] / 1e9;
    gs.busy_seconds[1] = gpu_policy_[g].busy_ns[1] / 1e9;
    gs.be_budget_s = gpu_policy_[g].knobs.be_budget_ns / 1e9;
  }
  snap.clients.reserve(clients_.size());
  for (const auto& [id, c] : clients_) {
    const contract::ClientArea& area = *board_->area(c.slot);
    const contract::ClientArea::Counters& s = area.counters;
    ClientSample cs;
    cs.gpu = std::to_string(c.gpu);
    if (auto it = pods_.find(c.peer.cgroup.pod_uid); it != pods_.end()) {
      cs.pod = it->second.name();
      cs.ns = it->second.namespace_();
    } else {
      cs.pod = c.process_name;  // standalone: the process stands in for the pod
      cs.ns = "standalone";
    }
    cs.priority = PriorityName(c.policy.priority);
    cs.client = std::to_string(c.id);
    cs.kernels = std::max(s.launches.load(std::memory_order_relaxed), c.ingest.launch_events());
    cs.throttled_ns = s.throttled_ns.load(std::memory_order_relaxed);
    cs.memory_used = s.memory_used_bytes.load(std::memory_order_relaxed);
    cs.memory_limit = c.policy.memory_limit_bytes;
    cs.dropped = area.ring.dropped.load(std::memory_order_relaxed);
    cs.gate_claims_ignored = c.gate_claims_ignored;
    cs.gpu_busy_s = c.ingest.gpu_busy_ns() / 1e9;
    cs.busy = c.ingest.busy();
    cs.requests = c.ingest.requests();
    if (c.gpu < ngpus) {
      ++snap.gpus[c.gpu].clients[static_cast<uint32_t>(c.policy.priority) & 1];
      if (c.policy.priority == Priority::kHigh &&
          SlotBusy(board_->gate(c.gpu)->slots[c.slot], now, gpu_policy_[c.gpu].knobs)) {
        snap.gpus[c.gpu].hp_busy = true;
      }
    }
    snap.clients.push_back(std::move(cs));
  }
  snap.registrations_ok = registrations_ok_;
  snap.registrations_failed = registrations_failed_;
  snap.events_ingested = events_ingested_;
  snap.events_skipped = events_skipped_;
  snap.repairs = repairs_;
  snap.board_corrections = board_corrections_;
  snap.events_written = departed_written_;
  snap.events_dropped = departed_dropped_;
  for (const auto& [id, c] : clients_) {
    const auto& ring = board_->area(c.slot)->ring;
    snap.events_written += ring.head.load(std::memory_order_relaxed);  // pending ones included
    snap.events_dropped += ring.dropped.load(std::memory_order_relaxed);
  }
  return snap;
}

}  // namespace orion::server
