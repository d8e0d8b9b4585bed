// Pod UID and container id from /proc/<pid>/cgroup in the layouts kubelets produce.
#include "server/peer_identity.h"

#include <gtest/gtest.h>
#include <unistd.h>

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

TEST(PeerIdentityTest, OwnProcessFromRealProc) {
  PeerIdentity id = IdentifyPid(getpid(), getuid(), getgid(), "/proc");
  EXPECT_EQ(id.pid, getpid());
  EXPECT_FALSE(id.process_name.empty());
}

}  // namespace
}  // namespace orion::server
