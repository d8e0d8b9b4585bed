// List + watch of this node's pods feeding orion-server (see pod_watcher.h).
#include "agent/pod_watcher.h"

#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/json.h"

namespace orion::agent {

orion::v1::PodPolicy PolicyForPod(const PodInfo& pod, const PodSettings& settings) {
  orion::v1::PodPolicy p;
  p.set_pod_uid(pod.uid);
  p.set_namespace_(pod.namespace_name);
  p.set_name(pod.name);
  p.set_priority(settings.priority == PodPriority::kHigh ? orion::v1::PRIORITY_HIGH
                                                         : orion::v1::PRIORITY_BEST_EFFORT);
  p.set_memory_limit_bytes(settings.memory_limit_bytes);
  p.set_latency_target_us(settings.latency_target_us);
  p.set_job(settings.job);
  return p;
}

PodWatcher::PodWatcher(PodWatcherConfig config, kube::KubeApi* api, PolicySink* sink)
    : config_(std::move(config)), api_(api), sink_(sink) {}

std::string PodWatcher::resource_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resource_version_;
}

std::string PodWatcher::PodsPath() const {
  return absl::StrCat("/api/v1/pods?fieldSelector=",
                      kube::UrlEncode(absl::StrCat("spec.nodeName=", config_.node_name)));
}

void PodWatcher::Run(const std::atomic<bool>* stop) {
  bool relist = true;
  auto pause = [&] {
    for (auto waited = std::chrono::milliseconds(0); waited < config_.retry_delay && !*stop;
         waited += std::chrono::milliseconds(50)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  while (!*stop) {
    if (relist) {
      absl::Status s = Relist();
      if (!s.ok()) {
        std::fprintf(stderr, "orion-agent: pod list failed: %s\n", std::string(s.message()).c_str());
        pause();
        continue;
      }
      relist = false;
    }
    if (need_full_sync_) {
      if (!FullSync().ok()) {
        pause();
        continue;
      }
    }
    absl::Status s = Watch(stop, &relist);
    if (!s.ok()) {
      std::fprintf(stderr, "orion-agent: pod watch: %s\n", std::string(s.message()).c_str());
      pause();
    }
  }
}

absl::Status PodWatcher::Relist() {
  absl::StatusOr<kube::HttpResponse> r = api_->Get(PodsPath());
  if (!r.ok()) return r.status();
  if (r->status != 200) {
    return absl::UnavailableError(absl::StrCat("HTTP ", r->status, ": ", r->body.substr(0, 200)));
  }
  absl::StatusOr<PodList> list = ParsePodList(r->body);
  if (!list.ok()) return list.status();
  ++lists_;
  std::map<std::string, KnownPod> fresh;
  for (const PodInfo& pod : list->pods) {
    if (pod.Finished()) continue;
    const KnownPod* previous = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pods_.find(pod.uid);
      if (it != pods_.end()) previous = &it->second;
      fresh[pod.uid] = Learn(pod, previous);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pods_ = std::move(fresh);
    resource_version_ = list->resource_version;
  }
  need_full_sync_ = true;
  return FullSync();
}

absl::Status PodWatcher::FullSync() {
  std::lock_guard<std::mutex> send(send_mu_);
  return FullSyncLocked();
}

absl::Status PodWatcher::CheckServer() {
  if (!synced_.load()) return absl::OkStatus();  // Run's first list and sync come first
  std::lock_guard<std::mutex> send(send_mu_);
  absl::StatusOr<uint32_t> known = sink_->PodsKnown();
  if (!known.ok()) {
    if (known.status().code() == absl::StatusCode::kUnimplemented) return absl::OkStatus();
    need_full_sync_ = true;
    return known.status();
  }
  size_t mine = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine = pods_.size();
  }
  if (*known == mine && !need_full_sync_) return absl::OkStatus();
  std::fprintf(stderr,
               "orion-agent: orion-server knows %u pods, this node has %zu: sending them all "
               "again\n",
               *known, mine);
  ++resyncs_;
  return FullSyncLocked();
}

absl::Status PodWatcher::FullSyncLocked() {
  std::vector<orion::v1::PodPolicy> policies;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [uid, known] : pods_) policies.push_back(PolicyForPod(known.info, known.settings));
  }
  absl::Status s = sink_->Upsert(policies, /*full_sync=*/true);
  if (!s.ok()) {
    std::fprintf(stderr, "orion-agent: cannot reach orion-server: %s\n",
                 std::string(s.message()).c_str());
    need_full_sync_ = true;
    return s;
  }
  need_full_sync_ = false;
  synced_ = true;
  return s;
}

