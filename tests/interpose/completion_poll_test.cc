// The completion poller's pass (interpose/completion_poll.h) with a scripted cuEventQuery: which
// records are queried, which are kept and finished, and when the poller looks again: closely
// only while somebody is held at the gate, lazily (and woken by a held thread) otherwise.
#include "interpose/completion_poll.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <memory>
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
    p.wait_in_driver = true;  // a long kernel or a graph (see AcquirePending)
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
    const uint32_t kept = PollPass(records.data(), static_cast<uint32_t>(records.size()), now_ns_,
                                   lazy_ns_, query, finish, &schedule_);
    records.resize(kept);
    return kept;
  }

  void Hold() { gate_->words.gate_waiters.store(1); }

  std::deque<PendingLaunch> pool_;
  contract::GpuState gpu_{};
  std::unique_ptr<contract::ClientSlot> slot_ = std::make_unique<contract::ClientSlot>();
  std::unique_ptr<contract::GateArea> gate_ = std::make_unique<contract::GateArea>();
  contract::SlotGate* own_ = &gate_->slots[3];
  Registration reg_{.slot = slot_.get(), .gpu = &gpu_, .gate = gate_.get(), .own_gate = own_};
  std::vector<const PendingLaunch*> queried_;
  std::map<const PendingLaunch*, CUresult> finished_;
  uint64_t now_ns_ = 10'000'000'000;
  uint64_t lazy_ns_ = kDefaultLazyPollNs;
  PollSchedule schedule_;
};

TEST_F(PollPassTest, TheNewestAndTheOldestUnfinishedRecordOfAStreamAreQueried) {
  PendingLaunch* a1 = Record(1, 10);
  PendingLaunch* a2 = Record(1, 10);
  PendingLaunch* b1 = Record(1, 20);
  PendingLaunch* a3 = Record(1, 10);
  std::vector<PendingLaunch*> records{a1, a2, b1, a3};
  // Each stream's newest first (b1 alone in its stream is queried once), then the oldest.
  EXPECT_EQ(Pass(records, {b1}), 3u);
  EXPECT_EQ(queried_, (std::vector<const PendingLaunch*>{a3, b1, a1}));
  EXPECT_EQ(records, (std::vector<PendingLaunch*>{a1, a2, a3}));  // submission order kept
  EXPECT_EQ(finished_.size(), 1u);
  EXPECT_EQ(finished_.count(b1), 1u);
  // Once the oldest is done, the next of that stream is queried in the same pass; the newest's
  // answer is not asked twice.
  EXPECT_EQ(Pass(records, {a1, a2}), 1u);
  EXPECT_EQ(queried_, (std::vector<const PendingLaunch*>{a3, a1, a2}));
  EXPECT_EQ(records, (std::vector<PendingLaunch*>{a3}));
}

