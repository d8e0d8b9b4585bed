// SO_PEERCRED + /proc/<pid>/cgroup parsing, and pinning a peer with a pidfd (see peer_identity.h).
#include "server/peer_identity.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace orion::server {
namespace {

bool IsHex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// 8-4-4-4-12 hex digits with `sep` between the groups.
bool IsUid(absl::string_view s, char sep) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != sep : !IsHex(s[i])) return false;
  }
  return true;
}

// The pod UID if `c` is named as a kubelet pod cgroup: cgroupfs "pod<uid>", or systemd
// "<...>kubepods[-burstable|-besteffort]-pod<uid with _>.slice". Where it sits: PlacedByKubelet.
std::string PodUidOf(absl::string_view c) {
  if (absl::ConsumePrefix(&c, "pod")) return IsUid(c, '-') ? std::string(c) : std::string();
  if (!absl::ConsumeSuffix(&c, ".slice")) return {};
  const size_t at = c.rfind("-pod");
  if (at == absl::string_view::npos) return {};
  const absl::string_view prefix = c.substr(0, at);
  const absl::string_view uid = c.substr(at + 4);
  if (!IsUid(uid, '_')) return {};
  if (!absl::EndsWith(prefix, "kubepods") && !absl::EndsWith(prefix, "kubepods-burstable") &&
      !absl::EndsWith(prefix, "kubepods-besteffort")) {
    return {};
  }
  std::string out(uid);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

// A cgroup of a user's own subtree, where systemd lets the user make any cgroup under any name
// (user.slice, user-1000.slice, user@1000.service).
bool UserSubtree(absl::string_view c) {
  return c == "user.slice" || (absl::StartsWith(c, "user-") && absl::EndsWith(c, ".slice")) ||
         (absl::StartsWith(c, "user@") && absl::EndsWith(c, ".service"));
}

// Whether parts[first, i) shows the kubelet's `chain` of cgroups above a pod's: a cgroup
// namespace's ".." run may cut its top off (the path is then that chain's tail), and a kubelet
// cgroup root (`--cgroup-root`, a kind node's container) may sit above the whole chain, but no
// user's subtree.
bool ChainAbove(const std::vector<absl::string_view>& parts, size_t first, size_t i,
                const std::vector<std::string>& chain) {
  const size_t above = i - first;
  const size_t shown = std::min(above, chain.size());
  for (size_t k = 0; k < shown; ++k) {
    if (parts[i - shown + k] != chain[chain.size() - shown + k]) return false;
  }
  for (size_t k = first; k < i - shown; ++k) {
    if (UserSubtree(parts[k])) return false;
  }
  return above <= chain.size() || shown == chain.size();
}

// Whether the pod cgroup parts[i] (PodUidOf matched it) sits where the kubelet puts it: right
// below the kubelet's own cgroups (cgroupfs: kubepods, then the QoS class; systemd: the slices its
// name nests in, a-b-pod<uid>.slice in a-b.slice in a.slice). A user of the node may name cgroups
// of its own subtree (user@1000.service/...) as a pod's: such a path is no pod.
bool PlacedByKubelet(const std::vector<absl::string_view>& parts, size_t i) {
  size_t first = 0;
  while (first < i && parts[first] == "..") ++first;
  absl::string_view name = parts[i];
  if (absl::ConsumeSuffix(&name, ".slice")) {
    const absl::string_view prefix = name.substr(0, name.rfind("-pod"));
    std::vector<std::string> chain;
    for (size_t dash = prefix.find('-');; dash = prefix.find('-', dash + 1)) {
      chain.push_back(absl::StrCat(prefix.substr(0, dash), ".slice"));
      if (dash == absl::string_view::npos) break;
    }
    return ChainAbove(parts, first, i, chain);
  }
  // cgroupfs: the QoS class is not in the pod's name; the guaranteed class has none. A pod folder
  // at the root, below neither the chain nor a "..", is none of the kubelet's.
  if (i == 0) return false;
  const absl::string_view parent = i > first ? parts[i - 1] : absl::string_view();
  if (parent == "burstable" || parent == "besteffort") {
    return ChainAbove(parts, first, i, {"kubepods", std::string(parent)});
  }
  return ChainAbove(parts, first, i, {"kubepods"});
}

// The container id if `c` is a container's cgroup below a pod's: "<id>" or "crio-<id>"
// (cgroupfs), "<runtime>-<id>.scope" (systemd). Anything else (e.g. crio-conmon-<id>.scope, the
// monitor process) is not a container.
std::string ContainerIdOf(absl::string_view c) {
  absl::ConsumeSuffix(&c, ".scope");
  for (absl::string_view prefix : {"cri-containerd-", "crio-", "docker-"}) {
    if (absl::ConsumePrefix(&c, prefix)) break;
  }
  if (c.size() != 64) return {};
  for (char ch : c) {
    if (!IsHex(ch)) return {};
  }
  return std::string(c);
}

// Outside pods: the last run of 64 hex digits (docker-<id>.scope, /docker/<id>).
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

// A path that a reader would take for a pod's: worth a log line when it is not recognised.
bool LooksLikePod(absl::string_view path) {
  return absl::StrContains(path, "kubepods") || absl::StrContains(path, "/pod") ||
         absl::StrContains(path, "-pod");
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parents that start unrelated programs rather than ranks of one job (by comm).
bool IsSessionParent(const std::string& comm) {
  static constexpr const char* kSessionParents[] = {
      "sh",   "bash", "dash",  "zsh",  "ksh",   "mksh",    "fish",    "tcsh", "csh",
      "sudo", "su",   "login", "sshd", "tmux: server", "screen", "systemd", "init"};
  for (const char* p : kSessionParents) {
    if (comm == p) return true;
  }
  return false;
}

// The fields of /proc/<pid>/stat after the command (fields[0] is field 3, the state); empty
// if the process is gone.
std::vector<std::string> StatFields(pid_t pid, const std::string& proc_root) {
  const std::string stat = ReadSmallFile(absl::StrCat(proc_root, "/", pid, "/stat"));
  const size_t paren = stat.rfind(')');  // comm may hold spaces and parentheses
  if (paren == std::string::npos) return {};
  return absl::StrSplit(absl::string_view(stat).substr(paren + 1), ' ', absl::SkipEmpty());
}

}  // namespace

CgroupIdentity ParseCgroupFile(const std::string& text) {
  CgroupIdentity id;
  std::string first_path;  // the unified (v2) line's path if there is one, else the first
  std::string container_outside;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    // "hierarchy-ID:controllers:path"; the path may itself contain ':'.
    const size_t first = line.find(':');
    if (first == absl::string_view::npos) continue;
    const size_t second = line.find(':', first + 1);
    if (second == absl::string_view::npos) continue;
    const absl::string_view path = line.substr(second + 1);
    if (path.empty()) continue;
    if (first_path.empty() || line.substr(0, second) == "0:") first_path = std::string(path);
    std::vector<absl::string_view> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
    for (size_t i = 0; i < parts.size(); ++i) {
      std::string uid = PodUidOf(parts[i]);
      if (uid.empty() || !PlacedByKubelet(parts, i)) continue;
      id.pod_uid = std::move(uid);
      if (i + 1 < parts.size()) id.container_id = ContainerIdOf(parts[i + 1]);
      return id;
    }
    if (container_outside.empty()) container_outside = FindContainerId(path);
  }
  id.container_id = container_outside;
  if (first_path.empty()) {
    id.reason = "not in a pod: no cgroup path";
  } else if (LooksLikePod(first_path)) {
    id.reason = absl::StrCat("not in a pod: cgroup path ", first_path,
                             " is not a kubelet pod layout (cgroupfs .../kubepods/[qos/]pod<uid>/"
                             "<id> or systemd ...kubepods[-qos]-pod<uid>.slice/<runtime>-<id>.scope)");
  } else {
    id.reason = absl::StrCat("not in a pod: cgroup path ", first_path);
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
  char exe[4096];
  const ssize_t n = ::readlink((base + "/exe").c_str(), exe, sizeof(exe) - 1);
  if (n > 0) id.exe.assign(exe, static_cast<size_t>(n));
  id.cgroup = ParseCgroupFile(ReadSmallFile(base + "/cgroup"));
  if (const std::vector<std::string> stat = StatFields(pid, proc_root); stat.size() > 1) {
    int ppid = 0;
    if (absl::SimpleAtoi(stat[1], &ppid) && ppid > 1) {
      const std::string parent(absl::StripTrailingAsciiWhitespace(
          ReadSmallFile(absl::StrCat(proc_root, "/", ppid, "/comm"))));
      if (!parent.empty() && !IsSessionParent(parent)) id.launcher_pid = static_cast<pid_t>(ppid);
    }
  }
  // A path that names a pod in some other way is never guessed at: the client is treated as not
  // in a pod (no pod priority), and the operator sees why.
  if (id.cgroup.pod_uid.empty() && absl::StrContains(id.cgroup.reason, "kubelet pod layout")) {
    std::fprintf(stderr, "orion-server: pid %d (%s): %s\n", static_cast<int>(pid),
                 id.process_name.c_str(), id.cgroup.reason.c_str());
  }
  return id;
}

namespace {

// Field 22 of /proc/<pid>/stat (clock ticks since boot at which the process started); 0 if gone.
uint64_t StartTime(pid_t pid, const std::string& proc_root) {
  const std::string stat = ReadSmallFile(absl::StrCat(proc_root, "/", pid, "/stat"));
  const size_t paren = stat.rfind(')');  // comm may hold spaces and parentheses
  if (paren == std::string::npos) return 0;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(paren + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state), so field 22 is fields[19].
  uint64_t t = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &t)) return 0;
  return t;
}

