// Policy simulation harness (tests/policy): the real server state (NodeBoard and its areas +
// NodeState) and simulated interposer clients, all on the virtual clock of sim_gpu_model.h.
//
// What is real and what is simulated:
//  - real: the board layout and its atomics, NodeState (Register, DrainOnce, PolicyTick with the
//    budget AIMD, SetPolicy/SetPriority/SetPaused/Unregister), the event rings, the gate's decision
//    functions (interpose/launch_gate.h: DecideBestEffort, ReleaseBudget, ServerAlive,
//    kMaxFutexWaitNs), OpenGate (interpose/launch_gate.cc), the kernel registry's sampling and
//    duration estimate (interpose/kernel_registry.h) and the kernel-name classifier;
//  - simulated (SimClient): the interposer's GuardedLaunch / WaitAtGate / poller sequence, step by
//    step as in interpose/hooks_launch.cc, launch_gate.cc and completion_pipeline.cc, but as events:
//    a high-priority launch raises its SlotGate's inflight and stamps last_progress_ns before the launch and
//    again after it; the poller notices a kernel's end poll_lag_ns late, then stamps
//    last_progress_ns, lowers inflight, releases the budget charge and opens the gate; a held
//    best-effort launch re-evaluates when a futex word it waits on changes (plus wake_latency_ns),
//    at the end of the high-priority grace period (wake_by) or after kMaxFutexWaitNs, like the
//    real waiter. The spin phase of WaitAtGate (spin_ns) is not modelled separately: a waiter
//    always reacts wake_latency_ns after a change. A launch call itself takes no time, and the
//    application's own synchronize returns at the kernel's end (no poller lag). Kernels of a
//    killed or hung process run to their end on the GPU;
//  - the server's threads become periodic events: DrainOnce every drain_period_ns and PolicyTick
//    (heartbeat + budget adaptation) every tick_period_ns, both given the virtual time.
//  - high-priority bookkeeping (inflight, last_progress_ns, busy periods and their kBusyPeriod
//    events, which PolicyTick's budget adaptation feeds on) is the interposer's own
//    NoteHighPriorityLaunch / NoteHighPriorityCompletion (interpose/launch_gate.h), and
//    FollowHighPriorityLaunch's models (every launch is followed all the same);
//    report_busy_periods = false drops the events.
//
// Usage:
//   SimNode node;                                   // two GPUs, default server config
//   SimClient* hp = node.AddClient("infer", 0, Priority::kHigh);
//   hp->Launch(KernelSpec{...}, on_launched, on_done);
//   node.RunUntil(node.loop().now() + 5 * kSec);
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "contract/kernel_class.h"
#include "contract/orion_contract.h"
#include "interpose/kernel_registry.h"
#include "interpose/launch_gate.h"
#include "server/board.h"
#include "server/config.h"
#include "server/node_state.h"
#include "tests/policy/sim_gpu_model.h"

