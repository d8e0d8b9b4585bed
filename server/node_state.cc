// Node scheduler state: admission, ring draining, policy loop and admin queries (node_state.h).
#include "server/node_state.h"

#include <cstdio>

#include <time.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/utf8.h"

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

namespace {

// How long the drain lets callers that wait for the mutex go first before it takes it again:
// a bound, so a stream of admin calls cannot stall the drain either.
constexpr int kMaxYieldsToCallers = 1000;

constexpr uint64_t kStuckEntryTimeoutNs = 200ull * 1000000ull;        // 200 ms

// A high-priority slot is busy as the gate sees it (the contract's rule).
bool SlotBusy(const contract::SlotGate& s, uint64_t now, const GateKnobs& knobs) {
  return contract::HighPriorityActivityOf(s, now, knobs.hp_stale_ns, knobs.hp_grace_ns) !=
         contract::HighPriorityActivity::kIdle;
}

}  // namespace

NodeState::NodeState(ServerConfig config, std::unique_ptr<NodeBoard> board)
    : config_(std::move(config)),
      board_(std::move(board)),
      mono_to_unix_(RealtimeNs() - static_cast<int64_t>(MonotonicNs())),
      ingest_options_{mono_to_unix_, config_.request_range_prefix, config_.hp_latency_window},
      budget_controller_(BudgetLimits{}) {
  ApiLock lock(this);
  gpu_policy_.assign(contract::kMaxGpus, InitialGpuPolicy(config_.policy));
  gpu_busy_ns_.assign(contract::kMaxGpus, {0, 0});
  timelines_.reserve(contract::kMaxGpus);
  for (uint32_t i = 0; i < contract::kMaxGpus; ++i) {
    timelines_.emplace_back(config_.timeline_spans_per_gpu);
  }
  for (const std::string& uuid : config_.gpus) {
    const int idx = board_->FindOrAddGpu(uuid);
    if (idx >= 0) board_->PublishKnobs(idx, gpu_policy_[idx].knobs);
  }
}

int NodeState::GpuIndexFor(const PeerIdentity& peer, const contract::RegisterRequest& r,
                           std::string* refusal, bool* foreign) {
  std::string uuid = SanitizeUtf8(FixedString(r.gpu_uuid));
  if (uuid.empty()) uuid = absl::StrCat("ordinal-", r.device_ordinal);
  // In a cluster, a pod may use the GPUs the device plugin allocated to it (the agent says which)
  // and no other. A pod the agent has not reported yet, or reported without an allocation, falls
  // back to the node's GPUs below.
  if (!peer.cgroup.pod_uid.empty()) {
    auto pod = pods_.find(peer.cgroup.pod_uid);
    if (pod != pods_.end() && !pod->second.gpu_uuids.empty() &&
        std::find(pod->second.gpu_uuids.begin(), pod->second.gpu_uuids.end(), uuid) ==
            pod->second.gpu_uuids.end()) {
      // What was asked and what is allowed fit the reply's 128 bytes (one allowed GPU); the
      // log line names the pod too.
      *refusal = absl::StrCat("GPU ", uuid, " is not allocated to this pod; allowed: ",
                              absl::StrJoin(pod->second.gpu_uuids, ", "));
      *foreign = true;
      return -1;
    }
  }
  if (const int idx = board_->FindGpu(uuid); idx >= 0) return idx;
  // The server decides which GPUs there are: those configured or found at start. A client
  // naming another UUID is refused, so made-up UUIDs cannot fill the board's GPU table.
  if (!config_.gpus.empty()) {
    *refusal = absl::StrCat("GPU '", uuid, "' is not a GPU of this node (config gpus, or found)");
    return -1;
  }
  // No list (no driver found at start, e.g. the CUDA test double): GPUs join on demand, a few
  // per tenant (pod, else uid; root on the node is not counted).
  const bool in_pod = !peer.cgroup.pod_uid.empty();
  const std::string tenant = in_pod ? peer.cgroup.pod_uid : absl::StrCat("uid ", peer.uid);
  const uint32_t cap = config_.max_unlisted_gpus_per_tenant;
  uint32_t& added = unlisted_gpus_added_[tenant];
  if (cap != 0 && (in_pod || peer.uid != 0) && added >= cap) {
    *refusal = absl::StrCat(in_pod ? "pod " : "", tenant, " added ", added,
                            " GPUs not in config gpus, its cap (limits.unlisted_gpus)");
    return -1;
  }
  const int idx = board_->FindOrAddGpu(uuid);
  if (idx < 0) {
    *refusal = absl::StrCat("GPU '", uuid, "' is not on this board (", contract::kMaxGpus,
                            " GPUs at most)");
    return -1;
  }
  ++added;
  board_->PublishKnobs(idx, gpu_policy_[idx].knobs);
  return idx;
}

