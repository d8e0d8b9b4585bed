// Jobs: the ranks of one pod, of one job in a namespace (orion/job, JobSet, Kubeflow: the agent
// names it) and of one standalone launcher are grouped as one job; job-wide pause and priority
// act on every rank and nothing else; ListJobs and PauseJob over a real gRPC channel; the job
// and per-pod series in /metrics.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "orion/v1/admin.grpc.pb.h"
#include "prometheus/text_serializer.h"
#include "server/admin_mapping.h"
#include "server/jobs.h"
#include "server/metrics.h"
#include "server/node_state.h"
#include "tests/http_get.h"
#include "tests/server/test_server.h"

namespace orion::server {
namespace {

using contract::Priority;
using contract::RegisterStatus;

constexpr char kRank0[] = "aaaaaaaa-1111-2222-3333-444444444444";  // training/llama-0
constexpr char kRank1[] = "bbbbbbbb-1111-2222-3333-444444444444";  // training/llama-1
constexpr char kAlone[] = "cccccccc-1111-2222-3333-444444444444";  // training/notebook
constexpr char kOther[] = "dddddddd-1111-2222-3333-444444444444";  // research/llama-0

PodPolicy Pod(const char* uid, const char* ns, const char* name, const char* job) {
  PodPolicy p;
  p.pod_uid = uid;
  p.ns = ns;
  p.name = name;
  p.job = job;
  return p;
}

const JobView* Find(const std::vector<JobView>& jobs, const std::string& key) {
  auto it = std::find_if(jobs.begin(), jobs.end(), [&](const JobView& j) { return j.key == key; });
  return it == jobs.end() ? nullptr : &*it;
}

class JobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = testing::TestConfig(testing::MakeTempDir());
    auto board = NodeBoard::Create();
    ASSERT_TRUE(board.ok());
    state_ = std::make_unique<NodeState>(cfg_, std::move(*board));
    ASSERT_TRUE(state_
                    ->UpsertPods({Pod(kRank0, "training", "llama-0", "llama"),
                                  Pod(kRank1, "training", "llama-1", "llama"),
                                  Pod(kAlone, "training", "notebook", ""),
                                  Pod(kOther, "research", "llama-0", "llama")},
                                 /*full_sync=*/true)
                    .ok());
  }
  // A client of a pod (uid) or, with uid empty, a standalone one with this parent pid.
  uint32_t Register(const char* uid, int gpu, pid_t ppid = 0, const char* job = "") {
    PeerIdentity peer = IdentifyPid(getpid(), 1000, 1000, "/proc");
    peer.cgroup.pod_uid = uid;
    if (ppid != 0) peer.launcher_pid = ppid;
    auto req = testing::MakeRequest(cfg_.gpus[gpu].c_str(), Priority::kBestEffort);
    std::snprintf(req.requested_job, sizeof(req.requested_job), "%s", job);
    const NodeState::Admission a = state_->Register(peer, req);
    EXPECT_EQ(a.status, RegisterStatus::kOk) << a.message;
    slots_[a.client_id] = a.slot;
    return a.client_id;
  }
  const contract::ClientSlot& Slot(uint32_t id) { return state_->board().board().slots[slots_[id]]; }

  ServerConfig cfg_;
  std::unique_ptr<NodeState> state_;
  std::map<uint32_t, uint32_t> slots_;
};