namespace orion::policy_sim {

using contract::Priority;
using interpose::GateDecision;

inline constexpr uint64_t kUs = 1'000;
inline constexpr uint64_t kMs = 1'000'000;
inline constexpr uint64_t kSec = 1'000'000'000;

struct SimParams {
  uint64_t start_ns = 10 * kSec;        // virtual CLOCK_MONOTONIC at the start
  uint64_t poll_lag_ns = 50 * kUs;      // kernel end -> the interposer's poller notices it
  uint64_t wake_latency_ns = 5 * kUs;   // futex word changed -> the waiting thread runs again
  uint64_t drain_period_ns = 1 * kMs;   // server drain thread
  uint64_t tick_period_ns = 100 * kMs;  // server policy loop
  bool report_busy_periods = true;      // send kBusyPeriod as the contract defines it
};

inline constexpr const char* kSimGpuUuids[2] = {"GPU-5150a000-0000-4000-8000-000000000000",
                                               "GPU-5150a001-0000-4000-8000-000000000001"};

// A kernel launch as the application makes it.
struct KernelSpec {
  uint64_t func = 0;         // stands in for the CUfunction (one per distinct kernel)
  std::string name;          // what cuFuncGetName would return
  uint64_t duration_ns = 0;  // how long it runs once on the GPU
  uint32_t blocks = 1;       // grid size
};

// One launch that went to the GPU.
struct LaunchRecord {
  uint64_t t_ns = 0;       // virtual time the launch was made
  uint64_t waited_ns = 0;  // held at the gate / by a pause
  uint64_t func = 0;
  uint32_t blocks = 0;
  uint64_t duration_ns = 0;
  bool high = false;       // took the high-priority path (inflight counted)
  uint64_t charged_ns = 0; // budget charge (kGoBudget)
};

// One kernel's trip through the GPU.
struct GpuTiming {
  uint64_t launch_ns = 0;  // the launch call returned (kernel queued)
  uint64_t start_ns = 0;   // it reached the GPU
  uint64_t end_ns = 0;
  bool high = false;
};

// One gate decision (DecideBestEffort) a best-effort launch asked for.
struct DecisionRecord {
  uint64_t t_ns = 0;
  GateDecision decision = GateDecision::kGoIdle;
};

class SimNode;

// One simulated process with the interposer loaded, on one GPU, with one launching thread.
class SimClient {
 public:
  SimClient(SimNode* node, const server::NodeState::Admission& a, std::string name)
      : node_(node),
        name_(std::move(name)),
        id_(a.client_id),
        slot_(a.slot),
        gpu_(a.gpu),
        generation_(a.generation) {}
  SimClient(const SimClient&) = delete;
  SimClient& operator=(const SimClient&) = delete;

  uint32_t id() const { return id_; }
  uint32_t slot() const { return slot_; }
  uint32_t gpu() const { return gpu_; }
  const std::string& name() const { return name_; }
  bool frozen() const { return frozen_; }
  bool launch_pending() const { return pending_; }
  inline EventLoop& loop();

  // The application launches k. on_launched runs when the launch call returns (after any wait at
  // the gate or pause); on_done when the kernel has ended on the GPU (what the application's own
  // synchronize sees). One launch at a time.
  inline void Launch(const KernelSpec& k, std::function<void()> on_launched,
                     std::function<void()> on_done);

  // The process hangs (SIGSTOP, deadlock): no more launches, and its poller stops, so completions
  // are never reported. Kernels already queued still run on the GPU.
  void Freeze() { frozen_ = true; }

  const std::vector<LaunchRecord>& launches() const { return launches_; }
  const std::vector<DecisionRecord>& decisions() const { return decisions_; }
  // Every kernel of this client that ended on the GPU, in end order.
  const std::vector<GpuTiming>& gpu_timings() const { return gpu_timings_; }
  // Busy periods this client reported (kBusyPeriod): (end, duration).
  const std::vector<std::pair<uint64_t, uint64_t>>& busy_periods() const { return busy_periods_; }
  // Durations of the busy periods that ended at or after from_ns.
  std::vector<uint64_t> BusyPeriodsSince(uint64_t from_ns) const {
    std::vector<uint64_t> out;
    for (const auto& [end, duration] : busy_periods_) {
      if (end >= from_ns) out.push_back(duration);
    }
    return out;
  }
  uint64_t CountDecisions(GateDecision d, uint64_t from_ns = 0) const {
    uint64_t n = 0;
    for (const auto& r : decisions_) n += (r.decision == d && r.t_ns >= from_ns) ? 1 : 0;
    return n;
  }

  // SimNode calls this after every event: a waiter whose futex word changed wakes up.
  inline void CheckWake();

 private:
  struct Pending {
    interpose::KernelRecord* record = nullptr;
    uint64_t func = 0;
    uint64_t duration_ns = 0;
    uint64_t budget_ns = 0;
    bool high = false;
    bool timed = false;
  };

