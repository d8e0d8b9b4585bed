// Simulated applications for the policy simulation (tests/policy): a latency-sensitive inference
// service (high priority) and a training loop (best effort), each driving one SimClient on the
// virtual clock. All randomness comes from a seeded std::mt19937_64 per application, so the same
// seed gives the same arrivals and kernel durations whether or not other clients run beside it.
//
// Usage:
//   HpService svc(hp_client, HpWorkload{}, /*seed=*/1);
//   svc.Start(t0, t_end, /*measure_from=*/t0 + 500 * kMs);
//   BeTrainer trainer(be_client, TrainerWorkload{}, /*seed=*/2);
//   trainer.Start(t0);
//   node.RunUntil(t_end);
//   Percentile(svc.Latencies(node.now()), 0.99);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/policy/sim_node.h"

namespace orion::policy_sim {

// Nearest-rank percentile (q in (0, 1]); 0 for no samples.
inline uint64_t Percentile(std::vector<uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

inline double Ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// A request = `kernels` kernels launched one after the other: the service waits for each kernel
// (a synchronize, as code with data-dependent control flow does) and spends a short CPU gap
// before the next launch, so the GPU drains between the kernels of one request. Requests arrive
// as a Poisson process and are served one at a time, first come first served.
struct HpWorkload {
  double requests_per_s = 300;
  int kernels = 4;
  uint64_t kernel_min_ns = 150 * kUs;  // each kernel's nominal duration, drawn once per kernel
  uint64_t kernel_max_ns = 250 * kUs;
  double jitter = 0.05;                // per launch, uniform +-5% around the nominal duration
  uint64_t gap_min_ns = 20 * kUs;      // CPU time between a kernel's end and the next launch
  uint64_t gap_max_ns = 60 * kUs;
  uint32_t blocks = 264;
};

class HpService {
 public:
  HpService(SimClient* client, HpWorkload w, uint64_t seed)
      : client_(client), w_(w), rng_(seed) {
    std::uniform_int_distribution<uint64_t> d(w_.kernel_min_ns, w_.kernel_max_ns);
    for (int i = 0; i < w_.kernels; ++i) {
      specs_.push_back(KernelSpec{0x1000u + static_cast<uint64_t>(i),
                                  "infer_conv_fprop_" + std::to_string(i), d(rng_), w_.blocks});
    }
  }

  // Requests arrive in [from_ns, until_ns); latencies count for arrivals at or after measure_from.
  void Start(uint64_t from_ns, uint64_t until_ns, uint64_t measure_from_ns) {
    until_ns_ = until_ns;
    measure_from_ns_ = measure_from_ns;
    ScheduleArrival(from_ns);
  }

  // From hang_at_ns on, the process hangs right after its next kernel launch: mid-request, with
  // that kernel counted in slot.inflight and never reported complete.
  void HangAfterLaunchAt(uint64_t hang_at_ns) { hang_at_ns_ = hang_at_ns; }
  uint64_t hung_at_ns() const { return hung_at_ns_; }

  // Latencies (arrival -> end of the request's last kernel) of measured requests. Requests still
  // unfinished count with their age at `now_ns` (a lower bound), so a queue that grows without
  // end cannot hide from the tail.
  // [arrived_from_ns, arrived_until_ns) narrows them to the requests that arrived then.
  std::vector<uint64_t> Latencies(uint64_t now_ns, uint64_t arrived_from_ns = 0,
                                  uint64_t arrived_until_ns = UINT64_MAX) const {
    const uint64_t from = std::max(measure_from_ns_, arrived_from_ns);
    std::vector<uint64_t> out;
    for (const auto& [arrival, latency] : done_) {
      if (arrival >= from && arrival < arrived_until_ns) out.push_back(latency);
    }
    for (uint64_t a : queue_) {
      if (a >= from && a < arrived_until_ns && now_ns > a) out.push_back(now_ns - a);
    }
    return out;
  }
  uint64_t completed() const { return completed_; }

 private:
  EventLoop& loop() { return client_->loop(); }

  void ScheduleArrival(uint64_t t_ns) {
    if (t_ns >= until_ns_) return;
    loop().At(t_ns, [this] {
      queue_.push_back(loop().now());
      if (!serving_) StartRequest();
      std::exponential_distribution<double> gap(w_.requests_per_s);
      ScheduleArrival(loop().now() + static_cast<uint64_t>(gap(rng_) * 1e9));
    });
  }

  void StartRequest() {
    if (queue_.empty() || client_->frozen()) {
      serving_ = false;
      return;
    }
    serving_ = true;
    kernel_index_ = 0;
    LaunchNext();
  }

  void LaunchNext() {
    KernelSpec k = specs_[kernel_index_];
    std::uniform_real_distribution<double> j(1.0 - w_.jitter, 1.0 + w_.jitter);
    k.duration_ns = static_cast<uint64_t>(static_cast<double>(k.duration_ns) * j(rng_));
    client_->Launch(
        k,
        [this] {
          if (hang_at_ns_ != 0 && hung_at_ns_ == 0 && loop().now() >= hang_at_ns_) {
            hung_at_ns_ = loop().now();
            client_->Freeze();
          }
        },
        [this] { KernelDone(); });
  }

  void KernelDone() {
    if (++kernel_index_ < w_.kernels) {
      loop().After(Gap(), [this] { LaunchNext(); });
      return;
    }
    const uint64_t arrival = queue_.front();
    queue_.pop_front();
    ++completed_;
    if (arrival >= measure_from_ns_) done_.emplace_back(arrival, loop().now() - arrival);
    // Next request (if any) after the same CPU gap.
    loop().After(Gap(), [this] { StartRequest(); });
  }

  uint64_t Gap() {
    std::uniform_int_distribution<uint64_t> d(w_.gap_min_ns, w_.gap_max_ns);
    return d(rng_);
  }

  SimClient* client_;
  HpWorkload w_;
  std::mt19937_64 rng_;
  std::vector<KernelSpec> specs_;
  std::deque<uint64_t> queue_;  // arrival times, the first one in service
  bool serving_ = false;
  int kernel_index_ = 0;
  uint64_t until_ns_ = 0, measure_from_ns_ = 0;
  uint64_t hang_at_ns_ = 0, hung_at_ns_ = 0;
  uint64_t completed_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> done_;  // (arrival, latency)
};

// A training loop: each step launches long kernels (1-3 ms, many blocks: GEMMs) alternating with
// small ones (tens of us, few blocks: elementwise), without waiting for them (a short CPU gap
// between launches), then synchronizes at the step's end and spends a CPU gap before the next.
struct TrainerWorkload {
  int long_kernels = 8;
  uint64_t long_min_ns = 1 * kMs;
  uint64_t long_max_ns = 3 * kMs;
  uint32_t long_blocks = 2048;  // grid sizes matter in MPS mode only (sm_threshold, when set)
  int small_kernels = 8;
  uint64_t small_min_ns = 40 * kUs;
  uint64_t small_max_ns = 100 * kUs;
  uint32_t small_blocks = 64;
  double jitter = 0.05;
  uint64_t launch_gap_ns = 8 * kUs;
  uint64_t step_gap_ns = 200 * kUs;
};

class BeTrainer {
 public:
  BeTrainer(SimClient* client, TrainerWorkload w, uint64_t seed)
      : client_(client), w_(w), rng_(seed) {
    std::uniform_int_distribution<uint64_t> dl(w_.long_min_ns, w_.long_max_ns);
    std::uniform_int_distribution<uint64_t> ds(w_.small_min_ns, w_.small_max_ns);
    const int n = std::max(w_.long_kernels, w_.small_kernels);
    for (int i = 0; i < n; ++i) {
      if (i < w_.long_kernels) {
        specs_.push_back(KernelSpec{0x7000u + static_cast<uint64_t>(i),
                                    "sm90_xmma_gemm_train_" + std::to_string(i), dl(rng_),
                                    w_.long_blocks});
        max_kernel_ns_ = std::max(max_kernel_ns_, specs_.back().duration_ns);
      }
      if (i < w_.small_kernels) {
        specs_.push_back(KernelSpec{0x7800u + static_cast<uint64_t>(i),
                                    "vectorized_elementwise_train_" + std::to_string(i), ds(rng_),
                                    w_.small_blocks});
      }
    }
    max_kernel_ns_ = static_cast<uint64_t>(static_cast<double>(max_kernel_ns_) * (1 + w_.jitter));
  }

  void Start(uint64_t at_ns) {
    LoopOf().At(at_ns, [this] { Next(); });
  }

  // GPU time of this trainer's kernels that ended in [from_ns, to_ns).
  uint64_t WorkDone(uint64_t from_ns, uint64_t to_ns) const {
    uint64_t sum = 0;
    for (const auto& [end, dur] : completions_) {
      if (end >= from_ns && end < to_ns) sum += dur;
    }
    return sum;
  }
  // Its share of the GPU in [from_ns, to_ns).
  double Share(uint64_t from_ns, uint64_t to_ns) const {
    return static_cast<double>(WorkDone(from_ns, to_ns)) / static_cast<double>(to_ns - from_ns);
  }
  uint64_t steps() const { return steps_; }
  uint64_t max_kernel_ns() const { return max_kernel_ns_; }

 private:
  EventLoop& LoopOf() { return client_->loop(); }

  void Next() {
    if (client_->frozen()) return;
    if (index_ == specs_.size()) {
      step_end_ = true;
      if (outstanding_ == 0) EndStep();
      return;
    }
    KernelSpec k = specs_[index_++];
    std::uniform_real_distribution<double> j(1.0 - w_.jitter, 1.0 + w_.jitter);
    k.duration_ns = static_cast<uint64_t>(static_cast<double>(k.duration_ns) * j(rng_));
    const uint64_t dur = k.duration_ns;
    client_->Launch(
        k,
        [this] {
          ++outstanding_;
          LoopOf().After(w_.launch_gap_ns, [this] { Next(); });
        },
        [this, dur] {
          --outstanding_;
          completions_.emplace_back(LoopOf().now(), dur);
          if (step_end_ && outstanding_ == 0) EndStep();
        });
  }

  void EndStep() {
    step_end_ = false;
    index_ = 0;
    ++steps_;
    LoopOf().After(w_.step_gap_ns, [this] { Next(); });
  }

  SimClient* client_;
  TrainerWorkload w_;
  std::mt19937_64 rng_;
  std::vector<KernelSpec> specs_;
  size_t index_ = 0;
  int outstanding_ = 0;
  bool step_end_ = false;
  uint64_t steps_ = 0;
  uint64_t max_kernel_ns_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> completions_;  // (end, duration)
};

}  // namespace orion::policy_sim
