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
// The peer is pinned when its connection is accepted (PinPeer): SO_PEERCRED names the process
// that called connect(), a pidfd holds on to that very process (PID reuse cannot swap it), and
// /proc is read then. When the request arrives, PinnedPeerAlive says whether that process still
// lives: a connector that handed its socket on and exited cannot lend its identity. Kernels
// without pidfd_open (before 5.3) fall back to comparing /proc/<pid>/stat's start time.
//
// Usage:
//   absl::StatusOr<PeerIdentity> id = IdentifyPeer(fd, "/proc");
//   absl::StatusOr<PinnedPeer> pinned = PinPeer(fd, "/proc");   // at accept
//   absl::Status alive = PinnedPeerAlive(*pinned, "/proc");     // when the request arrives
//   CgroupIdentity c = ParseCgroupFile(text);  // pure, tested with recorded files
#pragma once

#include <sys/types.h>

#include <cstdint>
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
  std::string process_name;  // /proc/<pid>/comm (the process may set it: prctl PR_SET_NAME)
  std::string exe;           // /proc/<pid>/exe's target; empty when unreadable
  // The parent (/proc/<pid>/stat) when it may be a launcher of ranks (torchrun, mpirun's daemon,
  // a Python process that spawns them), so standalone clients of one launcher are one job; 0
  // when the parent is init, a shell, a terminal multiplexer, sudo, sshd or systemd (programs
  // started from one shell are not one job), or unreadable.
  pid_t launcher_pid = 0;
  CgroupIdentity cgroup;
};

CgroupIdentity ParseCgroupFile(const std::string& text);

// proc_root is "/proc" in production; tests point it at a recorded tree.
absl::StatusOr<PeerIdentity> IdentifyPeer(int connected_fd, const std::string& proc_root);
PeerIdentity IdentifyPid(pid_t pid, uid_t uid, gid_t gid, const std::string& proc_root);

// A connected peer identified at accept, with what proves it is still the same process.
struct PinnedPeer {
  PeerIdentity identity;
  int pidfd = -1;           // owned; -1 where the kernel has no pidfd_open
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (the fallback's proof)
};

// SO_PEERCRED, a pidfd and IdentifyPid, checked alive after /proc was read (so what was read is
// that process's). The caller closes pidfd. `pidfd_supported` false forces the fallback (tests).
absl::StatusOr<PinnedPeer> PinPeer(int connected_fd, const std::string& proc_root,
                                   bool pidfd_supported = true);
// OK while the pinned process lives; FAILED_PRECONDITION, saying so, once it has exited.
absl::Status PinnedPeerAlive(const PinnedPeer& peer, const std::string& proc_root);

}  // namespace orion::server