NodeState::Admission NodeState::Register(const PeerIdentity& peer,
                                         const contract::RegisterRequest& request) {
  ApiLock lock(this);
  Admission a;
  // One tenant must not take every slot of the node: a cap per pod, and per uid for processes
  // in no pod (root on the node can stop the server anyway, so it is not counted).
  const bool in_pod = !peer.cgroup.pod_uid.empty();
  const uint32_t cap = in_pod ? config_.max_clients_per_pod
                              : (peer.uid == 0 ? 0 : config_.max_clients_per_uid);
  if (cap != 0) {
    uint32_t held = 0;
    for (const auto& [id, other] : clients_) {
      held += in_pod ? other.peer.cgroup.pod_uid == peer.cgroup.pod_uid
                     : other.peer.cgroup.pod_uid.empty() && other.peer.uid == peer.uid;
    }
    if (held >= cap) {
      a.status = RegisterStatus::kRefused;
      a.message = in_pod ? absl::StrCat("pod ", peer.cgroup.pod_uid, " holds ", held,
                                        " client slots, its cap (limits.clients_per_pod)")
                         : absl::StrCat("uid ", peer.uid, " holds ", held,
                                        " client slots, its cap (limits.clients_per_uid)");
      ++registrations_failed_[in_pod ? "pod-cap" : "uid-cap"];
      return a;
    }
  }
  std::string refusal;
  bool foreign = false;
  const int gpu = GpuIndexFor(peer, request, &refusal, &foreign);
  if (gpu < 0) {
    a.status = foreign ? RegisterStatus::kRefused : RegisterStatus::kUnknownGpu;
    if (foreign) {
      const auto pod = pods_.find(peer.cgroup.pod_uid);
      std::fprintf(stderr, "orion-server: registration of pid %d (pod %s/%s) refused: %s\n",
                   peer.pid, pod != pods_.end() ? pod->second.ns.c_str() : "",
                   pod != pods_.end() ? pod->second.name.c_str() : "", refusal.c_str());
    }
    a.message = std::move(refusal);
    ++registrations_failed_[foreign ? "gpu-not-allocated" : "unknown-gpu"];
    return a;
  }
  const PodPolicy* pod = nullptr;
  const Priority* pod_override = nullptr;
  if (!peer.cgroup.pod_uid.empty()) {
    if (auto it = pods_.find(peer.cgroup.pod_uid); it != pods_.end()) pod = &it->second;
    if (auto it = pod_overrides_.find(peer.cgroup.pod_uid); it != pod_overrides_.end()) {
      pod_override = &it->second;
    }
  }
  ClientPolicy policy = DecidePolicy(peer, request, config_, pod, pod_override);
  // A standalone process may name its job (orion-run --job) on the channel its priority request
  // takes: honoured only when the server trusts client requests.
  std::string requested_job;
  if (!in_pod && config_.trust_client_requests) {
    requested_job = FixedString(request.requested_job);
    absl::Status s = CheckJobName(requested_job, "ORION_JOB");
    if (s.ok() &&
        (absl::StartsWith(requested_job, "pid-") || absl::StartsWith(requested_job, "pod-"))) {
      // Another process's job: the keys of unnamed launchers' ranks and of unnamed pods.
      s = absl::InvalidArgumentError(
          absl::StrCat("ORION_JOB '", requested_job,
                       "' is reserved (pid-<pid> and pod-<uid> are the jobs of unnamed processes)"));
    }
    if (!requested_job.empty() && !s.ok()) {
      std::fprintf(stderr, "orion-server: pid %d (%s): %s: ignored\n", peer.pid,
                   SanitizeUtf8(peer.process_name).c_str(), std::string(s.message()).c_str());
      requested_job.clear();
    }
  }
  const JobIdentity job = JobFor(peer, requested_job);
  bool job_override = false;
  if (auto it = job_overrides_.find(job.key); it != job_overrides_.end()) {
    policy.priority = it->second;
    policy.source = "admin";
    job_override = true;
  }
  const uint32_t id = next_client_id_++;
  // The memory quota holds per pod: the processes of one pod (by the kernel's cgroup, never the
  // request) count against one quota area; any other process gets one of its own.
  auto slot = board_->AssignSlot(id, static_cast<uint32_t>(peer.pid), static_cast<uint32_t>(gpu),
                                 policy.priority, policy.memory_limit_bytes,
                                 in_pod ? absl::StrCat("pod ", peer.cgroup.pod_uid) : "");
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
  // Tenant-chosen strings (its comm, its request, its cgroup's names) are made valid UTF-8
  // here, before any view, timeline or metric label carries them.
  c.peer.process_name = SanitizeUtf8(peer.process_name);
  c.peer.cgroup.pod_uid = SanitizeUtf8(peer.cgroup.pod_uid);
  c.peer.cgroup.container_id = SanitizeUtf8(peer.cgroup.container_id);
  c.process_name = c.peer.process_name.empty() ? SanitizeUtf8(FixedString(request.process_name))
                                               : c.peer.process_name;
  c.policy = policy;
  c.admin_priority = pod_override != nullptr || job_override;
  c.requested_job = requested_job;
  if (paused_jobs_.count(job.key)) PauseClient(c, true);  // a rank of a paused job starts paused
  c.registered_unix_ms = RealtimeNs() / 1000000;
  c.registered_ns = MonotonicNs();
  c.usable_millicpus =
      request.usable_millicpus == contract::kNoValue32 ? 0 : request.usable_millicpus;
  ++registrations_ok_;
  lifecycle_log_.Registered(ViewOf(c), MonotonicNs());
  a.client_id = id;
  a.slot = *slot;
  a.generation = board_->board().slots[*slot].generation.load(std::memory_order_relaxed);
  a.gpu = static_cast<uint32_t>(gpu);
  a.board_fd = board_->board_fd();
  a.gate_fd = board_->gate_fd(a.gpu);
  a.area_fd = board_->area_fd(*slot);
  a.quota_fd = board_->quota_fd(*slot);
  a.priority = policy.priority;
  a.memory_limit_bytes = policy.memory_limit_bytes;
  return a;
}

void NodeState::RecordRegistrationFailure(const std::string& reason) {
  ApiLock lock(this);
  ++registrations_failed_[reason];
}

void NodeState::RecordRepair(const std::string& what) {
  ApiLock lock(this);
  ++repairs_[what];
}