TEST(JobIdentityTest, NamesAreScopedByNamespaceAndChecked) {
  EXPECT_EQ(PodJob("training", "llama-0", "llama").key, "training/llama");
  EXPECT_EQ(PodJob("training", "notebook", "").key, "training/notebook");  // the pod alone
  EXPECT_EQ(PodJob("research", "llama-0", "llama").key, "research/llama");
  EXPECT_EQ(UnnamedPodJob(kRank0).key, std::string("pod-") + kRank0);
  EXPECT_EQ(StandaloneJob("bench", 10, 9).key, "bench");
  EXPECT_EQ(StandaloneJob("", 10, 9).key, "pid-9");
  EXPECT_EQ(StandaloneJob("", 10, 0).key, "pid-10");  // no launcher (a shell, init)
  EXPECT_TRUE(CheckJobName("llama-3.1-ft", "orion/job").ok());
  for (const char* bad : {"", "Llama", "a/b", "-x", "x-", "has space",
                          "a234567890123456789012345678901234567890123456789012345678901234"}) {
    const absl::Status s = CheckJobName(bad, "orion/job");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("orion/job"), absl::string_view::npos) << s;
  }
}

// The parent is a launcher of ranks unless it is init or starts unrelated programs (a shell).
TEST(JobIdentityTest, AShellIsNoLauncher) {
  const std::string root = testing::MakeTempDir();
  auto write = [&](int pid, const std::string& file, const std::string& text) {
    mkdir((root + "/" + std::to_string(pid)).c_str(), 0755);
    std::ofstream(root + "/" + std::to_string(pid) + "/" + file) << text;
  };
  write(300, "stat", "300 (python3) S 200 300 100 0 -1 4194560 0 0 0 0");
  write(200, "comm", "torchrun\n");
  EXPECT_EQ(IdentifyPid(300, 1000, 1000, root).launcher_pid, 200);
  write(200, "comm", "bash\n");
  EXPECT_EQ(IdentifyPid(300, 1000, 1000, root).launcher_pid, 0);
  write(301, "stat", "301 (a (b) c) S 1 301 100 0 -1 4194560 0 0 0 0");
  EXPECT_EQ(IdentifyPid(301, 1000, 1000, root).launcher_pid, 0);  // init
}

TEST(JobIdentityTest, TheAgentsJobIsCheckedOnTheWire) {
  orion::v1::UpsertPodsRequest r;
  auto* p = r.add_pods();
  p->set_pod_uid(kRank0);
  p->set_namespace_("training");
  p->set_name("llama-0");
  p->set_priority(orion::v1::PRIORITY_BEST_EFFORT);
  p->set_job("llama");
  absl::StatusOr<std::vector<PodPolicy>> pods = PodsFromProto(r);
  ASSERT_TRUE(pods.ok()) << pods.status();
  EXPECT_EQ((*pods)[0].job, "llama");
  p->set_job("../other-namespace/llama");
  pods = PodsFromProto(r);
  ASSERT_FALSE(pods.ok());
  EXPECT_NE(pods.status().message().find("pods[0].job (training/llama-0)"), absl::string_view::npos)
      << pods.status();
}

TEST_F(JobsTest, RanksOfOneJobGroupAndNamespacesStayApart) {
  const uint32_t a0 = Register(kRank0, 0), a1 = Register(kRank0, 1), b = Register(kRank1, 1);
  const uint32_t alone = Register(kAlone, 0), other = Register(kOther, 0);
  const std::vector<JobView> jobs = state_->ListJobs("");
  ASSERT_EQ(jobs.size(), 3u);
  const JobView* llama = Find(jobs, "training/llama");
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->ns, "training");
  EXPECT_EQ(llama->name, "llama");
  EXPECT_EQ(llama->ranks, 3u);
  EXPECT_EQ(llama->ranks_per_gpu, (std::map<uint32_t, uint32_t>{{0, 1}, {1, 2}}));
  EXPECT_EQ(llama->pods, (std::vector<std::string>{"llama-0", "llama-1"}));
  EXPECT_EQ(llama->client_ids, (std::vector<uint32_t>{a0, a1, b}));
  const JobView* notebook = Find(jobs, "training/notebook");
  ASSERT_NE(notebook, nullptr);
  EXPECT_EQ(notebook->client_ids, (std::vector<uint32_t>{alone}));
  // Same job name in another namespace: another job.
  const JobView* research = Find(jobs, "research/llama");
  ASSERT_NE(research, nullptr);
  EXPECT_EQ(research->client_ids, (std::vector<uint32_t>{other}));
  EXPECT_EQ(state_->ListJobs("research").size(), 1u);
  EXPECT_EQ(state_->GetClient(b)->job.key, "training/llama");
  // A process in a pod cannot name its job: its ORION_JOB is ignored.
  const uint32_t claims = Register(kAlone, 0, 0, "llama");
  EXPECT_EQ(state_->GetClient(claims)->job.key, "training/notebook");
  state_->Unregister(claims);

  // The agent drops the pod's job (annotation removed): the pod is its own job again.
  ASSERT_TRUE(state_->UpsertPods({Pod(kRank1, "training", "llama-1", "")}, false).ok());
  EXPECT_EQ(state_->GetClient(b)->job.key, "training/llama-1");
  EXPECT_EQ(Find(state_->ListJobs("training"), "training/llama")->ranks, 2u);
}

