// Who a registering client really is, from the kernel rather than from the client:
// SO_PEERCRED on the Unix socket gives pid/uid/gid; /proc/<pid>/cgroup gives the pod UID and the
// container id when the process runs under Kubernetes (cgroupfs and systemd drivers, v1 and v2).
//
// Only the kubelet's own layouts name a pod, one path component each:
//   cgroupfs: .../kubepods[/burstable|/besteffort]/pod<uid>/<container id>
//             (crio-<id> under CRI-O; a cgroup namespace may show the parents as "..")
//   systemd:  .../kubepods[-<qos>]-pod<uid with '_'>.slice/<runtime>-<id>.scope
//             (any prefix before kubepods, e.g. kind's kubelet-kubepods-...; runtime is
//             cri-containerd, crio or docker)
// A path that is not one of these is "not in a pod", never a guessed pod: `reason` says why
// (IdentifyPid logs it when the path mentions kubepods). Outside pods, a docker-<id>.scope or
// /docker/<id> component still gives the container id.
//
// Usage:
//   absl::StatusOr<PeerIdentity> id = IdentifyPeer(fd, "/proc");
//   CgroupIdentity c = ParseCgroupFile(text);  // pure, tested with recorded files
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace orion::server {

struct CgroupIdentity {
  std::string pod_uid;       // "3f1d2c4e-...", empty outside Kubernetes
  std::string container_id;  // 64 hex digits, empty if none found
  std::string reason;        // why pod_uid is empty ("not in a pod: ..."); empty in a pod
};

struct PeerIdentity {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string process_name;  // /proc/<pid>/comm
  CgroupIdentity cgroup;
};

CgroupIdentity ParseCgroupFile(const std::string& text);

// proc_root is "/proc" in production; tests point it at a recorded tree.
absl::StatusOr<PeerIdentity> IdentifyPeer(int connected_fd, const std::string& proc_root);
PeerIdentity IdentifyPid(pid_t pid, uid_t uid, gid_t gid, const std::string& proc_root);

}  // namespace orion::server