  inline void Attempt();
  inline void DoLaunch();
  inline void Finish(const Pending& p);
  inline void WaitOn(const std::atomic<uint32_t>* word, uint64_t timeout_ns);
  inline void Push(const contract::Event& e);
  inline contract::ClientSlot& slot_ref();
  inline contract::GpuState& gpu_ref();
  inline contract::GateArea& gate_ref();
  inline contract::SlotGate& own_gate();
  inline contract::ClientArea::Counters& counters();
  inline interpose::KernelRecord* Record(const KernelSpec& k);

  SimNode* node_;
  std::string name_;
  uint32_t id_, slot_, gpu_, generation_;
  bool frozen_ = false;
  std::map<uint64_t, std::unique_ptr<interpose::KernelRecord>> kernels_;

  // The launch in progress (GuardedLaunch's locals).
  bool pending_ = false;
  bool entered_ = false;
  KernelSpec kernel_;
  interpose::KernelRecord* record_ = nullptr;
  std::function<void()> on_launched_, on_done_;
  bool high_ = false, gated_ = false;
  uint64_t estimate_ns_ = 0, budget_ns_ = 0, start_ns_ = 0;
  std::atomic<uint64_t> hp_queue_end_ns_{0};  // FollowHighPriorityLaunch's model of our queue

  // A wait on a futex word (gate_seq or the slot's wake_seq).
  bool waiting_ = false;
  const std::atomic<uint32_t>* wait_word_ = nullptr;
  uint32_t wait_expected_ = 0;
  uint64_t wait_token_ = 0;

  std::vector<LaunchRecord> launches_;
  std::vector<DecisionRecord> decisions_;
  std::vector<std::pair<uint64_t, uint64_t>> busy_periods_;
  std::vector<GpuTiming> gpu_timings_;
};

// The node: real NodeBoard + NodeState, two simulated GPUs, the server's periodic work.
class SimNode {
 public:
  // `configure` may change the server config before NodeState starts (gpus are set already).
  explicit SimNode(SimParams params = {},
                   const std::function<void(server::ServerConfig&)>& configure = {})
      : params_(params), loop_(params.start_ns) {
    auto board = server::NodeBoard::Create();
    if (!board.ok()) {
      std::fprintf(stderr, "policy sim: %s\n", board.status().ToString().c_str());
      std::abort();
    }
    auto cfg = server::ParseServerConfig("", "<policy-sim>");
    if (!cfg.ok()) std::abort();
    cfg->node_name = "sim-node";
    cfg->gpus = {kSimGpuUuids[0], kSimGpuUuids[1]};
    // The scenarios ask for targets of a few ms (orion-run); the production floor of 5 ms guards
    // against tenants, which the simulation does not play.
    cfg->policy.min_latency_target_us = 1000;
    if (configure) configure(*cfg);
    state_ = std::make_unique<server::NodeState>(*cfg, std::move(*board));
    for (auto& g : gpus_) g = std::make_unique<SimGpuModel>(&loop_);
    state_->PolicyTick(loop_.now());  // first heartbeat before any client looks at the board
    loop_.SetAfterEach([this] {
      for (auto& c : clients_) c->CheckWake();
    });
    ScheduleDrain();
    ScheduleTick();
  }
  ~SimNode() {
    clients_.clear();
    state_.reset();  // unmaps and closes the board and its areas
  }
  SimNode(const SimNode&) = delete;
  SimNode& operator=(const SimNode&) = delete;

  const SimParams& params() const { return params_; }
  EventLoop& loop() { return loop_; }
  server::NodeState& state() { return *state_; }
  contract::Board& board() { return state_->board().board(); }
  contract::GateArea& gate(uint32_t gpu) { return *state_->board().gate(gpu); }
  SimGpuModel& gpu(uint32_t i) { return *gpus_[i]; }
  uint64_t now() const { return loop_.now(); }
  void RunUntil(uint64_t t_ns) { loop_.RunUntil(t_ns); }
  void RunFor(uint64_t ns) { loop_.RunUntil(loop_.now() + ns); }