TEST_F(JobsTest, StandaloneRanksOfOneLauncherAreOneJob) {
  const uint32_t r0 = Register("", 0, 4242), r1 = Register("", 1, 4242);
  const uint32_t lone = Register("", 0, 4343);
  const uint32_t named = Register("", 1, 4343, "bench");
  EXPECT_EQ(state_->GetClient(r0)->job.key, "pid-4242");
  EXPECT_EQ(state_->GetClient(r1)->job.key, "pid-4242");
  EXPECT_EQ(state_->GetClient(lone)->job.key, "pid-4343");  // its launcher's, alone or not
  EXPECT_EQ(state_->GetClient(named)->job.key, "bench");
  const std::vector<JobView> jobs = state_->ListJobs("");
  const JobView* launcher = Find(jobs, "pid-4242");
  ASSERT_NE(launcher, nullptr);
  EXPECT_EQ(launcher->ranks, 2u);
  EXPECT_EQ(launcher->ranks_per_gpu, (std::map<uint32_t, uint32_t>{{0, 1}, {1, 1}}));
  EXPECT_TRUE(launcher->ns.empty());
  // A name that is not a job name is ignored (and said on stderr), never half-used.
  ::testing::internal::CaptureStderr();
  const uint32_t bad = Register("", 0, 4444, "Not/A/Job");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("ORION_JOB 'Not/A/Job'"), std::string::npos) << log;
  EXPECT_EQ(state_->GetClient(bad)->job.key, "pid-4444");
  // Nor is another process's job key taken: pid-<pid> and pod-<uid> are reserved.
  pid_t next_launcher = 4545;  // one each: alone, a process is its own job
  for (const char* taken : {"pid-4242", "pod-0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab"}) {
    ::testing::internal::CaptureStderr();
    const pid_t launcher = next_launcher++;
    const uint32_t posing = Register("", 1, launcher, taken);
    const std::string said = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(said.find("is reserved"), std::string::npos) << said;
    EXPECT_EQ(state_->GetClient(posing)->job.key, absl::StrCat("pid-", launcher)) << taken;
  }
}

// What a client writes into its counters is bounded once, in its view: memory to
// kMaxShownMemoryBytes, so two ranks writing half of 2^64 cannot wrap the job's or the pod's sum
// to a few bytes (hiding what they hold), and held time to the client's life.
TEST_F(JobsTest, ClientWrittenCountersCannotWrapAJobsSums) {
  ASSERT_TRUE(state_->UpsertPods({Pod(kRank0, "training", "llama-0", "llama")}, false).ok());
  const uint32_t a = Register(kRank0, 0), b = Register(kRank0, 1);
  for (uint32_t id : {a, b}) {
    auto& counters = state_->board().area(slots_[id])->counters;
    counters.memory_used_bytes.store((uint64_t{1} << 63) + 1);
    counters.memory_peak_bytes.store(~uint64_t{0});
    counters.throttled_ns.store(~uint64_t{0} - 5);
  }
  const ClientView view = *state_->GetClient(a);
  EXPECT_EQ(view.memory_used_bytes, kMaxShownMemoryBytes);
  EXPECT_EQ(view.memory_peak_bytes, kMaxShownMemoryBytes);
  EXPECT_LT(view.throttled_ns, uint64_t{60} * 1'000'000'000) << "more held than it has lived";
  const std::vector<JobView> jobs = state_->ListJobs("training");
  const JobView* job = Find(jobs, "training/llama");
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->memory_used_bytes, 2 * kMaxShownMemoryBytes);
  EXPECT_LT(job->held_seconds, 120.0);
  const MetricsSnapshot snap = state_->Snapshot();
  ASSERT_EQ(snap.pods.size(), 1u);
  EXPECT_EQ(snap.pods[0].memory_used, 2 * kMaxShownMemoryBytes);
}

