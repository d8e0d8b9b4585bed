// Job identity and grouping (see jobs.h).
#include "server/jobs.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/utf8.h"

namespace orion::server {

absl::Status CheckJobName(const std::string& name, const std::string& what) {
  if (const char* why = contract::JobNameProblem(name.data(), name.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", SanitizeUtf8(name.substr(0, 80)), "' ", why,
        " (a job name is 1 to 63 lowercase letters, digits, '-' and '.')"));
  }
  return absl::OkStatus();
}

JobIdentity PodJob(const std::string& ns, const std::string& pod_name, const std::string& job) {
  const std::string& name = job.empty() ? pod_name : job;
  return {absl::StrCat(ns, "/", name), ns, name};
}

JobIdentity UnnamedPodJob(const std::string& pod_uid) {
  std::string key = absl::StrCat("pod-", pod_uid);
  return {key, "", key};
}

JobIdentity StandaloneJob(const std::string& requested, pid_t pid, pid_t launcher) {
  if (!requested.empty()) return {requested, "", requested};
  std::string key = absl::StrCat("pid-", launcher > 0 ? launcher : pid);
  return {key, "", key};
}

std::vector<JobView> GroupJobs(const std::vector<ClientView>& clients) {
  std::map<std::string, JobView> jobs;
  for (const ClientView& c : clients) {
    if (c.exited) continue;
    auto [it, fresh] = jobs.try_emplace(c.job.key);
    JobView& j = it->second;
    if (fresh) {
      j.key = c.job.key;
      j.ns = c.job.ns;
      j.name = c.job.name;
      j.priority = c.policy.priority;
      j.paused = true;
    }
    j.mixed_priority = j.mixed_priority || j.priority != c.policy.priority;
    j.paused = j.paused && c.paused;
    ++j.ranks;
    ++j.ranks_per_gpu[c.gpu];
    if (!c.pod.empty() && std::find(j.pods.begin(), j.pods.end(), c.pod) == j.pods.end()) {
      j.pods.push_back(c.pod);
    }
    j.client_ids.push_back(c.client_id);
    j.held_seconds += static_cast<double>(c.throttled_ns) / 1e9;
    j.busy_seconds += c.gpu_busy_seconds;
    j.memory_used_bytes += c.memory_used_bytes;
  }
  // Per GPU, the jobs with a high-priority client there; then per job, the GPUs where one of its
  // best-effort ranks meets another job's.
  std::map<uint32_t, std::set<std::string>> served;
  std::map<std::string, std::set<uint32_t>> best_effort_gpus;
  for (const ClientView& c : clients) {
    if (c.exited) continue;
    if (c.policy.priority == contract::Priority::kHigh) {
      served[c.gpu].insert(c.job.key);
    } else {
      best_effort_gpus[c.job.key].insert(c.gpu);
    }
  }
  std::vector<JobView> out;
  out.reserve(jobs.size());
  for (auto& [key, j] : jobs) {
    std::sort(j.pods.begin(), j.pods.end());
    for (uint32_t gpu : best_effort_gpus[key]) {
      const auto it = served.find(gpu);
      if (it != served.end() && (it->second.size() > 1 || !it->second.contains(key))) {
        ++j.gpus_beside_services;
      }
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace orion::server