  // A process registers as the registration listener would admit it: identity from the kernel
  // (a standalone process, no pod), the rest from the request (priority and latency target are
  // honoured in standalone mode with trust_client_requests).
  SimClient* AddClient(const std::string& name, uint32_t gpu, Priority requested,
                       uint64_t latency_target_us = 0) {
    server::PeerIdentity peer;
    peer.pid = static_cast<pid_t>(40000 + clients_.size());
    peer.uid = 1000;
    peer.gid = 1000;
    peer.process_name = name;
    contract::RegisterRequest r{};
    r.header = contract::MakeHeader(contract::MessageType::kRegister, sizeof(r));
    r.claimed_pid = static_cast<uint32_t>(peer.pid);
    r.device_ordinal = gpu;
    std::snprintf(r.gpu_uuid, sizeof(r.gpu_uuid), "%s", kSimGpuUuids[gpu]);
    r.requested_priority = static_cast<uint32_t>(requested);
    r.requested_latency_target_us = latency_target_us;
    std::snprintf(r.process_name, sizeof(r.process_name), "%s", name.c_str());
    const server::NodeState::Admission a = state_->Register(peer, r);
    if (a.status != contract::RegisterStatus::kOk) {
      std::fprintf(stderr, "policy sim: registration of %s refused: %s\n", name.c_str(),
                   a.message.c_str());
      std::abort();
    }
    clients_.push_back(std::make_unique<SimClient>(this, a, name));
    return clients_.back().get();
  }

  // The process dies: it stops at once, the registration listener sees its socket close and the
  // server unregisters it (slot freed, gate woken).
  void Kill(SimClient* c) {
    c->Freeze();
    state_->Unregister(c->id());
  }

 private:
  void ScheduleDrain() {
    loop_.After(params_.drain_period_ns, [this] {
      state_->DrainOnce(loop_.now());
      ScheduleDrain();
    });
  }
  void ScheduleTick() {
    loop_.After(params_.tick_period_ns, [this] {
      state_->PolicyTick(loop_.now());
      ScheduleTick();
    });
  }