// A standalone rank's job key is fixed when it registers: the ranks of one launcher are one job
// from the first, so a pause taken while one rank ran holds the ranks that come after it, and
// one rank leaving does not move the others to another key (a new rank then escaped the pause).
TEST_F(JobsTest, AStandaloneJobsKeyHoldsAsRanksComeAndGo) {
  const uint32_t first = Register("", 0, 4242);
  const std::string key = state_->GetClient(first)->job.key;
  EXPECT_EQ(key, "pid-4242");
  ASSERT_TRUE(state_->SetJobPaused(key, true).ok());
  const uint32_t second = Register("", 1, 4242);
  EXPECT_EQ(state_->GetClient(second)->job.key, key);
  EXPECT_NE(Slot(second).paused.load(), 0u) << "a rank that joins a paused job starts paused";
  state_->Unregister(first);
  EXPECT_EQ(state_->GetClient(second)->job.key, key);
  const uint32_t third = Register("", 0, 4242);
  EXPECT_NE(Slot(third).paused.load(), 0u) << "a rank after another left is still held";
  const std::vector<JobView> jobs = state_->ListJobs("");
  const JobView* job = Find(jobs, key);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->ranks, 2u);
  EXPECT_TRUE(job->paused);
}

TEST_F(JobsTest, PauseAndPriorityActOnEveryRankOfTheJobAndNothingElse) {
  const uint32_t a0 = Register(kRank0, 0), a1 = Register(kRank0, 1), b = Register(kRank1, 1);
  const uint32_t alone = Register(kAlone, 1), other = Register(kOther, 0);
  absl::StatusOr<JobView> paused = state_->SetJobPaused("training/llama", true);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_TRUE(paused->paused);
  EXPECT_EQ(paused->ranks, 3u);
  for (uint32_t id : {a0, a1, b}) {
    EXPECT_TRUE(state_->GetClient(id)->paused) << id;
    EXPECT_EQ(Slot(id).paused.load(), 1u) << id;
  }
  for (uint32_t id : {alone, other}) {
    EXPECT_FALSE(state_->GetClient(id)->paused) << id;
    EXPECT_EQ(Slot(id).paused.load(), 0u) << id;
  }
  // A rank restarted while the job is paused starts paused.
  const uint32_t late = Register(kRank1, 0);
  EXPECT_TRUE(state_->GetClient(late)->paused);
  EXPECT_EQ(Slot(late).paused.load(), 1u);

  absl::StatusOr<std::vector<ClientView>> high = state_->SetJobPriority("training/llama", Priority::kHigh);
  ASSERT_TRUE(high.ok()) << high.status();
  EXPECT_EQ(high->size(), 4u);
  for (uint32_t id : {a0, a1, b, late}) {
    EXPECT_EQ(state_->GetClient(id)->policy.priority, Priority::kHigh) << id;
    EXPECT_EQ(state_->GetClient(id)->policy.source, "admin") << id;
    EXPECT_EQ(Slot(id).priority.load(), static_cast<uint32_t>(Priority::kHigh)) << id;
  }
  for (uint32_t id : {alone, other}) {
    EXPECT_EQ(state_->GetClient(id)->policy.priority, Priority::kBestEffort) << id;
  }
  // A pod resync does not undo the job's override.
  ASSERT_TRUE(state_->UpsertPods({Pod(kRank0, "training", "llama-0", "llama")}, false).ok());
  EXPECT_EQ(state_->GetClient(a0)->policy.priority, Priority::kHigh);
  EXPECT_EQ(state_->ListJobs("training").front().priority, Priority::kHigh);

  absl::StatusOr<JobView> resumed = state_->SetJobPaused("training/llama", false);
  ASSERT_TRUE(resumed.ok());
  EXPECT_FALSE(resumed->paused);
  for (uint32_t id : {a0, a1, b, late}) EXPECT_EQ(Slot(id).paused.load(), 0u) << id;

  const absl::StatusOr<JobView> missing = state_->SetJobPaused("training/gpt", true);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no job 'training/gpt'"), absl::string_view::npos);
  EXPECT_EQ(state_->SetJobPriority("llama", Priority::kHigh).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobsTest, AJobsActionsEndWithItsLastRank) {
  const uint32_t a0 = Register(kRank0, 0);
  ASSERT_TRUE(state_->SetJobPaused("training/llama", true).ok());
  ASSERT_TRUE(state_->SetJobPriority("training/llama", Priority::kHigh).ok());
  state_->Unregister(a0);
  const uint32_t again = Register(kRank0, 0);  // a new run of the job
  EXPECT_FALSE(state_->GetClient(again)->paused);
  EXPECT_EQ(state_->GetClient(again)->policy.priority, Priority::kBestEffort);
}

TEST_F(JobsTest, SnapshotHasLiveJobsAndPodsOnly) {
  Register(kRank0, 0);
  Register(kRank0, 1);
  const uint32_t b = Register(kRank1, 1);
  MetricsSnapshot snap = state_->Snapshot();
  ASSERT_EQ(snap.jobs.size(), 1u);
  EXPECT_EQ(snap.jobs[0].ns, "training");
  EXPECT_EQ(snap.jobs[0].name, "llama");
  EXPECT_EQ(snap.jobs[0].ranks_per_gpu, (std::map<uint32_t, uint32_t>{{0, 1}, {1, 2}}));
  EXPECT_EQ(snap.pods.size(), 2u);
  // Per-pod memory, summed over the pod's clients.
  for (const auto& [id, slot] : slots_) {
    state_->board().area(slot)->counters.memory_used_bytes.store(id == b ? 1 << 20 : 2 << 20);
  }
  const std::string text =
      prometheus::TextSerializer().Serialize(MetricsCollector(state_.get(), "n").Collect());
  for (const char* want :
       {"orion_pod_memory_used_bytes{node=\"n\",namespace=\"training\",pod=\"llama-0\"} 4194304",
        "orion_pod_memory_used_bytes{node=\"n\",namespace=\"training\",pod=\"llama-1\"} 1048576",
        "orion_job_memory_used_bytes{node=\"n\",namespace=\"training\",orion_job=\"llama\"} 5242880",
        "orion_job_ranks{node=\"n\",gpu=\"1\",namespace=\"training\",orion_job=\"llama\"} 2"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\n" << text;
  }
  state_->Unregister(b);
  snap = state_->Snapshot();
  EXPECT_EQ(snap.pods.size(), 1u);
  EXPECT_EQ(snap.jobs[0].ranks_per_gpu, (std::map<uint32_t, uint32_t>{{0, 1}, {1, 1}}));
}

// A job's gpus_beside_services counts the GPUs where its best-effort ranks meet another job's
// high-priority clients (never its own), in ListJobs, the snapshot and /metrics, and over the
// admin API's mapping.
TEST_F(JobsTest, GpusBesideServicesCountsOtherJobsServicesWhereItsBestEffortRanksRun) {
  Register(kRank0, 0);
  Register(kRank0, 1);
  Register(kRank1, 1);
  const uint32_t notebook = Register(kAlone, 0);
  Register(kOther, 1);
  auto beside = [&](const char* key) {
    const std::vector<JobView> jobs = state_->ListJobs("");
    const JobView* j = Find(jobs, key);
    return j == nullptr ? 99u : j->gpus_beside_services;
  };
  EXPECT_EQ(beside("training/llama"), 0u);  // nothing high priority yet
  ASSERT_TRUE(state_->SetJobPriority("training/notebook", Priority::kHigh).ok());
  EXPECT_EQ(beside("training/llama"), 1u);   // GPU 0
  EXPECT_EQ(beside("research/llama"), 0u);   // GPU 1 has no service yet
  EXPECT_EQ(beside("training/notebook"), 0u);  // no best-effort ranks
  ASSERT_TRUE(state_->SetJobPriority("research/llama", Priority::kHigh).ok());
  EXPECT_EQ(beside("training/llama"), 2u);   // a service on each of its GPUs

  const std::string text =
      prometheus::TextSerializer().Serialize(MetricsCollector(state_.get(), "n").Collect());
  for (const char* want :
       {"orion_job_gpus_beside_services{node=\"n\",namespace=\"training\",orion_job=\"llama\"} 2",
        "orion_job_gpus_beside_services{node=\"n\",namespace=\"research\",orion_job=\"llama\"} 0"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\n" << text;
  }
  orion::v1::Job proto;
  const std::vector<JobView> jobs = state_->ListJobs("");
  ASSERT_NE(Find(jobs, "training/llama"), nullptr);
  ToProto(*Find(jobs, "training/llama"), &proto);
  EXPECT_EQ(proto.gpus_beside_services(), 2u);
  // PauseJob's answer counts them too (the job grouped with every client, not its ranks alone).
  const absl::StatusOr<JobView> paused = state_->SetJobPaused("training/llama", true);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->gpus_beside_services, 2u);
  EXPECT_TRUE(paused->paused);
  ASSERT_TRUE(state_->SetJobPaused("training/llama", false).ok());

  // Its own high-priority ranks are no service beside it; a service that leaves stops counting.
  ASSERT_TRUE(state_->SetJobPriority("training/llama", Priority::kHigh).ok());
  EXPECT_EQ(beside("training/llama"), 0u);
  ASSERT_TRUE(state_->SetJobPriority("training/llama", Priority::kBestEffort).ok());
  state_->Unregister(notebook);
  EXPECT_EQ(beside("training/llama"), 1u);
}

// Over a real gRPC channel: clients registered through the socket (orion-run --job's channel).
class JobsApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = testing::TestConfig(testing::MakeTempDir());
    server_ = testing::StartServer(cfg_);
    ASSERT_NE(server_, nullptr);
    admin_ = orion::v1::Admin::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->admin_port()), grpc::InsecureChannelCredentials()));
  }
  int Register(int gpu, const char* job, contract::RegisterReply* reply,
               testing::ClientMaps* maps = nullptr) {
    auto req = testing::MakeRequest(cfg_.gpus[gpu].c_str(), Priority::kBestEffort);
    std::snprintf(req.requested_job, sizeof(req.requested_job), "%s", job);
    return testing::RegisterClient(cfg_.socket_path, req, reply, maps);
  }
  ServerConfig cfg_;
  std::unique_ptr<OrionServer> server_;
  std::unique_ptr<orion::v1::Admin::Stub> admin_;
};