void NodeState::Unregister(uint32_t client_id) {
  ApiLock lock(this);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return;
  // Take what the client left in its ring before the slot is reused.
  ClientRecord& c = it->second;
  auto& ring = board_->area(c.slot)->ring;
  // The client is gone, so no entry will be published any more: skip holes (a writer killed
  // mid-write) and keep reading the published entries behind them. head is read once and
  // clamped: more than a ring's worth claimed but not read means the client wrote garbage into
  // its ring's indices, counted as skipped, never silently lost.
  const uint64_t head = ring.head.load(std::memory_order_acquire);
  const uint64_t end =
      head < c.read_pos ? c.read_pos : std::min<uint64_t>(head, c.read_pos + contract::kRingCapacity);
  const uint64_t left = head > end ? std::min<uint64_t>(head - end, contract::kRingCapacity) : 0;
  Event e{};
  for (uint64_t pos = c.read_pos; pos < end; ++pos) {
    if (c.quarantined) {
      ++c.quarantined_events;
      ++events_quarantined_;
    } else if (ring.ReadAt(pos, &e)) {
      ConsumeEvent(c, e);
      ++events_ingested_;
    } else {
      ++events_skipped_;
      c.ingest.CountMalformed(1);
    }
  }
  c.read_pos = end;
  events_skipped_ += left;
  IngestSinks sinks = SinksFor(c);
  c.ingest.Leave(sinks);
  departed_written_ += end + left;
  departed_dropped_ += ring.dropped.load(std::memory_order_relaxed);
  departed_untabled_ += c.ingest.table_dropped_events();
  const ClientView last = ViewOf(c);
  lifecycle_log_.Exited(last, MonotonicNs());
  board_->FreeSlot(c.slot);
  if (c.policy.priority == Priority::kBestEffort && c.gpu < contract::kMaxGpus) {
    // A best-effort client that died with kernels in flight never gives its budget charges
    // back; start the GPU's count afresh (briefly over-admitting is the safe side).
    if (contract::GateArea* gate = board_->gate(c.gpu); gate != nullptr) {
      gate->words.be_outstanding_ns.store(0, std::memory_order_relaxed);
    }
  }
  clients_.erase(it);
  // A job's actions outlive a rank, not the job.
  if ((job_overrides_.count(last.job.key) || paused_jobs_.count(last.job.key)) &&
      RanksOf(last.job.key).empty()) {
    job_overrides_.erase(last.job.key);
    paused_jobs_.erase(last.job.key);
  }
}

IngestSinks NodeState::SinksFor(const ClientRecord& c) {
  return IngestSinks{timelines_[c.gpu],
                     gpu_busy_ns_[c.gpu][static_cast<size_t>(c.policy.priority)], range_names_,
                     known_kernels_};
}

void NodeState::ConsumeEvent(ClientRecord& c, const Event& e) {
  IngestSinks sinks = SinksFor(c);
  c.ingest.Consume(e, c.policy.priority, sinks);
}

void NodeState::StrikeRing(ClientRecord& c, const char* what) {
  ++repairs_[absl::StrCat("ring-", what)];
  if (c.quarantined || ++c.ring_strikes < kRingStrikesToQuarantine) return;
  c.quarantined = true;
  ++clients_quarantined_;
  std::fprintf(stderr,
               "orion-server: client %u (%s, pid %d) wrote over its event ring's indices %u "
               "times (last: %s); its events are dropped unread from now on\n",
               c.id, c.process_name.c_str(), c.peer.pid, c.ring_strikes, what);
}

size_t NodeState::DrainClient(ClientRecord& c, uint64_t now, size_t max, bool first_batch) {
  contract::ClientArea* area = board_->area(c.slot);
  if (area == nullptr) return 0;
  auto& ring = area->ring;
  // head and tail are read once a batch: the tenant can write both at any time, and nothing it
  // writes may make the server read more than a ring's worth a pass.
  const uint64_t head = ring.head.load(std::memory_order_acquire);
  if (first_batch && ring.tail.load(std::memory_order_relaxed) != c.read_pos) {
    // Only the server moves tail; put it back where the server is.
    StrikeRing(c, "tail");
    ring.tail.store(c.read_pos, std::memory_order_release);
  }
  // Producers stop at a full ring, so head is never behind the server nor more than a ring's
  // worth ahead of it. Otherwise the indices were written over: start afresh at head (counted
  // as skipped) instead of skipping one phantom entry per timeout for the rest of the run.
  if (head < c.read_pos || head - c.read_pos > contract::kRingCapacity) {
    StrikeRing(c, head < c.read_pos ? "head-rewound" : "head-ahead");
    const uint64_t lost = head < c.read_pos ? 0 : contract::kRingCapacity;
    events_skipped_ += lost;
    c.ingest.CountMalformed(lost);
    c.read_pos = head;
    c.hole_since_ns = 0;
    ring.tail.store(head, std::memory_order_release);
    return 0;
  }
  if (c.quarantined) {
    // Dropped unread, but the ring moves on, so the client's producers do not stall.
    c.quarantined_events += head - c.read_pos;
    events_quarantined_ += head - c.read_pos;
    c.read_pos = head;
    ring.tail.store(head, std::memory_order_release);
    return 0;
  }
  const uint64_t end = c.read_pos + std::min<uint64_t>(head - c.read_pos, max);
  size_t n = 0;
  Event e{};
  while (c.read_pos < end && ring.ReadAt(c.read_pos, &e)) {
    ++c.read_pos;
    ConsumeEvent(c, e);
    ++n;
  }
  ring.tail.store(c.read_pos, std::memory_order_release);
  if (c.read_pos < head && n < max && !ring.ReadAt(c.read_pos, &e)) {
    // A producer claimed an entry and never published it (killed mid-write): skip it later.
    if (c.hole_since_ns == 0) {
      c.hole_since_ns = now;
    } else if (now - c.hole_since_ns > kStuckEntryTimeoutNs) {
      ++c.read_pos;
      ring.tail.store(c.read_pos, std::memory_order_release);
      c.ingest.CountMalformed(1);
      ++events_skipped_;
      c.hole_since_ns = 0;
    }
  } else if (n > 0 || c.read_pos == head) {
    c.hole_since_ns = 0;
  }
  events_ingested_ += n;
  return n;
}