  SimParams params_;
  EventLoop loop_;
  std::unique_ptr<server::NodeState> state_;
  std::unique_ptr<SimGpuModel> gpus_[2];
  std::vector<std::unique_ptr<SimClient>> clients_;
};

// ---- SimClient: the interposer's launch path, event by event ----

EventLoop& SimClient::loop() { return node_->loop(); }
contract::ClientSlot& SimClient::slot_ref() { return node_->board().slots[slot_]; }
contract::GpuState& SimClient::gpu_ref() { return node_->board().gpus[gpu_]; }
contract::GateArea& SimClient::gate_ref() { return *node_->state().board().gate(gpu_); }
contract::SlotGate& SimClient::own_gate() { return gate_ref().slots[slot_]; }
contract::ClientArea::Counters& SimClient::counters() {
  return node_->state().board().area(slot_)->counters;
}

void SimClient::Push(const contract::Event& e) {
  if (contract::ClientArea* area = node_->state().board().area(slot_); area != nullptr) {
    area->ring.TryPush(e);
  }
}

interpose::KernelRecord* SimClient::Record(const KernelSpec& k) {
  auto& rec = kernels_[k.func];
  if (!rec) {
    rec = std::make_unique<interpose::KernelRecord>();
    rec->key.store(k.func, std::memory_order_relaxed);
  }
  if (rec->ClaimNameReport()) {  // ReportKernelName
    contract::Event e{};
    e.kind = contract::EventKind::kKernelName;
    e.cpu_ns = loop().now();
    e.func = k.func;
    std::snprintf(e.name, sizeof(e.name), "%s", k.name.c_str());
    rec->kclass.store(contract::KernelClassToBoard(contract::ClassifyKernelName(k.name.c_str())),
                      std::memory_order_relaxed);
    Push(e);
  }
  return rec.get();
}

void SimClient::Launch(const KernelSpec& k, std::function<void()> on_launched,
                       std::function<void()> on_done) {
  if (frozen_ || pending_) return;
  pending_ = true;
  entered_ = false;
  kernel_ = k;
  on_launched_ = std::move(on_launched);
  on_done_ = std::move(on_done);
  Attempt();
}

void SimClient::Attempt() {
  if (frozen_ || !pending_) return;
  contract::Board& board = node_->board();
  contract::ClientSlot& slot = slot_ref();
  contract::GpuState& gpu = gpu_ref();
  const uint64_t now = loop().now();
  if (!entered_) {
    // GuardedLaunch: priority, gating and the estimate are read once, before the gate.
    entered_ = true;
    record_ = Record(kernel_);
    high_ = slot.priority.load(std::memory_order_relaxed) ==
            static_cast<uint32_t>(Priority::kHigh);
    gated_ = !high_ && gpu.mode.load(std::memory_order_relaxed) !=
                           static_cast<uint32_t>(contract::GateMode::kPassThrough);
    estimate_ns_ = record_->EstimateNs();
    budget_ns_ = 0;
    start_ns_ = 0;
    if (!gated_ && slot.paused.load(std::memory_order_relaxed) == 0) {
      DoLaunch();
      return;
    }
  }
  // One pass of WaitAtGate's loop.
  if (slot.paused.load(std::memory_order_acquire) != 0) {
    if (start_ns_ == 0) start_ns_ = now;
    if (interpose::ServerAlive(board, now)) {
      WaitOn(&slot.wake_seq, interpose::kMaxFutexWaitNs);
      return;
    }
    DoLaunch();  // a dead server cannot resume us: fail open
    return;
  }
  if (slot.gpu.load(std::memory_order_relaxed) >= contract::kMaxGpus ||
      slot.priority.load(std::memory_order_relaxed) == static_cast<uint32_t>(Priority::kHigh)) {
    DoLaunch();
    return;
  }
  uint64_t wake_by = 0;
  const GateDecision d = interpose::DecideBestEffort(
      board, gpu, gate_ref(), slot_, now,
      interpose::BestEffortLaunch{kernel_.blocks, estimate_ns_,
                                  record_->kclass.load(std::memory_order_relaxed)},
      &wake_by);
  decisions_.push_back(DecisionRecord{now, d});
  if (d == GateDecision::kGoBudget) {
    budget_ns_ = estimate_ns_;
    DoLaunch();
    return;
  }
  if (d == GateDecision::kGoIdle) {
    DoLaunch();
    return;
  }
  if (start_ns_ == 0) start_ns_ = now;
  uint64_t timeout = interpose::kMaxFutexWaitNs;
  if (wake_by > now && wake_by - now < timeout) timeout = wake_by - now;
  WaitOn(&gate_ref().words.gate_seq, timeout);
}

void SimClient::WaitOn(const std::atomic<uint32_t>* word, uint64_t timeout_ns) {
  waiting_ = true;
  wait_word_ = word;
  wait_expected_ = word->load(std::memory_order_acquire);
  const uint64_t token = ++wait_token_;
  loop().After(timeout_ns, [this, token] {
    if (!waiting_ || token != wait_token_) return;
    waiting_ = false;
    ++wait_token_;
    Attempt();  // FUTEX_WAIT timed out: re-check
  });
}

void SimClient::CheckWake() {
  if (!waiting_ || frozen_) return;
  if (wait_word_->load(std::memory_order_acquire) == wait_expected_) return;
  waiting_ = false;
  ++wait_token_;
  loop().After(node_->params().wake_latency_ns, [this] { Attempt(); });
}

void SimClient::DoLaunch() {
  contract::ClientSlot& slot = slot_ref();
  const uint64_t now = loop().now();
  interpose::KernelRecord* rec = record_;
  const uint64_t launch_index = rec->launches.fetch_add(1, std::memory_order_relaxed);
  const bool profile = slot.profile.load(std::memory_order_relaxed) != 0;
  auto p = std::make_shared<Pending>();
  p->record = rec;
  p->func = kernel_.func;
  p->duration_ns = kernel_.duration_ns;
  p->budget_ns = budget_ns_;
  p->high = high_;
  p->timed = (profile || gated_) && interpose::ShouldSample(launch_index);
  if (high_) {
    // The follow decision's model (the GPU's queue of this client's work); the simulation
    // follows every launch.
    interpose::FollowHighPriorityLaunch(gpu_ref(), gate_ref(), hp_queue_end_ns_, now,
                                        rec->estimate_ns.load(std::memory_order_relaxed), false);
    // Before the launch: best-effort clients must see the GPU busy as early as possible.
    interpose::NoteHighPriorityClass(own_gate(), rec->kclass.load(std::memory_order_relaxed));
    interpose::BusyPeriod ended;
    if (interpose::NoteHighPriorityLaunch(own_gate(), gpu_ref(), now, &ended) &&
        node_->params().report_busy_periods) {
      contract::Event e{};
      e.kind = contract::EventKind::kBusyPeriod;
      e.cpu_ns = ended.start_ns;
      e.duration_ns = ended.duration_ns;
      Push(e);
      busy_periods_.emplace_back(ended.start_ns + ended.duration_ns, e.duration_ns);
    }
  }
  std::function<void()> on_done = std::move(on_done_);
  const bool high = high_;
  node_->gpu(gpu_).Submit(id_, kernel_.duration_ns, [this, p, on_done, now, high](
                                                        uint64_t start, uint64_t end) {
    gpu_timings_.push_back(GpuTiming{now, start, end, high});
    if (!frozen_ && on_done) on_done();  // the application's synchronize returns
    loop().After(node_->params().poll_lag_ns, [this, p] { Finish(*p); });
  });
  counters().launches.fetch_add(1, std::memory_order_relaxed);
  own_gate().last_progress_ns.store(now, std::memory_order_relaxed);
  contract::Event e{};
  e.kind = contract::EventKind::kLaunch;
  e.cpu_ns = now;
  e.func = kernel_.func;
  e.grid[0] = kernel_.blocks;
  e.grid[1] = e.grid[2] = 1;
  e.block[0] = 256;
  e.block[1] = e.block[2] = 1;
  Push(e);
  const uint64_t waited = start_ns_ != 0 ? now - start_ns_ : 0;
  if (waited != 0) {
    counters().throttled_ns.fetch_add(waited, std::memory_order_relaxed);
    contract::Event t{};
    t.kind = contract::EventKind::kThrottled;
    t.cpu_ns = now;
    t.func = kernel_.func;
    t.duration_ns = waited;
    Push(t);
  }
  launches_.push_back(LaunchRecord{now, waited, kernel_.func, kernel_.blocks,
                                   kernel_.duration_ns, high_, budget_ns_});
  pending_ = false;
  entered_ = false;
  std::function<void()> on_launched = std::move(on_launched_);
  if (on_launched) on_launched();
}

void SimClient::Finish(const Pending& p) {
  // A hung process's poller is hung too; a slot taken over by someone else is not ours.
  if (frozen_ || slot_ref().generation.load(std::memory_order_relaxed) != generation_) return;
  const uint64_t now = loop().now();
  bool open_gate = false;
  if (p.high && interpose::NoteHighPriorityCompletion(own_gate(), now)) open_gate = true;
  if (p.budget_ns != 0) {
    interpose::ReleaseBudget(gate_ref(), p.budget_ns);
    open_gate = true;
  }
  if (open_gate) interpose::OpenGate(gate_ref());
  if (p.timed) {
    p.record->AddSample(p.duration_ns);
    contract::Event e{};
    e.kind = contract::EventKind::kKernelTime;
    e.cpu_ns = now;
    e.func = p.func;
    e.duration_ns = p.duration_ns;
    Push(e);
  }
}

}  // namespace orion::policy_sim
