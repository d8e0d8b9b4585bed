// Test double for the policy simulation (tests/policy): a virtual clock with a discrete-event
// queue, and a model of time-sliced GPUs. Nothing here sleeps or reads a real clock, so a run is
// a pure function of its parameters and seeds and takes milliseconds of real time.
//
// The GPU model (SimGpuModel), kept deliberately simple:
//  - one instance per board GPU index;
//  - kernels of different processes never overlap (time-slicing without MPS: contexts of
//    different processes do not run kernels together);
//  - each client's kernels run in its launch order (one stream per client), and when several
//    clients have queued work the GPU takes the kernel launched first, like one FIFO hardware
//    queue. A client FIFO per process plus "oldest launch first" is the same as one FIFO over
//    all launches, which is what is implemented;
//  - no preemption: a kernel that started runs to its end (a real GPU may preempt at a time
//    slice of a few ms; not modelled), and no context-switch cost;
//  - the same rule as tests/cuda_double's simulated GPU ("run one at a time in launch order").
//
// Usage:
//   EventLoop loop(1'000'000'000);
//   SimGpuModel gpu(&loop);
//   gpu.Submit(client, 200'000, [](uint64_t start_ns, uint64_t end_ns) { ... });
//   loop.RunUntil(2'000'000'000);
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <utility>
#include <vector>

namespace orion::policy_sim {

// Events on a virtual clock in nanoseconds. Events due at the same instant run in the order they
// were scheduled, so runs are deterministic.
class EventLoop {
 public:
  explicit EventLoop(uint64_t start_ns) : now_(start_ns) {}
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  uint64_t now() const { return now_; }
  uint64_t events_run() const { return events_; }

  // Schedules fn at t_ns (an instant in the past means now).
  void At(uint64_t t_ns, std::function<void()> fn) {
    queue_.push(Item{std::max(t_ns, now_), next_seq_++, std::move(fn)});
  }
  void After(uint64_t delay_ns, std::function<void()> fn) { At(now_ + delay_ns, std::move(fn)); }

  // Runs after every event: lets waiters notice shared words that the event changed (the
  // simulation's stand-in for FUTEX_WAKE, see SimNode).
  void SetAfterEach(std::function<void()> fn) { after_each_ = std::move(fn); }

  // Runs every event due at or before t_ns, then leaves the clock at t_ns.
  void RunUntil(uint64_t t_ns) {
    while (!queue_.empty() && queue_.top().t <= t_ns) {
      // The comparator reads only t and seq, which a move leaves intact.
      Item item = std::move(const_cast<Item&>(queue_.top()));
      queue_.pop();
      now_ = item.t;
      item.fn();
      ++events_;
      if (after_each_) after_each_();
    }
    now_ = std::max(now_, t_ns);
  }

 private:
  struct Item {
    uint64_t t;
    uint64_t seq;
    std::function<void()> fn;
  };
  struct Later {
    bool operator()(const Item& a, const Item& b) const {
      return a.t != b.t ? a.t > b.t : a.seq > b.seq;
    }
  };
  uint64_t now_;
  uint64_t next_seq_ = 0;
  uint64_t events_ = 0;
  std::priority_queue<Item, std::vector<Item>, Later> queue_;
  std::function<void()> after_each_;
};

// One time-sliced GPU (see the file comment for the rules).
class SimGpuModel {
 public:
  explicit SimGpuModel(EventLoop* loop) : loop_(loop) {}
  SimGpuModel(const SimGpuModel&) = delete;
  SimGpuModel& operator=(const SimGpuModel&) = delete;

  // Queues a kernel of `client` that runs for duration_ns once it reaches the GPU;
  // on_done(start_ns, end_ns) runs at the instant it ends.
  void Submit(uint32_t client, uint64_t duration_ns,
              std::function<void(uint64_t, uint64_t)> on_done) {
    fifo_.push_back(Kernel{client, duration_ns, std::move(on_done)});
    if (!running_) StartNext();
  }

  // GPU time spent on `client`'s kernels so far (counted when a kernel ends).
  uint64_t busy_ns(uint32_t client) const {
    auto it = busy_.find(client);
    return it == busy_.end() ? 0 : it->second;
  }
  size_t queued() const { return fifo_.size() + (running_ ? 1 : 0); }

 private:
  struct Kernel {
    uint32_t client;
    uint64_t duration_ns;
    std::function<void(uint64_t, uint64_t)> on_done;
    uint64_t start_ns = 0;
  };

  void StartNext() {
    if (fifo_.empty()) {
      running_ = false;
      return;
    }
    running_ = true;
    auto k = std::make_shared<Kernel>(std::move(fifo_.front()));
    fifo_.pop_front();
    k->start_ns = loop_->now();
    loop_->After(k->duration_ns, [this, k] {
      busy_[k->client] += k->duration_ns;
      const uint64_t end = loop_->now();
      // The next kernel starts at this instant, before anyone reacts to this one's end.
      StartNext();
      k->on_done(k->start_ns, end);
    });
  }

  EventLoop* loop_;
  std::deque<Kernel> fifo_;
  bool running_ = false;
  std::map<uint32_t, uint64_t> busy_;
};

}  // namespace orion::policy_sim
