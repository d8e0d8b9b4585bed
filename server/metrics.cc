// Builds the orion_* metric families from a NodeState snapshot (see metrics.h).
#include "server/metrics.h"

#include <limits>

namespace orion::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

ClientMetric Labeled(std::vector<ClientMetric::Label> labels) {
  ClientMetric m;
  m.label = std::move(labels);
  return m;
}

// Appends one counter or gauge sample (as the family's type says) with these labels.
void Add(MetricFamily& f, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric m = Labeled(std::move(labels));
  (f.type == MetricType::Counter ? m.counter.value : m.gauge.value) = value;
  f.metric.push_back(std::move(m));
}

// A counter family with one sample, labelled by node only: a node-wide total.
MetricFamily NodeCounter(const char* name, const char* help, const std::string& node,
                         uint64_t value) {
  MetricFamily f = Family(name, help, MetricType::Counter);
  Add(f, {{"node", node}}, static_cast<double>(value));
  return f;
}

// Appends one histogram sample from fixed upper bounds and non-cumulative counts.
template <size_t N>
void AddHistogram(MetricFamily& f, std::vector<ClientMetric::Label> labels,
                  const SecondsHistogram<N>& h, const std::array<double, N>& bounds) {
  ClientMetric m = Labeled(std::move(labels));
  m.histogram.sample_count = h.count;
  m.histogram.sample_sum = h.sum_s;
  uint64_t cumulative = 0;
  for (size_t b = 0; b < N; ++b) {
    cumulative += h.buckets[b];
    m.histogram.bucket.push_back({cumulative, bounds[b]});
  }
  m.histogram.bucket.push_back({h.count, std::numeric_limits<double>::infinity()});
  f.metric.push_back(std::move(m));
}

}  // namespace