// An eager request leaves hundreds of records on one stream: when its newest is done, one query
// retires them all, in submission order.
TEST_F(PollPassTest, ADoneNewestRecordRetiresItsStreamWithOneQuery) {
  std::vector<PendingLaunch*> records;
  for (int i = 0; i < 200; ++i) records.push_back(Record(1, 10));
  PendingLaunch* other = Record(1, 20);
  records.insert(records.begin() + 50, other);
  PendingLaunch* newest = records.back();
  EXPECT_EQ(Pass(records, {newest}), 1u);
  EXPECT_EQ(queried_, (std::vector<const PendingLaunch*>{newest, other}));
  EXPECT_EQ(finished_.size(), 200u);
  EXPECT_EQ(records, (std::vector<PendingLaunch*>{other}));
  for (const auto& [p, status] : finished_) EXPECT_EQ(status, CUDA_SUCCESS);
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

TEST_F(PollPassTest, KeptRecordsAreStampedPendingAtThePass) {
  PendingLaunch* a1 = Record(1, 10);
  PendingLaunch* a2 = Record(1, 10);  // behind a1: kept without a query, still known pending
  std::vector<PendingLaunch*> records{a1, a2};
  Pass(records, {});
  EXPECT_EQ(a1->pending_at_ns, now_ns_);
  EXPECT_EQ(a2->pending_at_ns, now_ns_);
}

TEST_F(PollPassTest, PastItsGraceTheNewestHighPriorityRecordIsWaitedForInTheDriver) {
  gpu_.hp_grace_ns.store(500'000);
  PendingLaunch* a1 = Record(1, 10);
  PendingLaunch* a2 = Record(1, 10);
  std::vector<PendingLaunch*> records{a1, a2};
  for (bool held : {false, true}) {
    gate_->words.gate_waiters.store(held ? 1 : 0);
    Pass(records, {});
    EXPECT_EQ(schedule_.wait_for, a2) << held;
    EXPECT_EQ(schedule_.lazy_gate, nullptr);
  }
  // A best-effort record that needs a close look (somebody held) wins: no wait in the driver.
  PendingLaunch* charged = Record(1, 20);
  charged->high_priority = false;
  charged->budget_ns = 1000;
  records.push_back(charged);
  Pass(records, {});
  EXPECT_EQ(schedule_.wait_for, nullptr);
  EXPECT_EQ(schedule_.sleep_ns, kBestEffortPollNs);
}

// Short followed kernels complete with plain events (a blocking-sync one wakes the driver's event
// thread at every completion): past the grace they are looked at every kHighPriorityPollNs, and
// never waited for in the driver, even where a long one of the same client is.
TEST_F(PollPassTest, PastItsGraceShortHighPriorityRecordsArePolledNotWaitedFor) {
  gpu_.hp_grace_ns.store(500'000);
  PendingLaunch* a1 = Record(1, 10);
  a1->wait_in_driver = false;
  std::vector<PendingLaunch*> records{a1};
  Pass(records, {});
  EXPECT_EQ(schedule_.wait_for, nullptr);
  EXPECT_EQ(schedule_.sleep_ns, kHighPriorityPollNs);
  EXPECT_EQ(schedule_.lazy_gate, nullptr);
  PendingLaunch* a2 = Record(1, 10);  // a long one behind it
  records.push_back(a2);
  Pass(records, {});
  EXPECT_EQ(schedule_.wait_for, nullptr);  // a close look is due anyway
  EXPECT_EQ(schedule_.sleep_ns, kHighPriorityPollNs);
  Pass(records, {a1});
  EXPECT_EQ(schedule_.wait_for, a2);  // only the long one left: asleep in the driver
}

TEST_F(PollPassTest, WaitingForARecordFinishesTheEarlierOnesOfItsStream) {
  PendingLaunch* a1 = Record(1, 10);
  PendingLaunch* b1 = Record(1, 20);
  PendingLaunch* a2 = Record(1, 10);
  PendingLaunch* a3 = Record(1, 10);  // after the one waited for: not known complete
  PendingLaunch* t1 = Record(1, 0, /*ordered=*/false);
  std::vector<PendingLaunch*> records{a1, b1, a2, a3, t1};
  auto finish = [&](PendingLaunch* p, CUresult status) { finished_[p] = status; };
  uint32_t kept = FinishThrough(records.data(), 5, a2, CUDA_SUCCESS, finish);
  records.resize(kept);
  EXPECT_EQ(records, (std::vector<PendingLaunch*>{b1, a3, t1}));
  EXPECT_EQ(finished_.count(a1) + finished_.count(a2), 2u);
  // An unordered record completes alone.
  PendingLaunch* t2 = Record(1, 0, /*ordered=*/false);
  records.push_back(t2);
  finished_.clear();
  kept = FinishThrough(records.data(), static_cast<uint32_t>(records.size()), t2,
                       CUDA_ERROR_CONTEXT_IS_DESTROYED, finish);
  EXPECT_EQ(kept, 3u);
  ASSERT_EQ(finished_.size(), 1u);
  EXPECT_EQ(finished_[t2], CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

TEST_F(PollPassTest, InsideItsGraceAHighPriorityClientIsNotPolled) {
  // Busy until the grace after its last launch has run out, whatever completes: look then.
  Hold();
  gpu_.hp_grace_ns.store(500'000);
  own_->last_progress_ns.store(now_ns_ - 100'000);
  std::vector<PendingLaunch*> records{Record(1, 10)};
  Pass(records, {});
  EXPECT_EQ(schedule_.sleep_ns, 400'000u);
  EXPECT_EQ(schedule_.lazy_gate, nullptr);
  own_->last_progress_ns.store(now_ns_ - 495'000);  // never closer than the closest poll
  Pass(records, {});
  EXPECT_EQ(schedule_.sleep_ns, kBestEffortPollNs);
}

TEST_F(PollPassTest, NobodyHeldMeansALazyPollThatAHeldThreadCanEnd) {
  gpu_.hp_grace_ns.store(500'000);
  PendingLaunch* charged = Record(1, 20);
  charged->high_priority = false;
  charged->budget_ns = 300'000;
  PendingLaunch* timed = Record(1, 30);
  timed->high_priority = false;
  timed->timed = true;
  std::vector<PendingLaunch*> records{charged, timed};
  Pass(records, {});
  EXPECT_EQ(schedule_.sleep_ns, kDefaultLazyPollNs);
  EXPECT_EQ(schedule_.lazy_gate, gate_.get());
  EXPECT_EQ(schedule_.wait_for, nullptr);
  // The lazy period is the process's (ORION_LAZY_POLL_MS), and a held thread still ends it.
  lazy_ns_ = 200'000'000;
  Pass(records, {});
  EXPECT_EQ(schedule_.sleep_ns, 200'000'000u);
  EXPECT_EQ(schedule_.lazy_gate, gate_.get());
  Hold();
  Pass(records, {});
  EXPECT_EQ(schedule_.sleep_ns, kBestEffortPollNs);
  EXPECT_EQ(schedule_.lazy_gate, nullptr);
  gate_->words.gate_waiters.store(0);
  // A high-priority client inside its grace is looked at when the grace ends.
  own_->last_progress_ns.store(now_ns_ - 100'000);
  records.push_back(Record(1, 10));
  Pass(records, {});
  EXPECT_EQ(schedule_.sleep_ns, 400'000u);
  EXPECT_EQ(schedule_.lazy_gate, nullptr);
  EXPECT_EQ(schedule_.wait_for, nullptr);
}

TEST_F(PollPassTest, BudgetChargesAndTimedSamplesArePolledCloselyWhileSomebodyIsHeld) {
  Hold();
  gpu_.hp_grace_ns.store(500'000);
  PendingLaunch* hp = Record(1, 10);
  PendingLaunch* charged = Record(1, 20);
  charged->high_priority = false;
  charged->budget_ns = 300'000;
  std::vector<PendingLaunch*> records{hp, charged};
  Pass(records, {});
  EXPECT_EQ(schedule_.sleep_ns, kBestEffortPollNs);
  PendingLaunch* timed = Record(1, 30);
  timed->timed = true;
  records = {hp, timed};
  Pass(records, {});
  EXPECT_EQ(schedule_.sleep_ns, kBestEffortPollNs);
}

}  // namespace
}  // namespace orion::interpose
