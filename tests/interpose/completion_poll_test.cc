// The completion poller's pass (interpose/completion_poll.h) with a scripted cuEventQuery: which
// records are queried, which are kept and finished, and how often a pass runs.
#include "interpose/completion_poll.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <vector>

namespace orion::interpose {
namespace {

class PollPassTest : public ::testing::Test {
 protected:
  PendingLaunch* Record(uintptr_t ctx, uint64_t stream, bool ordered = true) {
    auto& p = pool_.emplace_back();
    p.ctx = reinterpret_cast<CUcontext>(ctx);
    p.stream = stream;
    p.ordered = ordered;
    p.high_priority = true;
    p.reg = &reg_;
    return &p;
  }
  // Runs one pass; `ready` lists the records whose event has completed, `status` overrides.
  uint32_t Pass(std::vector<PendingLaunch*>& records, const std::vector<PendingLaunch*>& ready,
                CUresult done_status = CUDA_SUCCESS) {
    queried_.clear();
    finished_.clear();
    auto query = [&](const PendingLaunch& p) {
      queried_.push_back(&p);
      for (const PendingLaunch* r : ready) {
        if (r == &p) return done_status;
      }
      return CUDA_ERROR_NOT_READY;
    };
    auto finish = [&](PendingLaunch* p, CUresult status) { finished_[p] = status; };
    const uint32_t kept = PollPass(records.data(), static_cast<uint32_t>(records.size()), query,
                                   finish, &poll_ns_);
    records.resize(kept);
    return kept;
  }

  std::deque<PendingLaunch> pool_;
  contract::GpuState gpu_{};
  Registration reg_{.gpu = &gpu_};
  std::vector<const PendingLaunch*> queried_;
  std::map<const PendingLaunch*, CUresult> finished_;
  uint64_t poll_ns_ = 0;
};

TEST_F(PollPassTest, OnlyTheOldestUnfinishedRecordOfAStreamIsQueried) {
  PendingLaunch* a1 = Record(1, 10);
  PendingLaunch* a2 = Record(1, 10);
  PendingLaunch* b1 = Record(1, 20);
  PendingLaunch* a3 = Record(1, 10);
  std::vector<PendingLaunch*> records{a1, a2, b1, a3};
  EXPECT_EQ(Pass(records, {b1}), 3u);
  EXPECT_EQ(queried_, (std::vector<const PendingLaunch*>{a1, b1}));
  EXPECT_EQ(records, (std::vector<PendingLaunch*>{a1, a2, a3}));  // submission order kept
  EXPECT_EQ(finished_.size(), 1u);
  EXPECT_EQ(finished_.count(b1), 1u);
  // Once the oldest is done, the next of that stream is queried in the same pass.
  EXPECT_EQ(Pass(records, {a1, a2}), 1u);
  EXPECT_EQ(queried_, (std::vector<const PendingLaunch*>{a1, a2, a3}));
  EXPECT_EQ(records, (std::vector<PendingLaunch*>{a3}));
}

TEST_F(PollPassTest, SameStreamHandleInAnotherContextIsAnotherStream) {
  PendingLaunch* first = Record(1, 10);
  PendingLaunch* other_ctx = Record(2, 10);
  std::vector<PendingLaunch*> records{first, other_ctx};
  EXPECT_EQ(Pass(records, {other_ctx}), 1u);
  EXPECT_EQ(queried_.size(), 2u);
  EXPECT_EQ(finished_.count(other_ctx), 1u);
}

TEST_F(PollPassTest, PerThreadDefaultStreamRecordsAreQueriedOneByOne) {
  // One handle, several threads' streams: no order between them.
  PendingLaunch* t1 = Record(1, 0, /*ordered=*/false);
  PendingLaunch* t2 = Record(1, 0, /*ordered=*/false);
  std::vector<PendingLaunch*> records{t1, t2};
  EXPECT_EQ(Pass(records, {t2}), 1u);
  EXPECT_EQ(queried_.size(), 2u);
  EXPECT_EQ(records, (std::vector<PendingLaunch*>{t1}));
}

TEST_F(PollPassTest, AnErrorEndsTrackingWithItsStatus) {
  PendingLaunch* p = Record(1, 10);
  std::vector<PendingLaunch*> records{p};
  EXPECT_EQ(Pass(records, {p}, CUDA_ERROR_CONTEXT_IS_DESTROYED), 0u);
  ASSERT_EQ(finished_.count(p), 1u);
  EXPECT_EQ(finished_[p], CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

TEST_F(PollPassTest, HighPriorityRecordsArePolledAtAFifthOfTheGrace) {
  std::vector<PendingLaunch*> records{Record(1, 10)};
  gpu_.hp_grace_ns.store(500'000);
  Pass(records, {});
  EXPECT_EQ(poll_ns_, 100'000u);
  gpu_.hp_grace_ns.store(200'000);
  Pass(records, {});
  EXPECT_EQ(poll_ns_, 40'000u);
  gpu_.hp_grace_ns.store(0);  // no grace: follow completions closely
  Pass(records, {});
  EXPECT_EQ(poll_ns_, kBestEffortPollNs);
  gpu_.hp_grace_ns.store(50'000'000);
  Pass(records, {});
  EXPECT_EQ(poll_ns_, kHighPriorityPollMaxNs);
}

TEST_F(PollPassTest, BudgetChargesAndTimedSamplesArePolledClosely) {
  gpu_.hp_grace_ns.store(500'000);
  PendingLaunch* hp = Record(1, 10);
  PendingLaunch* charged = Record(1, 20);
  charged->high_priority = false;
  charged->budget_ns = 300'000;
  std::vector<PendingLaunch*> records{hp, charged};
  Pass(records, {});
  EXPECT_EQ(poll_ns_, kBestEffortPollNs);
  PendingLaunch* timed = Record(1, 30);
  timed->timed = true;
  records = {hp, timed};
  Pass(records, {});
  EXPECT_EQ(poll_ns_, kBestEffortPollNs);
}

}  // namespace
}  // namespace orion::interpose