size_t NodeState::DrainOnce(uint64_t now) {
  std::vector<uint32_t> ids;
  {
    ApiLock lock(this);
    ids.reserve(clients_.size());
    for (const auto& [id, c] : clients_) ids.push_back(id);
  }
  size_t total = 0;
  for (const uint32_t id : ids) {
    // At most a ring's worth a client a pass, a batch per hold of the mutex.
    size_t left = contract::kRingCapacity;
    bool first = true;
    while (left > 0) {
      // Callers waiting for the mutex go first: each waits for one batch at most. (Not an
      // absl::Condition on api_waiters_: a condition is only looked at again when the mutex is
      // released, and a caller queued behind the waiting drain never released it: registrations
      // hung, 1 run in 3 of RegistrationTest.ThreeHundredProcessesRegisterAtOnce.)
      for (int i = 0; i < kMaxYieldsToCallers && api_waiters_.load() != 0; ++i) {
        std::this_thread::yield();
      }
      absl::MutexLock lock(&mu_);
      auto it = clients_.find(id);
      if (it == clients_.end()) break;  // left between two batches
      const size_t n = DrainClient(it->second, now, std::min(left, kDrainBatch), first);
      first = false;
      total += n;
      if (n < std::min(left, kDrainBatch)) break;
      left -= n;
    }
  }
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

// Per GPU, who its high-priority clients stand for: their pods, or the process itself when it is
// in no pod (the high-priority pods that ListGpus, /metrics and the policy tick count).
std::vector<std::set<std::string>> NodeState::HighPriorityTenants() const {
  std::vector<std::set<std::string>> out(board_->num_gpus());
  for (const auto& [id, c] : clients_) {
    if (c.gpu >= out.size() || c.policy.priority != Priority::kHigh) continue;
    out[c.gpu].insert(c.peer.cgroup.pod_uid.empty() ? absl::StrCat("client ", c.id)
                                                    : c.peer.cgroup.pod_uid);
  }
  return out;
}

// One line when a GPU comes to hold more high-priority pods than policy.high_priority_per_gpu
// (a pod changed to high at run time beside another: each then waits for the other's work), and
// one when it is back within the limit; the metric and ListGpus say it all along.
void NodeState::LogHighPriorityOvercommit() {
  const std::vector<std::set<std::string>> by_gpu = HighPriorityTenants();
  if (hp_overcommitted_.size() < by_gpu.size()) hp_overcommitted_.resize(by_gpu.size(), false);
  const uint32_t allowed = config_.policy.high_priority_per_gpu;
  for (uint32_t g = 0; g < by_gpu.size(); ++g) {
    const std::set<std::string>& tenants = by_gpu[g];
    const bool over = tenants.size() > allowed;
    if (over == hp_overcommitted_[g]) continue;
    hp_overcommitted_[g] = over;
    std::vector<std::string> names;
    for (const std::string& t : tenants) {
      auto it = pods_.find(t);
      names.push_back(it != pods_.end() ? absl::StrCat(it->second.ns, "/", it->second.name) : t);
    }
    std::fprintf(stderr,
                 over ? "orion-server: GPU %u holds %zu high-priority pods, %u allowed "
                        "(policy.high_priority_per_gpu): %s; each waits for the others' work\n"
                      : "orion-server: GPU %u is back to %zu high-priority pods, %u allowed%s\n",
                 g, tenants.size(), allowed,
                 over ? absl::StrJoin(names, ", ").c_str() : "");
  }
}

void NodeState::PolicyTick(uint64_t now) {
  ApiLock lock(this);
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
  LogHighPriorityOvercommit();
  for (uint32_t g = 0; g < ngpus; ++g) {
    GpuPolicy& gp = gpu_policy_[g];
    if (!gp.adapt_budget || gp.knobs.mode == contract::GateMode::kPassThrough) continue;
    if (SizeBudgetToServices(g, gp)) continue;
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

bool NodeState::SizeBudgetToServices(uint32_t g, GpuPolicy& gp) {
  // A budget set by hand, a latency target (the search below owns the budget then) or a mode
  // where best-effort kernels co-run (mps: what they cost a request is not their queue) leave
  // the budget alone.
  if (gp.budget_set || gp.knobs.mode != contract::GateMode::kPriority) return false;
  const ServiceSizing sizing;
  std::vector<uint64_t> periods;
  for (const auto& [id, c] : clients_) {
    if (c.gpu != g || c.policy.priority != Priority::kHigh) continue;
    if (c.policy.latency_target_us != 0) return false;
    const uint64_t count = c.ingest.busy().count;
    const std::vector<uint64_t> newest =
        c.ingest.BusyPeriodsSince(count > sizing.window ? count - sizing.window : 0);
    periods.insert(periods.end(), newest.begin(), newest.end());
  }
  const uint64_t next = SizeBudgetToService(std::move(periods), gp.knobs.be_budget_ns,
                                            DefaultBeBudgetUs(gp.knobs.mode) * 1000, sizing);
  if (next != gp.knobs.be_budget_ns) {
    gp.knobs.be_budget_ns = next;
    board_->PublishKnobs(g, gp.knobs);
    RestartBudgetEvidence(g);
  }
  return true;
}

ClientView NodeState::ViewOf(const ClientRecord& c) const {
  const contract::ClientArea& area = *board_->area(c.slot);
  const contract::ClientArea::Counters& s = area.counters;
  ClientView v;
  v.client_id = c.id;
  v.slot = c.slot;
  v.gpu = c.gpu;
  v.host_pid = static_cast<uint32_t>(c.peer.pid);
  v.uid = c.peer.uid;
  v.process_name = c.process_name;
  v.pod_uid = c.peer.cgroup.pod_uid;
  v.container_id = c.peer.cgroup.container_id;
  if (auto it = pods_.find(c.peer.cgroup.pod_uid); it != pods_.end()) {
    v.pod = it->second.name;
    v.ns = it->second.ns;
  }
  v.job = JobFor(c.peer, c.requested_job);
  v.policy = c.policy;
  v.paused = c.paused;
  // Client-written counters: read, never trusted for decisions, and bounded here, once for every
  // view, metric and sum: memory to kMaxShownMemoryBytes, so that no pod's or job's sum of them
  // wraps (kMaxSlots of them fit in 64 bits), and held time to the client's life.
  v.memory_used_bytes =
      std::min(s.memory_used_bytes.load(std::memory_order_relaxed), kMaxShownMemoryBytes);
  v.memory_peak_bytes =
      std::min(s.memory_peak_bytes.load(std::memory_order_relaxed), kMaxShownMemoryBytes);
  v.kernels_launched =
      std::max(s.launches.load(std::memory_order_relaxed), c.ingest.launched_kernels());
  // Finished waits and the one in progress (contract::HeldNs), never less than shown before.
  const uint64_t now = MonotonicNs();
  c.held_shown_ns = std::min(std::max(c.held_shown_ns, contract::HeldNs(s, now)),
                             now > c.registered_ns ? now - c.registered_ns : 0);
  v.throttled_ns = c.held_shown_ns;
  c.hold_releases_shown =
      std::max(c.hold_releases_shown, s.hold_releases.load(std::memory_order_relaxed));
  v.hold_releases = c.hold_releases_shown;
  v.events_dropped = area.ring.dropped.load(std::memory_order_relaxed);
  v.gpu_busy_seconds = c.ingest.gpu_busy_ns() / 1e9;
  v.registered_unix_ms = c.registered_unix_ms;
  v.usable_millicpus = c.usable_millicpus;
  v.quarantined = c.quarantined;
  v.events_quarantined = c.quarantined_events;
  return v;
}

JobIdentity NodeState::JobFor(const PeerIdentity& peer, const std::string& requested_job) const {
  if (!peer.cgroup.pod_uid.empty()) {
    auto it = pods_.find(peer.cgroup.pod_uid);
    if (it == pods_.end()) return UnnamedPodJob(peer.cgroup.pod_uid);
    return PodJob(it->second.ns, it->second.name, it->second.job);
  }
  return StandaloneJob(requested_job, peer.pid, peer.launcher_pid);
}

std::vector<NodeState::ClientRecord*> NodeState::RanksOf(const std::string& job_key) {
  std::vector<ClientRecord*> out;
  for (auto& [id, c] : clients_) {
    if (JobFor(c.peer, c.requested_job).key == job_key) out.push_back(&c);
  }
  return out;
}

absl::Status NodeState::JobNotFound(const std::string& job_key) const {
  return absl::NotFoundError(absl::StrCat(
      "no job '", SanitizeUtf8(job_key.substr(0, 200)),
      "' with a live rank on this node (keys as ListJobs and orion-ctl jobs name them: "
      "namespace/job, pod-<uid>, pid-<pid> or a standalone --job name)"));
}

absl::Status NodeState::CheckGpu(uint32_t gpu) {
  if (gpu < board_->num_gpus()) return absl::OkStatus();
  if (board_->num_gpus() == 0) {
    return absl::NotFoundError(absl::StrCat(
        "no GPU with index ", gpu, ": this node knows no GPU yet; a GPU appears when the first "
        "process using it registers (ListGpus, orion-ctl gpus)"));
  }
  return absl::NotFoundError(absl::StrCat("no GPU with index ", gpu, "; this node has ",
                                          board_->num_gpus(), " (ListGpus, orion-ctl gpus)"));
}

std::vector<GpuView> NodeState::ListGpus() {
  ApiLock lock(this);
  std::vector<GpuView> out;
  const uint64_t now = MonotonicNs();
  const std::vector<std::set<std::string>> high_tenants = HighPriorityTenants();
  for (uint32_t g = 0; g < board_->num_gpus(); ++g) {
    GpuView gpu;
    gpu.index = g;
    gpu.uuid = board_->gpu_uuid(g);
    gpu.node = config_.node_name;
    gpu.mode = gpu_policy_[g].knobs.mode;
    gpu.busy_seconds = (gpu_busy_ns_[g][0] + gpu_busy_ns_[g][1]) / 1e9;
    gpu.high_priority_pods_allowed = config_.policy.high_priority_per_gpu;
    for (const auto& [id, c] : clients_) {
      if (c.gpu != g) continue;
      ++gpu.clients;
      if (c.policy.priority != Priority::kHigh) continue;
      ++gpu.high_priority_clients;
      gpu.high_priority_busy =
          gpu.high_priority_busy ||
          SlotBusy(board_->gate(g)->slots[c.slot], now, gpu_policy_[g].knobs);
    }
    gpu.high_priority_pods = static_cast<uint32_t>(high_tenants[g].size());
    gpu.high_priority_overcommitted = gpu.high_priority_pods > gpu.high_priority_pods_allowed;
    out.push_back(std::move(gpu));
  }
  return out;
}

std::vector<ClientView> NodeState::ListClients(const ClientFilter& f) {
  ApiLock lock(this);
  std::vector<ClientView> out;
  for (const auto& [id, c] : clients_) {
    if (f.gpu && c.gpu != *f.gpu) continue;
    ClientView v = ViewOf(c);
    if (!f.ns.empty() && v.ns != f.ns) continue;
    if (!f.pod.empty() && v.pod != f.pod) continue;
    out.push_back(std::move(v));
  }
  if (!f.include_exited) return out;
  for (const ClientView& v : lifecycle_log_.exited()) {
    if (f.gpu && v.gpu != *f.gpu) continue;
    if ((!f.ns.empty() && v.ns != f.ns) || (!f.pod.empty() && v.pod != f.pod)) continue;
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<ClientView> NodeState::GetClient(uint32_t client_id) {
  ApiLock lock(this);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("no client with id ", client_id,
                                            " (list them with ListClients)"));
  }
  return ViewOf(it->second);
}

void NodeState::PauseClient(ClientRecord& c, bool paused) {
  c.paused = paused;
  board_->SetPaused(c.slot, paused);
}

void NodeState::OverridePriority(ClientRecord& c, Priority p) {
  c.policy.priority = p;
  c.policy.source = "admin";
  c.admin_priority = true;
  board_->SetPriority(c.slot, p);
}

absl::StatusOr<ClientView> NodeState::SetClientPriority(uint32_t client_id, Priority p) {
  ApiLock lock(this);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("no client with id ", client_id));
  }
  OverridePriority(it->second, p);
  return ViewOf(it->second);
}

absl::StatusOr<std::vector<ClientView>> NodeState::SetPodPriority(const std::string& pod_uid,
                                                                  Priority p) {
  if (pod_uid.empty()) return absl::InvalidArgumentError("pod_uid is empty");
  ApiLock lock(this);
  pod_overrides_[pod_uid] = p;
  std::vector<ClientView> changed;
  for (auto& [id, c] : clients_) {
    if (c.peer.cgroup.pod_uid != pod_uid) continue;
    OverridePriority(c, p);
    changed.push_back(ViewOf(c));
  }
  return changed;
}

absl::StatusOr<ClientView> NodeState::SetPaused(uint32_t client_id, bool paused) {
  ApiLock lock(this);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("no client with id ", client_id));
  }
  PauseClient(it->second, paused);
  return ViewOf(it->second);
}

