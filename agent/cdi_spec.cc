// CDI specs of prepared DRA claims (see cdi_spec.h).
#include "agent/cdi_spec.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "contract/orion_contract.h"

namespace orion::agent {
namespace {

// 2500 -> "2.5", 5000 -> "5": what ParseLatencyTargetMs reads back.
std::string MillisecondsText(uint64_t us) {
  std::string text = std::to_string(us / 1000);
  if (us % 1000 == 0) return text;
  std::string fraction = std::to_string(1000 + us % 1000).substr(1);
  while (fraction.back() == '0') fraction.pop_back();
  return absl::StrCat(text, ".", fraction);
}

}  // namespace

bool ValidClaimUid(std::string_view uid) {
  if (uid.empty() || uid.size() > 64) return false;
  for (char c : uid) {
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string ClaimCdiDeviceId(std::string_view claim_uid) {
  return absl::StrCat(kClaimCdiKind, "=", std::string(claim_uid));
}

std::string ClaimCdiFileName(std::string_view claim_uid) {
  return absl::StrCat("gpu-share.orion.io-claim_", std::string(claim_uid), ".json");
}

ClaimCdi ClaimCdiSpec(std::string_view claim_uid, const std::vector<std::string>& gpu_uuids,
                      const PodSettings& settings, ContainerLayout layout) {
  // Under DRA the kubelet passes CDI devices to the runtime itself (CRI CDIDevices): both CDI
  // strategies become that one.
  if (layout.device_list == DeviceListStrategy::kCdiAnnotations) {
    layout.device_list = DeviceListStrategy::kCdiCri;
  }
  const v1beta1::ContainerAllocateResponse allocation = ContainerAllocationForGpus(gpu_uuids, layout);
  ClaimCdi out;
  out.device_ids.push_back(ClaimCdiDeviceId(claim_uid));
  for (const auto& d : allocation.cdi_devices()) out.device_ids.push_back(d.name());

  std::map<std::string, std::string> env(allocation.envs().begin(), allocation.envs().end());
  env[contract::kEnvPriority] = std::string(PriorityName(settings.priority));
  if (settings.memory_limit_bytes > 0) {
    env[contract::kEnvMemoryLimit] = std::to_string(settings.memory_limit_bytes);
  }
  if (settings.latency_target_us > 0) {
    env[contract::kEnvLatencyTargetMs] = MillisecondsText(settings.latency_target_us);
  }
  JsonValue edits = JsonValue::object();
  JsonValue& env_list = edits["env"] = JsonValue::array();
  for (const auto& [key, value] : env) env_list.push_back(absl::StrCat(key, "=", value));
  JsonValue& mounts = edits["mounts"] = JsonValue::array();
  for (const v1beta1::Mount& m : allocation.mounts()) {
    JsonValue options = JsonValue::array();
    options.push_back(m.read_only() ? "ro" : "rw");
    options.push_back("nosuid");
    options.push_back("nodev");
    options.push_back("rbind");
    mounts.push_back({{"hostPath", m.host_path()},
                      {"containerPath", m.container_path()},
                      {"type", "bind"},
                      {"options", std::move(options)}});
  }
  out.spec = {{"cdiVersion", kCdiVersion},
              {"kind", kClaimCdiKind},
              {"devices", JsonValue::array({{{"name", std::string(claim_uid)},
                                             {"containerEdits", std::move(edits)}}})}};
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view content) {
  // The temporary file is created, never opened: O_EXCL refuses a name that exists (a planted
  // symlink, a file left by a crash of an earlier agent with the same PID) and O_NOFOLLOW a
  // symlink in its last component, so nothing but a new file of ours is written. The first
  // name is <path>.tmp.<pid>; when it exists the next ones add a random suffix.
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = -1;
  constexpr int kTries = 16;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    if (attempt > 0) {
      uint64_t suffix = 0;
      if (getrandom(&suffix, sizeof(suffix), 0) != static_cast<ssize_t>(sizeof(suffix))) {
        suffix = static_cast<uint64_t>(time(nullptr)) * 1000003u + static_cast<uint64_t>(attempt);
      }
      tmp = absl::StrCat(path, ".tmp.", getpid(), ".", absl::Hex(suffix, absl::kZeroPad16));
    }
    fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) break;
    std::fprintf(stderr, "orion-agent: %s exists (left by a crash, or planted); not following "
                 "or reusing it, trying another name\n", tmp.c_str());
  }
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create a temporary file beside ", path, " (last tried ", tmp, "): ",
        errno == EEXIST ? absl::StrCat("all of ", kTries, " names exist") : std::strerror(errno)));
  }
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = fsync(fd) == 0;
  close(fd);
  if (!synced || rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace orion::agent
