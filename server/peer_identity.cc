// SO_PEERCRED + /proc/<pid>/cgroup parsing (see peer_identity.h).
#include "server/peer_identity.h"

#include <sys/socket.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace orion::server {
namespace {

bool IsHex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// Pod UIDs are 8-4-4-4-12 hex; the systemd cgroup driver writes '_' for '-'.
std::string FindPodUid(absl::string_view path) {
  size_t pos = 0;
  while ((pos = path.find("pod", pos)) != absl::string_view::npos) {
    pos += 3;
    std::string uid;
    size_t i = pos;
    while (i < path.size() && (IsHex(path[i]) || path[i] == '-' || path[i] == '_')) {
      uid.push_back(path[i] == '_' ? '-' : path[i]);
      ++i;
    }
    if (uid.size() == 36 && uid[8] == '-' && uid[13] == '-' && uid[18] == '-' && uid[23] == '-') {
      return uid;
    }
  }
  return {};
}

// The container id is the last run of 64 hex digits in the path (after docker-, cri-containerd-,
// crio- prefixes or as a bare directory name).
std::string FindContainerId(absl::string_view path) {
  std::string best;
  size_t i = 0;
  while (i < path.size()) {
    if (!IsHex(path[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < path.size() && IsHex(path[j])) ++j;
    if (j - i == 64) best = std::string(path.substr(i, 64));
    i = j;
  }
  return best;
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

CgroupIdentity ParseCgroupFile(const std::string& text) {
  CgroupIdentity id;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    // "hierarchy-ID:controllers:path"; the path may itself contain ':'.
    const size_t first = line.find(':');
    if (first == absl::string_view::npos) continue;
    const size_t second = line.find(':', first + 1);
    if (second == absl::string_view::npos) continue;
    const absl::string_view path = line.substr(second + 1);
    if (id.pod_uid.empty()) id.pod_uid = FindPodUid(path);
    if (id.container_id.empty()) id.container_id = FindContainerId(path);
    if (!id.pod_uid.empty() && !id.container_id.empty()) break;
  }
  return id;
}

PeerIdentity IdentifyPid(pid_t pid, uid_t uid, gid_t gid, const std::string& proc_root) {
  PeerIdentity id;
  id.pid = pid;
  id.uid = uid;
  id.gid = gid;
  const std::string base = absl::StrCat(proc_root, "/", pid);
  id.process_name = std::string(absl::StripTrailingAsciiWhitespace(ReadSmallFile(base + "/comm")));
  id.cgroup = ParseCgroupFile(ReadSmallFile(base + "/cgroup"));
  return id;
}

absl::StatusOr<PeerIdentity> IdentifyPeer(int fd, const std::string& proc_root) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(absl::StrCat("SO_PEERCRED failed: ", std::strerror(errno)));
  }
  if (cred.pid <= 0) {
    return absl::FailedPreconditionError(
        "peer has no pid in this PID namespace (is the server in the host PID namespace?)");
  }
  return IdentifyPid(cred.pid, cred.uid, cred.gid, proc_root);
}

}  // namespace orion::server
