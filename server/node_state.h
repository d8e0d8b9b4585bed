// The node scheduler's state: registered clients, pod policies from the agent, admin overrides,
// per-GPU policy knobs, kernel profiles and timelines. It holds the seams together under one
// mutex: admission (admission.h) decides a registering client's priority and limits, ingest
// (client_ingest.h) turns each client's drained events into spans and sums, policy
// (gpu_policy.h, budget_controller.h) keeps and adapts each GPU's knobs, and the views
// (node_views.h) answer the admin API and the agent. No RPC code and no proto types: the gRPC
// adapter (admin_service.h, admin_mapping.h) and the Prometheus collector sit on top of it.
//
// Thread-safety: every public method takes the one mutex; the drain loop holds it per batch of
// one client's events (at most kDrainBatch) and lets go between batches, so registrations and
// admin calls wait for one batch at most, however much the tenants write. The board heartbeat
// needs no lock (OrionServer beats it from a thread of its own).
//
// Usage:
//   NodeState state(config, std::move(board));
//   NodeState::Admission a = state.Register(peer, request);   // registration listener
//   state.DrainOnce(MonotonicNs());                           // drain thread, ~every 1 ms
//   state.PolicyTick(MonotonicNs());                          // ~every 100 ms
//   absl::StatusOr<ClientView> c = state.GetClient(7);        // admin API
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "contract/orion_contract.h"
#include "server/admission.h"
#include "server/board.h"
#include "server/budget_controller.h"
#include "server/client_ingest.h"
#include "server/client_lifecycle_log.h"
#include "server/config.h"
#include "server/gpu_policy.h"
#include "server/jobs.h"
#include "server/kernel_profile.h"
#include "server/node_views.h"
#include "server/peer_identity.h"
#include "server/timeline.h"

namespace orion::server {

uint64_t MonotonicNs();
int64_t RealtimeNs();
// The metrics' namespace label of clients and jobs in no pod the agent named. A Kubernetes
// namespace is a DNS label (no '_'), so no pod's series can carry it: with "standalone" a
// namespace of that name mixed its pods' series with the node's standalone processes.
inline constexpr char kStandaloneNamespace[] = "_standalone";
// The most GPU memory a client's view shows (1 TiB, several times any GPU's): what a client
// writes past it is garbage, and kMaxSlots clients at it still sum within 64 bits.
inline constexpr uint64_t kMaxShownMemoryBytes = uint64_t{1} << 40;
// Per-client metric values at scrape time.
struct ClientSample {
  std::string gpu, pod, ns, priority, client;
  uint64_t kernels = 0, throttled_ns = 0, memory_used = 0, memory_limit = 0, dropped = 0;
  uint64_t gate_claims_ignored = 0;  // best-effort claims of HP work found in the gate area
  uint64_t hold_releases = 0;  // GPU holds its keeper opened past their bound (client-written)
  // Kernel and graph spans' durations: measured for timed launches, learned for the others.
  double gpu_busy_s = 0;
  BusyPeriodHistogram busy;                 // high-priority clients
  RequestLatencyHistogram requests;         // clients that mark requests with NVTX ranges
};
// Per-job and per-pod values at scrape time: live ones only, so series go with them.
struct PodSample {
  std::string ns, pod;
  uint64_t memory_used = 0;
};
struct GpuSample {
  std::string gpu;
  uint32_t clients[2] = {0, 0};  // by contract::Priority
  double busy_seconds[2] = {0, 0};
  bool hp_busy = false;
  double be_budget_s = 0;
  uint32_t high_priority_pods = 0;  // distinct pods (or processes in no pod) of HP clients
};
struct MetricsSnapshot {
  std::vector<ClientSample> clients;
  std::vector<GpuSample> gpus;
  std::vector<JobView> jobs;  // GroupJobs of the clients
  std::vector<PodSample> pods;  // pods the agent named that have a live client
  uint32_t high_priority_pods_allowed = 1;  // policy.high_priority_per_gpu
  uint64_t registrations_ok = 0;
  std::map<std::string, uint64_t> registrations_failed;  // by reason
  // Node-wide event accounting, departed clients included: every event a client wrote into its
  // ring (claimed a position) is ingested or skipped (a hole left by a client killed mid-write,
  // or entries still unpublished when it left); drops happen before a position is claimed.
  uint64_t events_ingested = 0;
  uint64_t events_written = 0;
  uint64_t events_skipped = 0;
  uint64_t events_dropped = 0;
  // Events of quarantined clients (rings whose indices were written over repeatedly), dropped
  // unread; and how many clients were ever quarantined.
  uint64_t events_quarantined = 0;
  uint64_t clients_quarantined = 0;
  // Events about kernels or graphs beyond a client's profile tables (ClientIngest's bounds),
  // departed clients included.
  uint64_t events_untabled = 0;
  std::map<std::string, uint64_t> repairs;  // by what
  uint64_t board_corrections = 0;  // server-owned board fields found overwritten and put back
};

class NodeState {
 public:
  NodeState(ServerConfig config, std::unique_ptr<NodeBoard> board);