std::vector<MetricFamily> MetricsCollector::Collect() const {
  const MetricsSnapshot snap = state_->Snapshot();
  std::vector<MetricFamily> out;

  MetricFamily clients = Family("orion_clients", "Registered CUDA clients by GPU and priority",
                                MetricType::Gauge);
  MetricFamily busy = Family("orion_gpu_busy_seconds_total",
                             "Estimated GPU kernel time by priority (learned kernel durations)",
                             MetricType::Counter);
  MetricFamily hp_busy = Family("orion_gpu_high_priority_busy",
                                "1 while a high-priority client has work on the GPU",
                                MetricType::Gauge);
  MetricFamily hp_pods = Family("orion_gpu_high_priority_pods",
                                "Pods with a high-priority client on the GPU (a process in no "
                                "pod counts alone)",
                                MetricType::Gauge);
  MetricFamily hp_allowed = Family("orion_gpu_high_priority_pods_allowed",
                                   "High-priority pods the GPU may hold (high_priority_per_gpu); "
                                   "more wait for each other",
                                   MetricType::Gauge);
  MetricFamily budget = Family("orion_policy_be_budget_seconds",
                               "Best-effort GPU time admitted beside high-priority work",
                               MetricType::Gauge);
  for (const GpuSample& g : snap.gpus) {
    for (int p = 0; p < 2; ++p) {
      const char* prio = p == 1 ? "high" : "best-effort";
      Add(clients, {{"node", node_}, {"gpu", g.gpu}, {"priority", prio}}, g.clients[p]);
      Add(busy, {{"node", node_}, {"gpu", g.gpu}, {"priority", prio}}, g.busy_seconds[p]);
    }
    Add(hp_busy, {{"node", node_}, {"gpu", g.gpu}}, g.hp_busy ? 1 : 0);
    Add(hp_pods, {{"node", node_}, {"gpu", g.gpu}}, g.high_priority_pods);
    Add(hp_allowed, {{"node", node_}, {"gpu", g.gpu}}, snap.high_priority_pods_allowed);
    Add(budget, {{"node", node_}, {"gpu", g.gpu}}, g.be_budget_s);
  }

  MetricFamily kernels = Family("orion_client_kernels_launched_total",
                                "Kernels launched by a client (graph nodes counted)",
                                MetricType::Counter);
  MetricFamily throttled = Family(
      "orion_client_throttled_seconds_total",
      "Time a client's launches waited at the priority gate or paused, a wait in progress included",
      MetricType::Counter);
  MetricFamily mem_used = Family("orion_client_memory_used_bytes",
                                 "GPU memory allocated by a client", MetricType::Gauge);
  MetricFamily mem_limit = Family("orion_client_memory_limit_bytes",
                                  "GPU memory quota of a client (0 = unlimited)",
                                  MetricType::Gauge);
  MetricFamily dropped = Family("orion_client_events_dropped_total",
                                "Events lost because a client's ring was full",
                                MetricType::Counter);
  MetricFamily client_busy = Family(
      "orion_client_gpu_busy_seconds_total",
      "GPU time of a client's kernels and CUDA graphs: measured on the GPU for sampled "
      "launches (every launch while profiling), the kernel's or graph's mean measured time "
      "for the others",
      MetricType::Counter);
  MetricFamily claims = Family("orion_client_gate_claims_ignored_total",
                               "Times a best-effort client was found claiming high-priority work "
                               "in its GPU's shared gate area (ignored by every gate, cleared)",
                               MetricType::Counter);
  MetricFamily releases = Family(
      "orion_client_gpu_hold_releases_total",
      "Times a best-effort client's hold keeper opened a GPU hold that had lasted past its bound "
      "(the high-priority clients busy all along) and held its launches on the CPU instead",
      MetricType::Counter);
  MetricFamily period = Family("orion_hp_busy_period_seconds",
                               "High-priority GPU latency per burst of work (first launch to "
                               "last completion)",
                               MetricType::Histogram);
  MetricFamily requests = Family("orion_client_request_latency_seconds",
                                 "Latency of the requests a client marks with NVTX ranges (named "
                                 "by request_range_prefix): push to the later of pop and the "
                                 "end of their GPU work",
                                 MetricType::Histogram);
  for (const ClientSample& c : snap.clients) {
    const std::vector<ClientMetric::Label> labels = {
        {"node", node_}, {"gpu", c.gpu}, {"pod", c.pod}, {"namespace", c.ns},
        {"priority", c.priority}, {"client", c.client}};
    Add(kernels, labels, static_cast<double>(c.kernels));
    Add(throttled, labels, static_cast<double>(c.throttled_ns) / 1e9);
    Add(mem_used, labels, static_cast<double>(c.memory_used));
    Add(mem_limit, labels, static_cast<double>(c.memory_limit));
    Add(dropped, labels, static_cast<double>(c.dropped));
    Add(claims, labels, static_cast<double>(c.gate_claims_ignored));
    Add(releases, labels, static_cast<double>(c.hold_releases));
    Add(client_busy, labels, c.gpu_busy_s);
    if (c.priority == "high") {
      AddHistogram(period,
                   {{"node", node_}, {"gpu", c.gpu}, {"pod", c.pod}, {"namespace", c.ns},
                    {"client", c.client}},
                   c.busy, kBusyPeriodBuckets);
    }
    if (c.requests.count > 0) AddHistogram(requests, labels, c.requests, kRequestLatencyBuckets);
  }

  // Jobs and pods: live ones only (a job's series go with its last rank). The job's label is
  // orion_job: Prometheus itself sets `job` on every series it scrapes.
  MetricFamily job_ranks = Family("orion_job_ranks",
                                  "Live ranks (clients) of a training job on a GPU: the ranks "
                                  "of one pod, JobSet, PyTorchJob or orion/job annotation, or of "
                                  "one standalone launcher",
                                  MetricType::Gauge);
  MetricFamily job_gpus = Family("orion_job_gpus", "Distinct GPUs a job's live ranks use",
                                 MetricType::Gauge);
  MetricFamily job_held = Family("orion_job_held_seconds",
                                 "Time a job's live ranks were held at the gate or paused, "
                                 "summed (falls when a rank leaves)",
                                 MetricType::Gauge);
  MetricFamily job_busy = Family("orion_job_gpu_busy_seconds",
                                 "GPU time of a job's live ranks' kernels and graphs, summed "
                                 "(falls when a rank leaves)",
                                 MetricType::Gauge);
  MetricFamily job_mem = Family("orion_job_memory_used_bytes",
                                "GPU memory allocated by a job's live ranks", MetricType::Gauge);
  MetricFamily job_beside = Family("orion_job_gpus_beside_services",
                                   "GPUs on which a job's best-effort ranks share the GPU with "
                                   "another job's high-priority clients (2 or more: a rank's "
                                   "collective spins while a peer is held for another service)",
                                   MetricType::Gauge);
  MetricFamily pod_mem = Family("orion_pod_memory_used_bytes",
                                "GPU memory allocated by a pod's live clients (pods the agent "
                                "named)",
                                MetricType::Gauge);
  for (const JobView& j : snap.jobs) {
    const std::string ns = j.ns.empty() ? kStandaloneNamespace : j.ns;
    const std::vector<ClientMetric::Label> labels = {
        {"node", node_}, {"namespace", ns}, {"orion_job", j.name}};
    for (const auto& [gpu, ranks] : j.ranks_per_gpu) {
      Add(job_ranks,
          {{"node", node_}, {"gpu", std::to_string(gpu)}, {"namespace", ns}, {"orion_job", j.name}},
          ranks);
    }
    Add(job_gpus, labels, static_cast<double>(j.ranks_per_gpu.size()));
    Add(job_held, labels, j.held_seconds);
    Add(job_busy, labels, j.busy_seconds);
    Add(job_mem, labels, static_cast<double>(j.memory_used_bytes));
    Add(job_beside, labels, static_cast<double>(j.gpus_beside_services));
  }
  for (const PodSample& p : snap.pods) {
    Add(pod_mem, {{"node", node_}, {"namespace", p.ns}, {"pod", p.pod}},
        static_cast<double>(p.memory_used));
  }

  MetricFamily regs = Family("orion_registrations_total", "Client registrations by result",
                             MetricType::Counter);
  Add(regs, {{"node", node_}, {"result", "ok"}}, static_cast<double>(snap.registrations_ok));
  for (const auto& [reason, n] : snap.registrations_failed) {
    Add(regs, {{"node", node_}, {"result", reason}}, static_cast<double>(n));
  }
  MetricFamily ingested = NodeCounter("orion_events_ingested_total",
                                      "Launch and memory events drained from client rings", node_,
                                      snap.events_ingested);
  MetricFamily written =
      NodeCounter("orion_events_written_total",
                  "Events clients wrote into their rings (claimed positions), "
                  "departed clients included; once read, each is ingested or skipped",
                  node_, snap.events_written);
  MetricFamily skipped = NodeCounter("orion_events_skipped_total",
                                     "Ring entries claimed but never published (a client killed "
                                     "mid-write), skipped by the server",
                                     node_, snap.events_skipped);
  MetricFamily node_dropped = NodeCounter("orion_events_dropped_total",
                                          "Events clients could not write because their ring was "
                                          "full, departed clients included",
                                          node_, snap.events_dropped);
  MetricFamily untabled =
      NodeCounter("orion_events_untabled_total",
                  "Kernel and graph events about functions or graphs beyond a "
                  "client's profile tables (1,024 kernels, 512 graphs a client), "
                  "counted but not profiled, departed clients included",
                  node_, snap.events_untabled);
  MetricFamily quarantined =
      NodeCounter("orion_events_quarantined_total",
                  "Events of quarantined clients (whose rings' indices were "
                  "written over repeatedly), dropped unread, departed clients "
                  "included",
                  node_, snap.events_quarantined);
  MetricFamily quarantined_clients =
      NodeCounter("orion_clients_quarantined_total",
                  "Clients whose events were quarantined (ring indices written over repeatedly)",
                  node_, snap.clients_quarantined);
  MetricFamily repairs = Family("orion_server_repairs_total",
                                "Things of the server found broken and put right while running "
                                "(what: socket-deleted, socket-replaced, gate-value: an "
                                "impossible value in a GPU's gate area, gate-claim: a "
                                "best-effort client's claim of high-priority work, ring-tail, "
                                "ring-head-rewound, ring-head-ahead: a client's ring indices "
                                "written over)",
                                MetricType::Counter);
  for (const auto& [what, n] : snap.repairs) {
    Add(repairs, {{"node", node_}, {"what", what}}, static_cast<double>(n));
  }
  MetricFamily corrections = NodeCounter("orion_board_corrections_total",
                                         "Server-owned board fields (priorities, pauses, knobs, "
                                         "header) found overwritten and put back (0 where the "
                                         "kernel seals the board against clients)",
                                         node_, snap.board_corrections);

  for (MetricFamily* f : {&clients, &busy, &hp_busy, &hp_pods, &hp_allowed, &budget, &kernels, &throttled, &mem_used,
                          &mem_limit, &dropped, &client_busy, &claims, &releases, &period, &requests,
                          &job_ranks, &job_gpus, &job_held, &job_busy, &job_mem, &job_beside, &pod_mem, &regs,
                          &ingested, &written, &skipped, &node_dropped, &untabled, &quarantined,
                          &quarantined_clients, &repairs, &corrections}) {
    out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace orion::server
