// Pod UID and container id from /proc/<pid>/cgroup in the layouts kubelets produce.
#include "server/peer_identity.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"

namespace orion::server {
namespace {

TEST(CgroupTest, CgroupV1Cgroupfs) {
  auto id = ParseCgroupFile(
      "12:memory:/kubepods/burstable/pod0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab/"
      "4c0f3f5b2a1e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a39281706f5e4d3c2b1a0\n"
      "11:cpuset:/kubepods/burstable/pod0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab/"
      "4c0f3f5b2a1e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a39281706f5e4d3c2b1a0\n");
  EXPECT_EQ(id.pod_uid, "0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab");
  EXPECT_EQ(id.container_id, "4c0f3f5b2a1e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a39281706f5e4d3c2b1a0");
}

TEST(CgroupTest, CgroupV2SystemdContainerd) {
  auto id = ParseCgroupFile(
      "0::/kubepods.slice/kubepods-besteffort.slice/"
      "kubepods-besteffort-pod7e1f4a2b_9c3d_4e5f_a6b7_c8d9e0f1a2b3.slice/"
      "cri-containerd-9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b.scope\n");
  EXPECT_EQ(id.pod_uid, "7e1f4a2b-9c3d-4e5f-a6b7-c8d9e0f1a2b3");
  EXPECT_EQ(id.container_id, "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b");
}

TEST(CgroupTest, CrioAndDockerPrefixes) {
  auto crio = ParseCgroupFile(
      "0::/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/"
      "crio-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.scope\n");
  EXPECT_EQ(crio.pod_uid, "11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(crio.container_id, std::string(64, 'a'));
  auto docker = ParseCgroupFile(
      "0::/system.slice/docker-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.scope\n");
  EXPECT_EQ(docker.pod_uid, "");
  EXPECT_EQ(docker.container_id, std::string(64, 'b'));
}

TEST(CgroupTest, StandaloneProcessHasNoPod) {
  auto id = ParseCgroupFile("0::/user.slice/user-1000.slice/session-3.scope\n");
  EXPECT_TRUE(id.pod_uid.empty());
  EXPECT_TRUE(id.container_id.empty());
  EXPECT_TRUE(ParseCgroupFile("garbage without colons\n\n::\n").pod_uid.empty());
}

// Recorded from tools/check-pods.sh: a best-effort pod's sample run by containerd 1.6 (CRI,
// cgroupfs driver, runc) on a cgroup v1 host with the v2 hierarchy mounted beside it.
TEST(CgroupTest, RecordedContainerdCgroupfsV1Hybrid) {
  const std::string pod = "pod8e55f2af-cfb5-4213-af9f-06d24deced62";
  const std::string cid = "d5747c9857067e5e1576a0634900b63d57d140bac4856bef20ca2b1921a7491b";
  std::string text;
  int n = 9;
  for (const char* ctrl : {"name=systemd", "pids", "blkio", "freezer", "devices", "memory",
                           "cpuset", "cpuacct", "cpu", ""}) {
    text += std::to_string(n--) + ":" + ctrl + ":/kubepods/besteffort/" + pod + "/" + cid + "\n";
  }
  auto id = ParseCgroupFile(text);
  EXPECT_EQ(id.pod_uid, "8e55f2af-cfb5-4213-af9f-06d24deced62");
  EXPECT_EQ(id.container_id, cid);
  EXPECT_TRUE(id.reason.empty()) << id.reason;
}

// The kubelet's layouts (pkg/kubelet/cm: cgroupfs names, and their systemd conversion), each QoS
// class, and the runtimes' container cgroup names.
TEST(CgroupTest, KubeletLayouts) {
  const std::string uid = "0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab";
  const std::string uid_ = "0f4a3b2c_1d2e_4f5a_8b9c_0123456789ab";
  const std::string cid(64, 'c');
  struct Case {
    const char* what;
    std::string text;
    std::string container;
  };
  const Case cases[] = {
      {"cgroupfs guaranteed", "0::/kubepods/pod" + uid + "/" + cid + "\n", cid},
      {"cgroupfs burstable v1", "4:memory:/kubepods/burstable/pod" + uid + "/" + cid + "\n", cid},
      {"cgroupfs CRI-O", "0::/kubepods/besteffort/pod" + uid + "/crio-" + cid + "\n", cid},
      {"systemd guaranteed v2",
       "0::/kubepods.slice/kubepods-pod" + uid_ + ".slice/cri-containerd-" + cid + ".scope\n",
       cid},
      {"systemd burstable v1",
       "11:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid_ +
           ".slice/cri-containerd-" + cid + ".scope\n1:name=systemd:/kubepods.slice\n",
       cid},
      {"systemd docker (cri-dockerd)",
       "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uid_ +
           ".slice/docker-" + cid + ".scope\n",
       cid},
      {"kind node (kubelet-kubepods prefix)",
       "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
       "kubelet-kubepods-besteffort-pod" + uid_ + ".slice/cri-containerd-" + cid + ".scope\n",
       cid},
      {"cgroup namespace, cgroupfs (server in its own cgroupns)",
       "0::/../../../besteffort/pod" + uid + "/" + cid + "\n", cid},
      {"cgroup namespace, sibling pod", "0::/../../pod" + uid + "/" + cid + "\n", cid},
      {"a kubelet cgroup root above the chain (cgroupfs)",
       "0::/docker/" + std::string(64, 'e') + "/kubelet/kubepods/besteffort/pod" + uid + "/" + cid +
           "\n",
       cid},
      {"cgroup namespace, systemd",
       "0::/../../kubepods-besteffort-pod" + uid_ + ".slice/cri-containerd-" + cid + ".scope\n",
       cid},
      {"the pod's own cgroup (no container)", "0::/kubepods/burstable/pod" + uid + "\n", ""},
      {"CRI-O's monitor is not a container",
       "0::/kubepods.slice/kubepods-pod" + uid_ + ".slice/crio-conmon-" + cid + ".scope\n", ""},
  };
  for (const Case& c : cases) {
    auto id = ParseCgroupFile(c.text);
    EXPECT_EQ(id.pod_uid, uid) << c.what;
    EXPECT_EQ(id.container_id, c.container) << c.what;
    EXPECT_TRUE(id.reason.empty()) << c.what << ": " << id.reason;
  }
}

// Paths that mention a pod some other way are never taken for one: not in a pod, with a reason.
TEST(CgroupTest, UnrecognisedPathsAreNotInAPod) {
  const std::string uid = "0f4a3b2c-1d2e-4f5a-8b9c-0123456789ab";
  const std::string uid_ = "0f4a3b2c_1d2e_4f5a_8b9c_0123456789ab";
  const std::string cid(64, 'd');
  for (const std::string& text : {
           "0::/user.slice/mypod" + uid + "/" + cid + "\n",          // not a component "pod<uid>"
           "0::/custom/pod" + uid + "/" + cid + "\n",                // not under kubepods or a QoS
           "0::/pod" + uid + "/" + cid + "\n",                       // at the root
           "0::/kubepods/burstable/pod" + uid.substr(0, 35) + "/" + cid + "\n",  // short UID
           "0::/kubepods/burstable/podnot-a-uid/" + cid + "\n",
           "0::/kubepods.slice/other-pod" + uid_ + ".slice/crio-" + cid + ".scope\n",
           "0::/kubepods.slice/kubepods-besteffort-pod" + uid + ".slice\n",  // '-' in systemd
           "0::/system.slice/podman-" + cid + ".scope\n",
           // A host user's own cgroups, named as a pod's (systemd-run --user --slice=..., mkdir):
           "0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-pod" + uid_ +
               ".slice/run-1.scope\n",
           "0::/user.slice/user-1000.slice/user@1000.service/kubepods/burstable/pod" + uid + "/" +
               cid + "\n",
           "0::/../../../user.slice/user-1000.slice/user@1000.service/kubepods.slice/"
           "kubepods-besteffort.slice/kubepods-besteffort-pod" + uid_ + ".slice/run-1.scope\n",
           "0::/user.slice/kubepods-pod" + uid_ + ".slice/run-1.scope\n",  // not its slice
           "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-pod" + uid_ + ".slice\n",
           "0::/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods/burstable/pod" +
               uid + "/" + cid + "\n",
       }) {
    auto id = ParseCgroupFile(text);
    EXPECT_EQ(id.pod_uid, "") << text;
    EXPECT_TRUE(absl::StartsWith(id.reason, "not in a pod: cgroup path /")) << text << id.reason;
  }
  auto kube = ParseCgroupFile("0::/kubepods/burstable/podnot-a-uid/" + cid + "\n");
  EXPECT_NE(kube.reason.find("not a kubelet pod layout"), std::string::npos) << kube.reason;
  EXPECT_EQ(ParseCgroupFile("").reason, "not in a pod: no cgroup path");
  EXPECT_EQ(ParseCgroupFile("0::/user.slice/user-1000.slice/session-3.scope\n").reason,
            "not in a pod: cgroup path /user.slice/user-1000.slice/session-3.scope");
}

// IdentifyPid on a recorded /proc tree: the pod from a real path, and an unrecognised one.
TEST(PeerIdentityTest, RecordedProcTree) {
  char tmpl[] = "/tmp/orion-peer-identity-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto write = [&](int pid, const std::string& cgroup) {
    const std::string base = dir + "/" + std::to_string(pid);
    ASSERT_EQ(mkdir(base.c_str(), 0755), 0);
    std::ofstream(base + "/comm") << "orion-sample-in\n";
    std::ofstream(base + "/cgroup") << cgroup;
  };
  const std::string cid(64, 'e');
  write(101, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
             "7e1f4a2b_9c3d_4e5f_a6b7_c8d9e0f1a2b3.slice/cri-containerd-" + cid + ".scope\n");
  write(102, "0::/kubepods/burstable/pod7e1f4a2b/" + cid + "\n");
  PeerIdentity in_pod = IdentifyPid(101, 1000, 1000, dir);
  EXPECT_EQ(in_pod.process_name, "orion-sample-in");
  EXPECT_EQ(in_pod.cgroup.pod_uid, "7e1f4a2b-9c3d-4e5f-a6b7-c8d9e0f1a2b3");
  EXPECT_EQ(in_pod.cgroup.container_id, cid);
  PeerIdentity odd = IdentifyPid(102, 1000, 1000, dir);  // logs the reason
  EXPECT_EQ(odd.cgroup.pod_uid, "");
  EXPECT_NE(odd.cgroup.reason.find("not a kubelet pod layout"), std::string::npos);
  ASSERT_EQ(system(("rm -rf " + dir).c_str()), 0);
}

TEST(PeerIdentityTest, OwnProcessFromRealProc) {
  PeerIdentity id = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  EXPECT_EQ(id.pid, getpid());
  EXPECT_FALSE(id.process_name.empty());
}

}  // namespace
}  // namespace orion::server
