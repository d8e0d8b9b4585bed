// The best-effort budget of one GPU, two ways:
//  - sized to the service (SizeBudgetToService): with no latency target, the budget is a fixed
//    fraction of the high-priority service's typical busy period, between 250 us and the mode's
//    default: graph services of about 1 ms a request (busy periods of 2.6 to 3.1 ms on an H100
//    beside a trainer) get 260 to 310 us, eager ones the default;
//  - searched against a latency target (BudgetController), in the spirit of Orion's offline search
//    of `orion_hp_limit`: keep the high-priority tail (p99 of busy periods) under its target while giving
// best-effort work as much GPU time as possible. Pure logic, driven by the server's policy loop
// (about every 100 ms) and tested directly.
//
// It judges only the busy periods that ended since the budget last changed (the caller keeps
// that window): a tail over a longer window still holds periods from before the last change, and
// deciding on it again every tick halved the budget to 0 within a second, then held it there for
// as long as the window took to refill (a limit cycle between 0 and the right budget).
//   - shrink (halve) when more than 1% of them, and at least two, were over the target;
//   - grow (by a quarter, at least step_ns) when at least min_samples_to_grow of them are in and
//     no more than 1% were over headroom * target;
//   - otherwise hold, and keep collecting.
//
// Usage:
//   BudgetController c({.min_ns = 0, .max_ns = 5'000'000});
//   TailEvidence e = c.Judge(durations_since_change, n, target_ns);
//   uint64_t budget = c.Update(current_budget, c.Verdict(e));   // changed: restart the window
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace orion::server {

struct BudgetLimits {
  uint64_t min_ns = 0;
  uint64_t max_ns = 5000000;         // 5 ms
  uint64_t step_ns = 50000;          // smallest increase
  double growth = 0.25;              // increase by this fraction of the budget (at least step_ns)
  double decrease = 0.5;             // multiplicative decrease
  double headroom = 0.9;             // grow only while p99 < headroom * target
  uint32_t min_samples_to_grow = 100;  // busy periods needed to say the p99 has room
};

// What the busy periods since the budget last changed say about one client's tail.
struct TailEvidence {
  uint32_t samples = 0;        // busy periods
  uint32_t over_target = 0;    // longer than the target
  uint32_t over_headroom = 0;  // longer than headroom * target
};

// How the budget is sized to the service when no latency target is set.
struct ServiceSizing {
  // The budget as a fraction of the median busy period: a request waits behind what was queued
  // when it arrived plus what was admitted during its busy period, each at most one budget.
  double fraction = 0.1;
  // Never below this: an eager decoder's busy periods (CPU gaps past the grace) sized it to
  // 30 us on an H100 beside ResNet50 training, and its p50 went from 1.27x to 1.60x alone with
  // the trainer from 0.41x to 0.19x: each trainer kernel then ran alone, a round trip apart.
  uint64_t min_ns = 250'000;
  uint32_t min_periods = 20;    // busy periods needed before the budget moves from the default
  uint32_t window = 256;        // the newest busy periods of each client that count
  double hysteresis = 0.1;      // a change smaller than this fraction is not published
};

// The budget for a GPU's high-priority busy periods `periods_ns` (all its HP clients, newest
// ones): fraction * their median, whole microseconds, within [min_ns, max_ns] (max_ns: the mode's
// default). `current_ns` is returned when there are too few periods or the change is within the
// hysteresis.
uint64_t SizeBudgetToService(std::vector<uint64_t> periods_ns, uint64_t current_ns,
                             uint64_t max_ns, const ServiceSizing& sizing = {});

// In the order Combine ranks them: a later one wins.
enum class BudgetVerdict {
  kWait,    // too few periods to tell
  kGrow,
  kHold,    // p99 between headroom * target and target
  kShrink,
};

class BudgetController {
 public:
  explicit BudgetController(BudgetLimits limits) : limits_(limits) {}

  TailEvidence Judge(const uint64_t* durations_ns, size_t n, uint64_t target_ns) const;
  BudgetVerdict Verdict(const TailEvidence& e) const;
  // Several clients with targets on one GPU: any shrink wins, then any hold, then any grow.
  static BudgetVerdict Combine(BudgetVerdict a, BudgetVerdict b);
  uint64_t Update(uint64_t budget_ns, BudgetVerdict verdict) const;

 private:
  BudgetLimits limits_;
};

}  // namespace orion::server
