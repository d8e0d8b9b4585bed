// Keeps orion-server's view of this node's pods current: lists the pods scheduled here, then
// watches from the list's resourceVersion (relisting on 410 Gone), parses their orion/*
// annotations and pushes the resulting policies through a PolicySink (AgentSync in production).
// A malformed annotation is logged and raised as a Warning Event on the pod, once per value;
// the pod keeps the default. Finished pods (Succeeded/Failed) are forgotten like deleted ones.
//
// Usage:
//   PodWatcher watcher({.node_name = "gpu-node-a"}, &api, &sink);
//   std::thread t([&] { watcher.Run(&stop); });
//   ... watcher.Synced() ...
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/annotations.h"
#include "kube/kube_api.h"
#include "agent/pod.h"
#include "orion/v1/agent.pb.h"

namespace orion::agent {

// Where pod policies go; AgentSyncClient sends them to orion-server.
class PolicySink {
 public:
  virtual ~PolicySink() = default;
  // full_sync: `pods` is every pod of the node; the receiver forgets the others.
  virtual absl::Status Upsert(const std::vector<orion::v1::PodPolicy>& pods, bool full_sync) = 0;
  virtual absl::Status Delete(const std::string& pod_uid) = 0;
  // How many pods the receiver knows now (it changes nothing). A receiver that knows another
  // number than the watcher has lost what it was sent (a restarted orion-server starts with none).
  virtual absl::StatusOr<uint32_t> PodsKnown() {
    return absl::UnimplementedError("this sink cannot say what it knows");
  }
};

struct PodWatcherConfig {
  std::string node_name;
  int watch_timeout_seconds = 300;           // server closes the watch; we resume from rv
  std::chrono::milliseconds retry_delay{2000};  // after API or sink errors
};

orion::v1::PodPolicy PolicyForPod(const PodInfo& pod, const PodSettings& settings);

class PodWatcher {
 public:
  PodWatcher(PodWatcherConfig config, kube::KubeApi* api, PolicySink* sink);

  // Lists and watches until *stop is set.
  void Run(const std::atomic<bool>* stop);

  // True once a list was received and its policies reached the sink.
  bool Synced() const { return synced_.load(); }
  // Lists done so far (1 + relists after 410 or errors).
  int Lists() const { return lists_.load(); }

  // Once synced: asks the sink how many pods it knows and sends every pod again where that is
  // not what the watcher has (orion-server restarted and lost the pods' priorities, or a send was
  // missed). Call it periodically from a thread other than Run's; sends never interleave.
  absl::Status CheckServer();
  // Full syncs CheckServer sent because the sink had lost pods.
  int Resyncs() const { return resyncs_.load(); }
  std::string resource_version() const;

 private:
  struct KnownPod {
    PodInfo info;
    PodSettings settings;
    std::string reported_problems;  // problems already raised as an Event, to avoid repeats
  };

  absl::Status Relist();
  // Returns when the stream ends; sets *relist on 410 Gone.
  absl::Status Watch(const std::atomic<bool>* stop, bool* relist);
  void Apply(const WatchEvent& event);
  void Forget(const std::string& uid);
  // Parses annotations, raises Events for new problems; returns the pod's entry.
  KnownPod Learn(const PodInfo& pod, const KnownPod* previous);
  absl::Status FullSync();
  absl::Status FullSyncLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  void RecordWarning(const PodInfo& pod, const std::string& message);
  std::string PodsPath() const;

  const PodWatcherConfig config_;
  kube::KubeApi* const api_;
  PolicySink* const sink_;
  mutable std::mutex mu_;
  std::map<std::string, KnownPod> pods_ ABSL_GUARDED_BY(mu_);
  std::string resource_version_ ABSL_GUARDED_BY(mu_);
  // Held around each send to the sink (and the snapshot a full sync sends): a full sync from
  // CheckServer never overtakes a newer update.
  std::mutex send_mu_;
  std::atomic<bool> need_full_sync_{true};  // the sink missed an update; resend everything
  std::atomic<bool> synced_{false};
  std::atomic<int> lists_{0};
  std::atomic<int> resyncs_{0};
};

}  // namespace orion::agent