  struct Admission {
    contract::RegisterStatus status = contract::RegisterStatus::kOk;
    std::string message;
    uint32_t client_id = 0, slot = 0, generation = 0, gpu = 0;
    contract::Priority priority = contract::Priority::kBestEffort;
    uint64_t memory_limit_bytes = 0;
    // What to hand the client (SCM_RIGHTS), owned by the board: valid until the slot is freed.
    int board_fd = -1, gate_fd = -1, area_fd = -1, quota_fd = -1;
  };
  Admission Register(const PeerIdentity& peer, const contract::RegisterRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  void RecordRegistrationFailure(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Something of the server's was found broken and put right (e.g. "socket-deleted").
  void RecordRepair(const std::string& what) ABSL_LOCKS_EXCLUDED(mu_);
  void Unregister(uint32_t client_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Events consumed per hold of the mutex: what a registration or an admin call may wait for.
  static constexpr size_t kDrainBatch = 256;
  // Passes that find a client's ring indices written over before its events are quarantined.
  static constexpr uint32_t kRingStrikesToQuarantine = 4;
  // Drains every active ring, at most a ring's worth per client; returns the events consumed.
  size_t DrainOnce(uint64_t mono_now_ns) ABSL_LOCKS_EXCLUDED(mu_);
  // Adapts budgets to latency targets, refreshes the board heartbeat.
  void PolicyTick(uint64_t mono_now_ns) ABSL_LOCKS_EXCLUDED(mu_);

  // Admin API (errors carry the gRPC-mappable absl code and an actionable message).
  std::vector<GpuView> ListGpus() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<ClientView> ListClients(const ClientFilter& filter) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ClientView> GetClient(uint32_t client_id) ABSL_LOCKS_EXCLUDED(mu_);
  // An admin override: the client's priority until it leaves; for a pod, its clients' and its
  // future clients' priority, over the pod's annotation.
  absl::StatusOr<ClientView> SetClientPriority(uint32_t client_id, contract::Priority p)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<ClientView>> SetPodPriority(const std::string& pod_uid,
                                                         contract::Priority p)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ClientView> SetPaused(uint32_t client_id, bool paused) ABSL_LOCKS_EXCLUDED(mu_);
  // Jobs (server/jobs.h), optionally of one namespace. Job-wide actions change every rank under
  // one hold of the lock, and ranks that register later while the job still has one (a
  // restarted rank); they are forgotten when its last rank leaves. NOT_FOUND for a job with no
  // live rank.
  std::vector<JobView> ListJobs(const std::string& ns) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<JobView> SetJobPaused(const std::string& job_key, bool paused)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<ClientView>> SetJobPriority(const std::string& job_key,
                                                         contract::Priority p)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<GpuPolicy> GetPolicy(uint32_t gpu) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns the policy of the changed GPU (the first, for all GPUs).
  absl::StatusOr<GpuPolicy> SetPolicy(const PolicyChange& change) ABSL_LOCKS_EXCLUDED(mu_);
  // Timeline views, names resolved. Spans of a GPU after a cursor, in arrival order
  // (StreamTimeline; max 0 = 1000); spans starting in a window (GetTimeline; Unix ms, until 0 =
  // open, max 0 = 10,000).
  absl::StatusOr<TimelineView> TimelineAfter(uint32_t gpu, uint64_t cursor, uint32_t max_spans)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<TimelineView> TimelineWindow(uint32_t gpu, int64_t since_unix_ms,
                                              int64_t until_unix_ms, uint32_t max_spans)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sets the recording window; returns every GPU's.
  absl::StatusOr<std::vector<RecordingWindow>> SetRecording(const RecordingChange& change)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<KernelProfileView> GetKernelProfile(uint32_t client_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Agent API: pods' policies (full_sync: these are all the node's pods; the others are
  // forgotten), and a pod that went away.
  absl::StatusOr<PodSync> UpsertPods(std::vector<PodPolicy> pods, bool full_sync)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeletePod(const std::string& pod_uid) ABSL_LOCKS_EXCLUDED(mu_);

  // Known kernel profiles (Orion CSV rows), matched by name for every client.
  void ImportOrionProfile(const std::vector<OrionProfileRow>& rows) ABSL_LOCKS_EXCLUDED(mu_);

  MetricsSnapshot Snapshot() ABSL_LOCKS_EXCLUDED(mu_);
  const ServerConfig& config() const { return config_; }
  NodeBoard& board() { return *board_; }

 private:
  struct ClientRecord {
    ClientRecord(uint32_t client_id, const IngestOptions* options)
        : id(client_id), ingest(client_id, options) {}
    uint32_t id = 0, slot = 0, gpu = 0;
    PeerIdentity peer;
    std::string process_name;
    ClientPolicy policy;
    bool paused = false;
    bool admin_priority = false;
    int64_t registered_unix_ms = 0;
    uint64_t registered_ns = 0;  // MonotonicNs() at registration
    uint32_t usable_millicpus = 0;  // as the client found them; 0 = unknown or no limit
    std::string requested_job;      // orion-run --job, checked; standalone and trusted only
    uint64_t gate_claims_ignored = 0;
    ClientIngest ingest;                // what its events became
    uint64_t busy_count_at_change = 0;  // ingest.busy().count when the GPU's budget last changed
    uint64_t hole_since_ns = 0;
    // The server's own read position in the client's ring: the ring's tail is a copy for the
    // producers, and a tenant can write it (and head) at will.
    uint64_t read_pos = 0;
    uint32_t ring_strikes = 0;     // passes that found the ring's indices written over
    bool quarantined = false;      // its events are dropped unread (ring_strikes reached the cap)
    uint64_t quarantined_events = 0;
    // The held time last shown (ViewOf): the metric is a counter, and a wait in progress read
    // just after it ended could show a few microseconds more than the finished wait.
    mutable uint64_t held_shown_ns = 0;
    mutable uint64_t hold_releases_shown = 0;  // likewise: never less than shown before
  };
  // Drains up to `max` of the client's events under mu_; returns how many it consumed. Never
  // more than a ring's worth a pass, whatever the tenant writes into the indices.
  size_t DrainClient(ClientRecord& c, uint64_t now, size_t max, bool first_batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tenant wrote over its ring's indices: a strike, and quarantine at the cap.
  void StrikeRing(ClientRecord& c, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ClientView ViewOf(const ClientRecord& c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job of a client with this identity (server/jobs.h).
  JobIdentity JobFor(const PeerIdentity& peer, const std::string& requested_job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live clients of a job, by id.
  std::vector<ClientRecord*> RanksOf(const std::string& job_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every live client grouped into jobs (GroupJobs): a job's view needs the other jobs' services.
  std::vector<JobView> AllJobs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status JobNotFound(const std::string& job_key) const;
  // The client's priority as an admin override.
  void OverridePriority(ClientRecord& c, contract::Priority p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pauses or resumes the client, on its record and its board slot.
  void PauseClient(ClientRecord& c, bool paused) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckGpu(uint32_t gpu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyPolicyToClient(ClientRecord& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ConsumeEvent(ClientRecord& c, const contract::Event& e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where a client's events land: its GPU's timeline and busy time, the node's names.
  IngestSinks SinksFor(const ClientRecord& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The busy periods this client reported since its GPU's budget last changed (newest last, at
  // most the window), for the budget search.
  std::vector<uint64_t> BusySinceChange(const ClientRecord& c) const;
  // The budget of GPU g changed: the budget search starts collecting evidence afresh.
  void RestartBudgetEvidence(uint32_t g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Without a latency target or a budget set by hand (priority mode): the budget follows the
  // GPU's high-priority busy periods (SizeBudgetToService). True when it owns the budget.
  bool SizeBudgetToServices(uint32_t g, GpuPolicy& gp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogHighPriorityOvercommit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::set<std::string>> HighPriorityTenants() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The board index of the GPU the client asked for, if the server lets it use it; otherwise
  // -1 and *refusal says why (*foreign: a GPU of the node the pod was not allocated).
  int GpuIndexFor(const PeerIdentity& peer, const contract::RegisterRequest& request,
                  std::string* refusal, bool* foreign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Holds mu_ for a public method. Callers waiting here go before the drain's next batch
  // (api_waiters_), so none waits for more than one batch however busy the rings are.
  class ABSL_SCOPED_LOCKABLE ApiLock {
   public:
    explicit ApiLock(NodeState* s) ABSL_EXCLUSIVE_LOCK_FUNCTION(s->mu_) : s_(s) {
      s_->api_waiters_.fetch_add(1);
      s_->mu_.Lock();
      s_->api_waiters_.fetch_sub(1);
    }
    ~ApiLock() ABSL_UNLOCK_FUNCTION() { s_->mu_.Unlock(); }
    ApiLock(const ApiLock&) = delete;
    ApiLock& operator=(const ApiLock&) = delete;

   private:
    NodeState* s_;
  };

  const ServerConfig config_;
  std::unique_ptr<NodeBoard> board_;
  const int64_t mono_to_unix_;
  const IngestOptions ingest_options_;
  BudgetController budget_controller_;

  absl::Mutex mu_;
  std::atomic<int> api_waiters_{0};  // public methods waiting for mu_ (ApiLock)
  // The span's name: the kernel's (or func@0x...), the NVTX range's, or empty.
  std::string SpanName(const Span& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TimelineView NameSpans(std::vector<Span> spans) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t next_client_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint32_t, ClientRecord> clients_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, PodPolicy> pods_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, contract::Priority> pod_overrides_ ABSL_GUARDED_BY(mu_);
  // Job-wide actions, for ranks that register while the job lives (by job key).
  std::map<std::string, contract::Priority> job_overrides_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> paused_jobs_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, OrionProfileRow> known_kernels_ ABSL_GUARDED_BY(mu_);
  std::vector<GpuPolicy> gpu_policy_ ABSL_GUARDED_BY(mu_);
  // GPU time the spans of each GPU's clients covered, by contract::Priority.
  std::vector<std::array<double, 2>> gpu_busy_ns_ ABSL_GUARDED_BY(mu_);
  std::vector<TimelineStore> timelines_ ABSL_GUARDED_BY(mu_);
  RangeNames range_names_ ABSL_GUARDED_BY(mu_);
  uint64_t registrations_ok_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> registrations_failed_ ABSL_GUARDED_BY(mu_);
  uint64_t events_ingested_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t events_skipped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t events_quarantined_ ABSL_GUARDED_BY(mu_) = 0;  // departed clients' included
  uint64_t clients_quarantined_ ABSL_GUARDED_BY(mu_) = 0;  // ever
  std::map<std::string, uint64_t> repairs_ ABSL_GUARDED_BY(mu_);
  // GPUs not in config gpus that each tenant (pod UID, or "uid N") made the board add.
  std::map<std::string, uint32_t> unlisted_gpus_added_ ABSL_GUARDED_BY(mu_);
  uint64_t board_corrections_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_correction_log_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // Per GPU, whether it held more high-priority pods than allowed at the last policy tick (a log
  // line when that changes).
  std::vector<bool> hp_overcommitted_ ABSL_GUARDED_BY(mu_);
  // What departed clients' rings held at the end (their slots are reused, so kept here).
  uint64_t departed_written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t departed_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t departed_untabled_ ABSL_GUARDED_BY(mu_) = 0;
  // One stderr line per registration and exit; the last clients that exited.
  ClientLifecycleLog lifecycle_log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace orion::server