absl::StatusOr<ucred> PeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(absl::StrCat("SO_PEERCRED failed: ", std::strerror(errno)));
  }
  if (cred.pid <= 0) {
    return absl::FailedPreconditionError(
        "peer has no pid in this PID namespace (is the server in the host PID namespace?)");
  }
  return cred;
}

}  // namespace

absl::StatusOr<PinnedPeer> PinPeer(int fd, const std::string& proc_root, bool pidfd_supported) {
  absl::StatusOr<ucred> cred = PeerCredentials(fd);
  if (!cred.ok()) return cred.status();
  PinnedPeer p;
#ifdef SYS_pidfd_open
  if (pidfd_supported) {
    p.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, cred->pid, 0));
    if (p.pidfd < 0 && errno == ESRCH) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the process that connected (pid ", cred->pid, ") exited before it was identified"));
    }
    // ENOSYS (older kernel) or EPERM (seccomp): the start-time fallback below. A pidfd is
    // close-on-exec.
  }
#endif
  p.start_time = StartTime(cred->pid, proc_root);
  p.identity = IdentifyPid(cred->pid, cred->uid, cred->gid, proc_root);
  // Alive after /proc was read: what was read belongs to the pinned process, not a successor.
  if (absl::Status alive = PinnedPeerAlive(p, proc_root); !alive.ok()) {
    if (p.pidfd >= 0) ::close(p.pidfd);
    return alive;
  }
  return p;
}

absl::Status PinnedPeerAlive(const PinnedPeer& p, const std::string& proc_root) {
  bool exited = false;
  if (p.pidfd >= 0) {
    // A pidfd turns readable when its process exits.
    pollfd pfd{p.pidfd, POLLIN, 0};
    exited = ::poll(&pfd, 1, 0) != 0;
  } else {
    exited = p.start_time == 0 || StartTime(p.identity.pid, proc_root) != p.start_time;
  }
  if (!exited) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the process that connected (pid ", p.identity.pid, ", ", p.identity.process_name,
      ") exited before the request was read: a process must connect and register itself, not "
      "use a socket another process opened"));
}

absl::StatusOr<PeerIdentity> IdentifyPeer(int fd, const std::string& proc_root) {
  absl::StatusOr<ucred> cred = PeerCredentials(fd);
  if (!cred.ok()) return cred.status();
  return IdentifyPid(cred->pid, cred->uid, cred->gid, proc_root);
}

}  // namespace orion::server