TEST_F(JobsApiTest, ListJobsPauseJobAndJobPriorityOverGrpc) {
  contract::RegisterReply r0{}, r1{}, s0{};
  testing::ClientMaps m0;
  const int f0 = Register(0, "train", &r0, &m0), f1 = Register(1, "train", &r1);
  const int f2 = Register(0, "serve", &s0);
  ASSERT_GE(f0, 0);
  ASSERT_GE(f1, 0);
  ASSERT_GE(f2, 0);
  ASSERT_NE(m0.area, nullptr);
  m0.area->counters.memory_used_bytes.store(3 << 20);

  grpc::ClientContext c1;
  orion::v1::ListJobsResponse jobs;
  ASSERT_TRUE(admin_->ListJobs(&c1, {}, &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 2);
  const orion::v1::Job& serve = jobs.jobs(0);
  const orion::v1::Job& train = jobs.jobs(1);
  EXPECT_EQ(serve.key(), "serve");
  EXPECT_EQ(train.key(), "train");
  EXPECT_EQ(train.ranks(), 2u);
  ASSERT_EQ(train.gpus_size(), 2);
  EXPECT_EQ(train.gpus(1), 1u);
  EXPECT_EQ(train.memory_used_bytes(), 3u << 20);
  EXPECT_EQ(train.priority(), orion::v1::PRIORITY_BEST_EFFORT);

  grpc::ClientContext c2;
  orion::v1::JobRequest jr;
  jr.set_job("train");
  orion::v1::Job paused;
  ASSERT_TRUE(admin_->PauseJob(&c2, jr, &paused).ok());
  EXPECT_TRUE(paused.paused());
  const auto& slots = server_->state().board().board().slots;
  EXPECT_EQ(slots[r0.slot].paused.load(), 1u);
  EXPECT_EQ(slots[r1.slot].paused.load(), 1u);
  EXPECT_EQ(slots[s0.slot].paused.load(), 0u);

  grpc::ClientContext c3;
  orion::v1::SetPriorityRequest sp;
  sp.set_job("train");
  sp.set_priority(orion::v1::PRIORITY_HIGH);
  orion::v1::SetPriorityResponse spr;
  ASSERT_TRUE(admin_->SetPriority(&c3, sp, &spr).ok());
  EXPECT_EQ(spr.clients_size(), 2);
  EXPECT_EQ(slots[r1.slot].priority.load(), static_cast<uint32_t>(Priority::kHigh));
  EXPECT_EQ(slots[s0.slot].priority.load(), static_cast<uint32_t>(Priority::kBestEffort));

  grpc::ClientContext c4;
  ASSERT_TRUE(admin_->ResumeJob(&c4, jr, &paused).ok());
  EXPECT_FALSE(paused.paused());
  EXPECT_EQ(slots[r0.slot].paused.load(), 0u);

  grpc::ClientContext c5;
  jr.set_job("nope");
  const grpc::Status missing = admin_->PauseJob(&c5, jr, &paused);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(missing.error_message().find("ListJobs"), std::string::npos);

  grpc::ClientContext c6;
  orion::v1::GetClientRequest gc;
  gc.set_client_id(r0.client_id);
  orion::v1::Client client;
  ASSERT_TRUE(admin_->GetClient(&c6, gc, &client).ok());
  EXPECT_EQ(client.job(), "train");

  // The job and per-job series in /metrics, gone with the job.
  std::string text = orion::testing::HttpGet(server_->metrics_port(), "/metrics");
  for (const char* want :
       {"orion_job_ranks{node=\"test-node\",gpu=\"1\",namespace=\"_standalone\",orion_job=\"train\"} 1",
        "orion_job_gpus{node=\"test-node\",namespace=\"_standalone\",orion_job=\"train\"} 2",
        "orion_job_memory_used_bytes{node=\"test-node\",namespace=\"_standalone\",orion_job=\"train\"} 3145728",
        "orion_job_held_seconds{node=\"test-node\",namespace=\"_standalone\",orion_job=\"serve\"}",
        "orion_job_gpu_busy_seconds{"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\n" << text;
  }
  close(f0);
  close(f1);
  ASSERT_TRUE(testing::WaitFor([&] {
    return orion::testing::HttpGet(server_->metrics_port(), "/metrics").find("orion_job=\"train\"") ==
           std::string::npos;
  }));
  close(f2);
}

}  // namespace
}  // namespace orion::server
