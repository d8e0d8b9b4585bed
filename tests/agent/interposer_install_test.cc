// Versioned, atomic interposer installation and GPU discovery from a fake /proc tree.
#include "agent/interposer_install.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "agent/gpu_discovery.h"

namespace orion::agent {
namespace {

namespace fs = std::filesystem;

class InstallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/orion-install-XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string WriteLibrary(const std::string& name, const std::string& payload) {
    const std::string path = root_ + "/" + name;
    std::ofstream(path, std::ios::binary) << "\x7f" "ELF" << payload;
    return path;
  }
  std::string root_;
};

TEST_F(InstallTest, InstallsIntoVersionFolderAndPointsCurrentAtIt) {
  const std::string lib = WriteLibrary("v1.so", "version one");
  absl::StatusOr<std::string> dir = InstallInterposer(lib, root_ + "/host");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(fs::exists(*dir + "/liborion_interpose.so"));
  EXPECT_EQ(fs::file_size(*dir + "/liborion_interpose.so"), fs::file_size(lib));
  EXPECT_EQ(fs::read_symlink(root_ + "/host/current").string(),
            "versions/" + fs::path(*dir).filename().string());
  EXPECT_EQ(fs::status(*dir + "/liborion_interpose.so").permissions() & fs::perms::owner_exec,
            fs::perms::owner_exec);
  // No staging leftovers are visible.
  for (const auto& e : fs::directory_iterator(root_ + "/host/versions")) {
    EXPECT_NE(e.path().filename().string()[0], '.');
  }
  // Same bytes again: same folder, nothing rewritten.
  absl::StatusOr<std::string> again = InstallInterposer(lib, root_ + "/host");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *dir);
}

TEST_F(InstallTest, NewVersionLeavesOldOneForRunningPodsAndPrunes) {
  std::vector<std::string> dirs;
  for (int i = 0; i < 5; ++i) {
    const std::string lib = WriteLibrary("v.so", "version " + std::to_string(i));
    absl::StatusOr<std::string> dir = InstallInterposer(lib, root_ + "/host", /*keep=*/3);
    ASSERT_TRUE(dir.ok());
    dirs.push_back(*dir);
    // Distinct mtimes, so pruning order is defined.
    fs::last_write_time(*dir, fs::file_time_type::clock::now() + std::chrono::seconds(i));
  }
  EXPECT_EQ(fs::read_symlink(root_ + "/host/current").string(),
            "versions/" + fs::path(dirs[4]).filename().string());
  int kept = 0;
  for (const auto& e : fs::directory_iterator(root_ + "/host/versions")) {
    (void)e;
    ++kept;
  }
  EXPECT_EQ(kept, 3);
  EXPECT_TRUE(fs::exists(dirs[4]));
  EXPECT_TRUE(fs::exists(dirs[3]));
  EXPECT_FALSE(fs::exists(dirs[0]));
}

// A version a running process has marked (the shared flock the interposer takes at its first CUDA
// call, done here by the child itself; tests/e2e runs the real interposer) stays through upgrades
// that would otherwise prune it; once the process exits, the next install prunes it.
TEST_F(InstallTest, VersionInUseByARunningProcessIsKeptUntilItExits) {
  absl::StatusOr<std::string> real = InstallInterposer(ORION_INTERPOSE_LIB, root_ + "/host", 1);
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_FALSE(InterposerVersionInUse(*real));
  const std::string preload = *real + "/liborion_interpose.so";
  const pid_t pod = fork();
  ASSERT_GE(pod, 0);
  if (pod == 0) {
    const int fd = open(preload.c_str(), O_RDONLY);
    if (fd < 0 || flock(fd, LOCK_SH) != 0) _exit(1);
    pause();
    _exit(0);
  }
  for (int i = 0; i < 500 && !InterposerVersionInUse(*real); ++i) usleep(10'000);
  EXPECT_TRUE(InterposerVersionInUse(*real));

  for (int i = 0; i < 3; ++i) {
    const std::string lib = WriteLibrary("v.so", "upgrade " + std::to_string(i));
    absl::StatusOr<std::string> dir = InstallInterposer(lib, root_ + "/host", /*keep=*/1);
    ASSERT_TRUE(dir.ok());
    EXPECT_TRUE(fs::exists(preload)) << "upgrade " << i << " pruned a version in use";
  }
  kill(pod, SIGKILL);
  int status = 0;
  waitpid(pod, &status, 0);
  EXPECT_FALSE(InterposerVersionInUse(*real));
  const std::string lib = WriteLibrary("v.so", "after the pod");
  ASSERT_TRUE(InstallInterposer(lib, root_ + "/host", /*keep=*/1).ok());
  EXPECT_FALSE(fs::exists(*real));
  for (const auto& e : fs::directory_iterator(root_ + "/host/versions")) {
    EXPECT_NE(e.path().filename().string().rfind(".retired", 0), 0u) << e.path();
  }
}

TEST_F(InstallTest, RefusesMissingOrNonElfSource) {
  EXPECT_EQ(InstallInterposer(root_ + "/nope.so", root_ + "/host").status().code(),
            absl::StatusCode::kNotFound);
  std::ofstream(root_ + "/text.so") << "#!/bin/sh\n";
  EXPECT_EQ(InstallInterposer(root_ + "/text.so", root_ + "/host").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(root_ + "/host/current"));
}

TEST(ContentVersion, StableAndDistinct) {
  EXPECT_EQ(ContentVersion("abc"), ContentVersion("abc"));
  EXPECT_NE(ContentVersion("abc"), ContentVersion("abd"));
  EXPECT_EQ(ContentVersion("").size(), 16u);
}

class DiscoverGpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/orion-proc-XXXXXX";
    root_ = mkdtemp(tmpl);  // plays /proc/driver/nvidia
    gpus_ = root_ + "/gpus";
  }
  void TearDown() override { fs::remove_all(root_); }
  void AddGpu(const std::string& pci, int minor, const std::string& uuid) {
    fs::create_directories(gpus_ + "/" + pci);
    std::ofstream(gpus_ + "/" + pci + "/information")
        << "Model: \t\t NVIDIA H200\nIRQ:   \t\t 165\nGPU UUID: \t GPU-" << uuid
        << "\nVideo BIOS: \t 96.00.9f.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
        << "DMA Mask: \t 0xfffffffffffff\nBus Location: \t " << pci
        << "\nDevice Minor: \t " << minor << "\nGPU Excluded:\t No\n";
  }
  std::string root_, gpus_;
};

