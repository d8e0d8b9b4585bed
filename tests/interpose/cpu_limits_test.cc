// What the interposer reads as the process's CPUs: cgroup v2 cpu.max and v1 CFS quotas up the
// cgroup tree (the smallest wins, missing levels skipped, a container's own root read), the
// affinity, and the gate's spin cap below two CPUs.
#include "interpose/cpu_limits.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "contract/gate_rules.h"

namespace orion::interpose {
namespace {

// A cgroup file system in a map: path -> text.
struct FakeFiles {
  std::map<std::string, std::string> files;
  bool operator()(const char* path, char* buf, size_t size) const {
    auto it = files.find(path);
    if (it == files.end()) return false;
    snprintf(buf, size, "%s", it->second.c_str());
    return true;
  }
};

TEST(CpuLimitsTest, ParsesCpuMaxAndCfsQuotas) {
  EXPECT_EQ(ParseCpuMax("max 100000\n"), kUnlimitedMilliCpus);
  EXPECT_EQ(ParseCpuMax("100000 100000\n"), 1000u);
  EXPECT_EQ(ParseCpuMax("150000 100000"), 1500u);
  EXPECT_EQ(ParseCpuMax("50000 100000"), 500u);
  EXPECT_EQ(ParseCpuMax("1 3"), 334u);  // rounded up: never reads less than the quota
  EXPECT_EQ(ParseCpuMax("junk"), kUnlimitedMilliCpus);
  EXPECT_EQ(ParseCpuMax("100000"), kUnlimitedMilliCpus);  // no period
  EXPECT_EQ(ParseCfsQuota("-1\n", "100000\n"), kUnlimitedMilliCpus);
  EXPECT_EQ(ParseCfsQuota("200000\n", "100000\n"), 2000u);
  EXPECT_EQ(ParseCfsQuota("200000\n", "0\n"), kUnlimitedMilliCpus);
}

TEST(CpuLimitsTest, CgroupV2TakesTheSmallestQuotaUpTheTree) {
  FakeFiles fs;
  fs.files["/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max"] = "max 100000\n";
  fs.files["/sys/fs/cgroup/kubepods/pod1/cpu.max"] = "100000 100000\n";  // the pod's limit
  fs.files["/sys/fs/cgroup/kubepods/cpu.max"] = "1600000 100000\n";
  EXPECT_EQ(CgroupMilliCpus("0::/kubepods/pod1/ctr\n", fs), 1000u);
  EXPECT_EQ(CgroupMilliCpus("0::/kubepods\n", fs), 16000u);
  EXPECT_EQ(CgroupMilliCpus("0::/elsewhere\n", fs), kUnlimitedMilliCpus);
  EXPECT_EQ(CgroupMilliCpus("", fs), kUnlimitedMilliCpus);
  EXPECT_EQ(CgroupMilliCpus("garbage without colons", fs), kUnlimitedMilliCpus);
}

TEST(CpuLimitsTest, AContainerReadsItsOwnCgroupAtTheMountsRoot) {
  // cgroup namespace: the process sees "/" and its own cgroup's files at the root.
  FakeFiles fs;
  fs.files["/sys/fs/cgroup/cpu.max"] = "200000 100000\n";
  EXPECT_EQ(CgroupMilliCpus("0::/\n", fs), 2000u);
  // Without one the path names the host's tree; the container mounts its own cgroup at the root.
  EXPECT_EQ(CgroupMilliCpus("0::/kubepods/burstable/pod9/abc\n", fs), 2000u);
}

TEST(CpuLimitsTest, CgroupV1ReadsTheCpuControllersQuota) {
  FakeFiles fs;
  fs.files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "50000\n";
  fs.files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us"] = "100000\n";
  fs.files["/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"] = "-1\n";
  fs.files["/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"] = "100000\n";
  const char* cgroup =
      "12:memory:/docker/abc\n"
      "4:cpu,cpuacct:/docker/abc\n"
      "0::/system.slice/docker.service\n";  // a v2 line too: the v1 cpu controller wins
  EXPECT_EQ(CgroupMilliCpus(cgroup, fs), 500u);
  EXPECT_EQ(CgroupMilliCpus("4:cpuacct,cpu:/other\n", fs), kUnlimitedMilliCpus);
  EXPECT_EQ(CgroupMilliCpus("5:cpuset:/docker/abc\n", fs), kUnlimitedMilliCpus);  // not "cpu"
}

TEST(CpuLimitsTest, AffinityAndQuotaTheSmallerWinsAndTheSpinStopsBelowTwoCpus) {
  EXPECT_EQ(UsableMilliCpus(1, kUnlimitedMilliCpus), 1000u);
  EXPECT_EQ(UsableMilliCpus(16, 1500), 1500u);
  EXPECT_EQ(UsableMilliCpus(0, kUnlimitedMilliCpus), kUnlimitedMilliCpus);  // affinity unknown
  EXPECT_EQ(GateSpinCapNs(1000), 0u);
  EXPECT_EQ(GateSpinCapNs(1999), 0u);
  EXPECT_EQ(GateSpinCapNs(2000), contract::kMaxSpinNs);
  EXPECT_EQ(GateSpinCapNs(kUnlimitedMilliCpus), contract::kMaxSpinNs);
  EXPECT_GE(ProcessMilliCpus(), 1000u);  // this test process: at least one CPU, read for real
}

}  // namespace
}  // namespace orion::interpose