std::vector<JobView> NodeState::AllJobs() const {
  std::vector<ClientView> views;
  views.reserve(clients_.size());
  for (const auto& [id, c] : clients_) views.push_back(ViewOf(c));
  return GroupJobs(views);
}

std::vector<JobView> NodeState::ListJobs(const std::string& ns) {
  ApiLock lock(this);
  std::vector<JobView> jobs = AllJobs();
  if (!ns.empty()) std::erase_if(jobs, [&](const JobView& j) { return j.ns != ns; });
  return jobs;
}

absl::StatusOr<JobView> NodeState::SetJobPaused(const std::string& job_key, bool paused) {
  ApiLock lock(this);
  const std::vector<ClientRecord*> ranks = RanksOf(job_key);
  if (ranks.empty()) return JobNotFound(job_key);
  for (ClientRecord* c : ranks) PauseClient(*c, paused);
  if (paused) {
    paused_jobs_.insert(job_key);
  } else {
    paused_jobs_.erase(job_key);
  }
  // Grouped with every client, not its ranks alone: gpus_beside_services counts other jobs'
  // services.
  for (JobView& j : AllJobs()) {
    if (j.key == job_key) return std::move(j);
  }
  return JobNotFound(job_key);
}

absl::StatusOr<std::vector<ClientView>> NodeState::SetJobPriority(const std::string& job_key,
                                                                  Priority p) {
  ApiLock lock(this);
  const std::vector<ClientRecord*> ranks = RanksOf(job_key);
  if (ranks.empty()) return JobNotFound(job_key);
  job_overrides_[job_key] = p;
  std::vector<ClientView> changed;
  for (ClientRecord* c : ranks) {
    OverridePriority(*c, p);
    changed.push_back(ViewOf(*c));
  }
  return changed;
}