absl::Status PodWatcher::Watch(const std::atomic<bool>* stop, bool* relist) {
  const std::string path =
      absl::StrCat(PodsPath(), "&watch=1&allowWatchBookmarks=true&resourceVersion=",
                   kube::UrlEncode(resource_version()),
                   "&timeoutSeconds=", config_.watch_timeout_seconds);
  std::string error_body;
  absl::Status parse_problem;
  auto on_line = [&](std::string_view line) {
    absl::StatusOr<WatchEvent> event = ParseWatchEvent(line);
    if (!event.ok()) {
      parse_problem = event.status();
      return true;  // skip one bad line; the next ones may be fine
    }
    if (event->type == WatchEventType::kError) {
      if (event->error_code == 410) {
        *relist = true;
        std::fprintf(stderr, "orion-agent: watch expired (%s); listing again\n",
                     event->error_message.c_str());
        return false;
      }
      parse_problem = absl::UnavailableError(event->error_message);
      *relist = true;
      return false;
    }
    Apply(*event);
    return true;
  };
  absl::StatusOr<long> status = api_->Stream(path, on_line, stop, &error_body);
  if (!status.ok()) return status.status();
  if (*status == 410) {
    *relist = true;
    return absl::OkStatus();
  }
  if (*status != 200) {
    *relist = true;
    return absl::UnavailableError(absl::StrCat("watch HTTP ", *status, ": ", error_body.substr(0, 200)));
  }
  return parse_problem;
}

void PodWatcher::Apply(const WatchEvent& event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!event.pod.resource_version.empty()) resource_version_ = event.pod.resource_version;
  }
  if (event.type == WatchEventType::kBookmark) return;
  if (event.type == WatchEventType::kDeleted || event.pod.Finished()) {
    Forget(event.pod.uid);
    return;
  }
  KnownPod known;
  bool changed = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pods_.find(event.pod.uid);
    const KnownPod* previous = it == pods_.end() ? nullptr : &it->second;
    known = Learn(event.pod, previous);
    changed = previous == nullptr || !(previous->settings == known.settings);
    pods_[event.pod.uid] = known;
  }
  std::lock_guard<std::mutex> send(send_mu_);
  if (need_full_sync_) {
    (void)FullSyncLocked();
  } else if (changed) {
    if (!sink_->Upsert({PolicyForPod(known.info, known.settings)}, false).ok()) {
      need_full_sync_ = true;
    }
  }
}

void PodWatcher::Forget(const std::string& uid) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pods_.erase(uid) == 0) return;
  }
  std::lock_guard<std::mutex> send(send_mu_);
  if (need_full_sync_) {
    (void)FullSyncLocked();
  } else if (!sink_->Delete(uid).ok()) {
    need_full_sync_ = true;
  }
}

PodWatcher::KnownPod PodWatcher::Learn(const PodInfo& pod, const KnownPod* previous) {
  KnownPod known;
  known.info = pod;
  const ParsedAnnotations parsed = ParsePodAnnotations(pod.annotations, pod.labels);
  known.settings = parsed.settings;
  std::string problems;
  for (const AnnotationProblem& p : parsed.problems) problems += p.Message() + "; ";
  known.reported_problems = problems;
  if (!problems.empty() && (previous == nullptr || previous->reported_problems != problems)) {
    for (const AnnotationProblem& p : parsed.problems) {
      std::fprintf(stderr, "orion-agent: pod %s/%s: %s\n", pod.namespace_name.c_str(),
                   pod.name.c_str(), p.Message().c_str());
      RecordWarning(pod, p.Message());
    }
  }
  return known;
}

void PodWatcher::RecordWarning(const PodInfo& pod, const std::string& message) {
  const std::string now = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  const JsonValue event = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata",
       {{"generateName", absl::StrCat(pod.name, ".orion-")}, {"namespace", pod.namespace_name}}},
      {"involvedObject",
       {{"apiVersion", "v1"},
        {"kind", "Pod"},
        {"name", pod.name},
        {"namespace", pod.namespace_name},
        {"uid", pod.uid}}},
      {"reason", "InvalidOrionAnnotation"},
      {"message", message},
      {"type", "Warning"},
      {"source", {{"component", "orion-agent"}, {"host", config_.node_name}}},
      {"reportingComponent", "orion-agent"},
      {"reportingInstance", config_.node_name},
      {"firstTimestamp", now},
      {"lastTimestamp", now},
      {"count", 1},
  };
  absl::StatusOr<kube::HttpResponse> r = api_->Post(
      absl::StrCat("/api/v1/namespaces/", pod.namespace_name, "/events"), WriteJson(event));
  if (!r.ok() || (r->status != 201 && r->status != 200)) {
    std::fprintf(stderr, "orion-agent: could not record an Event on %s/%s\n",
                 pod.namespace_name.c_str(), pod.name.c_str());
  }
}

}  // namespace orion::agent