TEST_F(DiscoverGpusTest, ReadsProcDriverNvidia) {
  AddGpu("0000:4c:00.0", 1, "b2b3c4d5-0000-1111-2222-333344445555");
  AddGpu("0000:1b:00.0", 0, "a1a2a3a4-0000-1111-2222-333344445555");
  fs::create_directories(gpus_ + "/0000:99:00.0");  // no information file: skipped
  std::vector<Gpu> gpus = DiscoverGpus(gpus_);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].uuid, "GPU-a1a2a3a4-0000-1111-2222-333344445555");
  EXPECT_EQ(gpus[0].bus_location, "0000:1b:00.0");
  EXPECT_EQ(gpus[1].uuid, "GPU-b2b3c4d5-0000-1111-2222-333344445555");
  EXPECT_EQ(gpus[1].minor, 1);
  EXPECT_TRUE(gpus[0].Shareable() && gpus[1].Shareable());
  EXPECT_EQ(ShareableGpus(gpus).size(), 2u);
  EXPECT_TRUE(DiscoverGpus(root_ + "/missing").empty());
}

// A MIG GPU with instances (the kernel module lists /capabilities/gpu<minor>/mig/gi<N>) is
// refused with a reason; a MIG-capable GPU without instances (MIG off) is shared.
TEST_F(DiscoverGpusTest, RefusesGpuInMigModeFromProcCapabilities) {
  AddGpu("0000:1b:00.0", 0, "a1a2a3a4-0000-1111-2222-333344445555");
  AddGpu("0000:4c:00.0", 1, "b2b3c4d5-0000-1111-2222-333344445555");
  fs::create_directories(root_ + "/capabilities/gpu0/mig");  // capable, MIG off
  std::ofstream(root_ + "/capabilities/gpu0/mig/config") << "DeviceFileMinor: 1\n";
  fs::create_directories(root_ + "/capabilities/gpu1/mig/gi1/ci0");
  fs::create_directories(root_ + "/capabilities/gpu1/mig/gi2/ci0");
  std::vector<Gpu> gpus = DiscoverGpus(gpus_);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_TRUE(gpus[0].Shareable());
  EXPECT_FALSE(gpus[1].Shareable());
  EXPECT_TRUE(gpus[1].mig_enabled);
  EXPECT_NE(gpus[1].refusal.find("MIG mode is enabled (2 GPU instances"), std::string::npos)
      << gpus[1].refusal;
  EXPECT_EQ(ShareableGpus(gpus), std::vector<std::string>{gpus[0].uuid});
  const std::string text = DescribeGpus(gpus);
  EXPECT_NE(text.find(gpus[0].uuid + " minor 0 0000:1b:00.0 shared"), std::string::npos) << text;
  EXPECT_NE(text.find(gpus[1].uuid + " minor 1 0000:4c:00.0 refused: MIG"), std::string::npos)
      << text;
}

// NVML, when it answers, decides: it sees MIG mode enabled before any instance exists.
TEST_F(DiscoverGpusTest, NvmlAnswerWinsOverProc) {
  AddGpu("0000:1b:00.0", 0, "a1a2a3a4-0000-1111-2222-333344445555");
  AddGpu("0000:4c:00.0", 1, "b2b3c4d5-0000-1111-2222-333344445555");
  struct FakeNvml : MigProbe {  // test double of NVML's answer
    int MigMode(const std::string& uuid) override {
      return uuid == "GPU-a1a2a3a4-0000-1111-2222-333344445555" ? 1 : 0;
    }
    uint64_t MemoryBytes(const std::string& uuid) override {
      return uuid == "GPU-b2b3c4d5-0000-1111-2222-333344445555" ? 150ull << 30 : 0;
    }
  } nvml;
  fs::create_directories(root_ + "/capabilities/gpu1/mig/gi1");
  std::vector<Gpu> gpus = DiscoverGpus(gpus_, &nvml);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_FALSE(gpus[0].Shareable());
  EXPECT_NE(gpus[0].refusal.find("(NVML)"), std::string::npos);
  EXPECT_TRUE(gpus[1].Shareable());  // NVML says MIG off
  // What the DRA plugin publishes of each GPU: the driver's model, NVML's memory.
  EXPECT_EQ(gpus[1].model, "NVIDIA H200");
  EXPECT_EQ(gpus[1].memory_bytes, 150ull << 30);
  EXPECT_EQ(gpus[0].memory_bytes, 0u);
}

}  // namespace
}  // namespace orion::agent