absl::StatusOr<GpuPolicy> NodeState::GetPolicy(uint32_t gpu) {
  ApiLock lock(this);
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  return gpu_policy_[gpu];
}

absl::StatusOr<GpuPolicy> NodeState::SetPolicy(const PolicyChange& change) {
  if (absl::Status s = ValidatePolicyChange(change); !s.ok()) return s;
  ApiLock lock(this);
  if (!change.all_gpus) {
    if (absl::Status s = CheckGpu(change.gpu); !s.ok()) return s;
  }
  // All GPUs also covers GPUs that join the board later (discovered at a client's registration).
  const uint32_t first = change.all_gpus ? 0 : change.gpu;
  const uint32_t last = change.all_gpus ? contract::kMaxGpus : change.gpu + 1;
  for (uint32_t g = first; g < last; ++g) {
    if (ApplyPolicyChange(change, &gpu_policy_[g])) RestartBudgetEvidence(g);
    board_->PublishKnobs(g, gpu_policy_[g].knobs);
  }
  return gpu_policy_[first];
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

TimelineView NodeState::NameSpans(std::vector<Span> spans) const {
  TimelineView view;
  view.spans.reserve(spans.size());
  for (const Span& s : spans) view.spans.push_back(NamedSpan{s, SpanName(s)});
  view.server_now_unix_ns = RealtimeNs();
  return view;
}

absl::StatusOr<TimelineView> NodeState::TimelineAfter(uint32_t gpu, uint64_t cursor,
                                                      uint32_t max_spans) {
  ApiLock lock(this);
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  const size_t max = max_spans == 0 ? 1000 : std::min<uint32_t>(max_spans, 100000);
  uint64_t lost = 0;
  TimelineView view = NameSpans(timelines_[gpu].After(&cursor, max, &lost));
  view.cursor = cursor;
  view.lost = lost;
  return view;
}

namespace {

// A window of Unix milliseconds as the admin API names its ends; until 0 leaves it open.
absl::Status CheckUnixMsWindow(const char* from_name, int64_t from_ms, const char* until_name,
                               int64_t until_ms) {
  // Milliseconds that fit nanoseconds in an int64 (until year 2262); beyond, the callers'
  // multiplication would overflow.
  constexpr int64_t kMaxUnixMs = INT64_MAX / 1000000;
  for (const auto& [name, ms] : {std::pair{from_name, from_ms}, std::pair{until_name, until_ms}}) {
    if (ms < 0 || ms > kMaxUnixMs) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be in [0, ", kMaxUnixMs, "], got ", ms));
    }
  }
  if (until_ms != 0 && until_ms < from_ms) {
    return absl::InvalidArgumentError(absl::StrCat(until_name, " is before ", from_name));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<RecordingWindow>> NodeState::SetRecording(const RecordingChange& r) {
  if (absl::Status s =
          CheckUnixMsWindow("from_unix_ms", r.from_unix_ms, "until_unix_ms", r.until_unix_ms);
      !s.ok()) {
    return s;
  }
  ApiLock lock(this);
  if (!r.all_gpus) {
    if (absl::Status s = CheckGpu(r.gpu); !s.ok()) return s;
  }
  std::vector<RecordingWindow> out;
  for (uint32_t g = 0; g < board_->num_gpus(); ++g) {
    if (r.all_gpus || g == r.gpu) {
      timelines_[g].SetRecording(r.from_unix_ms * 1000000, r.until_unix_ms * 1000000);
    }
    out.push_back(RecordingWindow{g, timelines_[g].record_from_ns() / 1000000,
                                  timelines_[g].record_until_ns() / 1000000,
                                  timelines_[g].added()});
  }
  return out;
}

absl::StatusOr<TimelineView> NodeState::TimelineWindow(uint32_t gpu, int64_t since_unix_ms,
                                                       int64_t until_unix_ms,
                                                       uint32_t max_spans) {
  ApiLock lock(this);
  if (absl::Status s = CheckGpu(gpu); !s.ok()) return s;
  if (absl::Status s =
          CheckUnixMsWindow("since_unix_ms", since_unix_ms, "until_unix_ms", until_unix_ms);
      !s.ok()) {
    return s;
  }
  const int64_t since = since_unix_ms * 1000000;
  const int64_t until = until_unix_ms ? until_unix_ms * 1000000 : INT64_MAX;
  const size_t max = max_spans ? std::min<uint32_t>(max_spans, 1000000) : 10000;
  bool truncated = false;
  TimelineView view = NameSpans(timelines_[gpu].Window(since, until, max, &truncated));
  view.truncated = truncated;
  return view;
}

absl::StatusOr<KernelProfileView> NodeState::GetKernelProfile(uint32_t client_id) {
  ApiLock lock(this);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("no client with id ", client_id));
  }
  const KernelProfileBook& book = it->second.ingest.profile();
  KernelProfileView out;
  for (const auto& [func, k] : book.kernels()) {
    out.kernels.push_back(KernelProfileView::Kernel{
        k.name.empty() ? absl::StrCat("func@0x", absl::Hex(func)) : k.name, k.launches,
        k.duration.samples, k.MeanUs(), k.P99Us(), k.max_blocks, k.threads_per_block,
        KernelClassName(k.kclass)});
  }
  std::stable_sort(out.kernels.begin(), out.kernels.end(),
                   [](const auto& a, const auto& b) { return a.launches > b.launches; });
  out.orion_csv = book.ToOrionCsv();
  return out;
}

void NodeState::ApplyPolicyToClient(ClientRecord& c) {
  if (c.peer.cgroup.pod_uid.empty()) return;
  auto it = pods_.find(c.peer.cgroup.pod_uid);
  if (it == pods_.end()) return;
  const PodPolicy& pod = it->second;
  if (!c.admin_priority) {
    c.policy.priority = PriorityOnGpu(pod, board_->gpu_uuid(c.gpu), &c.policy.source);
    board_->SetPriority(c.slot, c.policy.priority);
  }
  c.policy.memory_limit_bytes = pod.memory_limit_bytes;
  board_->SetMemoryLimit(c.slot, pod.memory_limit_bytes);
  c.policy.latency_target_us =
      pod.latency_target_us ? pod.latency_target_us : config_.policy.default_latency_target_us;
}

absl::StatusOr<PodSync> NodeState::UpsertPods(std::vector<PodPolicy> pods, bool full_sync) {
  for (size_t i = 0; i < pods.size(); ++i) {
    if (pods[i].pod_uid.size() != 36) {
      return absl::InvalidArgumentError(absl::StrCat("pods[", i, "].pod_uid '", pods[i].pod_uid,
                                                     "' is not a pod UID (36 characters)"));
    }
  }
  ApiLock lock(this);
  PodSync out;
  if (pods.empty() && !full_sync) {  // the agent asking what is known: nothing to apply
    out.pods_known = static_cast<uint32_t>(pods_.size());
    return out;
  }
  for (PodPolicy& p : pods) {
    // The admin's bounds on self-declared annotations; said once per change, not per resync.
    const std::string why = AdmitPodPolicy(config_.policy, &p);
    auto old = pods_.find(p.pod_uid);
    if (!why.empty() && (old == pods_.end() || old->second.high_refused != p.high_refused ||
                         old->second.latency_raised_from_us != p.latency_raised_from_us)) {
      std::fprintf(stderr, "orion-server: pod %s/%s: %s\n", p.ns.c_str(), p.name.c_str(),
                   why.c_str());
    }
  }
  if (full_sync) pods_.clear();
  for (PodPolicy& p : pods) {
    std::string uid = p.pod_uid;
    pods_[std::move(uid)] = std::move(p);
  }
  for (auto& [id, c] : clients_) {
    if (c.peer.cgroup.pod_uid.empty() || !pods_.count(c.peer.cgroup.pod_uid)) continue;
    const ClientPolicy before = c.policy;
    ApplyPolicyToClient(c);
    if (before.priority != c.policy.priority ||
        before.memory_limit_bytes != c.policy.memory_limit_bytes ||
        before.latency_target_us != c.policy.latency_target_us) {
      ++out.clients_updated;
    }
  }
  out.pods_known = static_cast<uint32_t>(pods_.size());
  return out;
}

absl::Status NodeState::DeletePod(const std::string& pod_uid) {
  ApiLock lock(this);
  if (pods_.erase(pod_uid) == 0) {
    return absl::NotFoundError(absl::StrCat("pod ", pod_uid, " is not known to this server"));
  }
  pod_overrides_.erase(pod_uid);
  unlisted_gpus_added_.erase(pod_uid);
  return absl::OkStatus();
}

void NodeState::ImportOrionProfile(const std::vector<OrionProfileRow>& rows) {
  ApiLock lock(this);
  for (const auto& r : rows) known_kernels_[OrionKernelKey(r.name)] = r;
  for (auto& [id, c] : clients_) c.ingest.profile().ApplyKnown(known_kernels_);
}

MetricsSnapshot NodeState::Snapshot() {
  ApiLock lock(this);
  MetricsSnapshot snap;
  const uint32_t ngpus = board_->num_gpus();
  snap.gpus.resize(ngpus);
  const uint64_t now = MonotonicNs();
  for (uint32_t g = 0; g < ngpus; ++g) {
    GpuSample& gs = snap.gpus[g];
    gs.gpu = std::to_string(g);
    gs.busy_seconds[0] = gpu_busy_ns_[g][0] / 1e9;
    gs.busy_seconds[1] = gpu_busy_ns_[g][1] / 1e9;
    gs.be_budget_s = gpu_policy_[g].knobs.be_budget_ns / 1e9;
  }
  snap.high_priority_pods_allowed = config_.policy.high_priority_per_gpu;
  snap.clients.reserve(clients_.size());
  std::map<std::string, PodSample> pods;  // by pod UID
  std::vector<ClientView> views;
  views.reserve(clients_.size());
  for (const auto& [id, c] : clients_) {
    const ClientView& v = views.emplace_back(ViewOf(c));
    ClientSample cs;
    cs.gpu = std::to_string(c.gpu);
    if (pods_.count(c.peer.cgroup.pod_uid)) {
      cs.pod = v.pod;
      cs.ns = v.ns;
    } else {
      cs.pod = c.process_name;  // standalone: the process stands in for the pod
      cs.ns = kStandaloneNamespace;
    }
    cs.priority = PriorityName(c.policy.priority);
    cs.client = std::to_string(c.id);
    cs.kernels = v.kernels_launched;
    cs.throttled_ns = v.throttled_ns;
    cs.memory_used = v.memory_used_bytes;
    cs.memory_limit = c.policy.memory_limit_bytes;
    cs.dropped = v.events_dropped;
    cs.gate_claims_ignored = c.gate_claims_ignored;
    cs.hold_releases = v.hold_releases;
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
    if (auto pod = pods_.find(c.peer.cgroup.pod_uid); pod != pods_.end()) {
      PodSample& ps = pods[c.peer.cgroup.pod_uid];
      ps.ns = pod->second.ns;
      ps.pod = pod->second.name;
      ps.memory_used += v.memory_used_bytes;
    }
  }
  snap.jobs = GroupJobs(views);
  for (auto& [uid, p] : pods) snap.pods.push_back(std::move(p));
  const std::vector<std::set<std::string>> high_tenants = HighPriorityTenants();
  for (uint32_t g = 0; g < ngpus && g < high_tenants.size(); ++g) {
    snap.gpus[g].high_priority_pods = static_cast<uint32_t>(high_tenants[g].size());
  }
  snap.registrations_ok = registrations_ok_;
  snap.registrations_failed = registrations_failed_;
  snap.events_ingested = events_ingested_;
  snap.events_skipped = events_skipped_;
  snap.events_quarantined = events_quarantined_;
  snap.clients_quarantined = clients_quarantined_;
  snap.repairs = repairs_;
  snap.board_corrections = board_corrections_;
  snap.events_written = departed_written_;
  snap.events_dropped = departed_dropped_;
  snap.events_untabled = departed_untabled_;
  for (const auto& [id, c] : clients_) {
    snap.events_untabled += c.ingest.table_dropped_events();
    const auto& ring = board_->area(c.slot)->ring;
    snap.events_written += ring.head.load(std::memory_order_relaxed);  // pending ones included
    snap.events_dropped += ring.dropped.load(std::memory_order_relaxed);
  }
  return snap;
}

}  // namespace orion::server
