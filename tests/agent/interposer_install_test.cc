// Versioned, atomic interposer installation and GPU discovery from a fake /proc tree.
#include "agent/interposer_install.h"

#include <gtest/gtest.h>
#include <stdlib.h>
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

TEST(DiscoverGpus, ReadsProcDriverNvidia) {
  char tmpl[] = "/tmp/orion-proc-XXXXXX";
  const std::string root = mkdtemp(tmpl);
  auto gpu = [&](const std::string& pci, int minor, const std::string& uuid) {
    fs::create_directories(root + "/" + pci);
    std::ofstream(root + "/" + pci + "/information")
        << "Model: \t\t NVIDIA H200\nIRQ:   \t\t 165\nGPU UUID: \t GPU-" << uuid
        << "\nVideo BIOS: \t 96.00.9f.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
        << "DMA Mask: \t 0xfffffffffffff\nBus Location: \t " << pci
        << "\nDevice Minor: \t " << minor << "\nGPU Excluded:\t No\n";
  };
  gpu("0000:4c:00.0", 1, "b2b3c4d5-0000-1111-2222-333344445555");
  gpu("0000:1b:00.0", 0, "a1a2a3a4-0000-1111-2222-333344445555");
  fs::create_directories(root + "/0000:99:00.0");  // no information file: skipped
  std::vector<std::string> gpus = DiscoverGpus(root);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0], "GPU-a1a2a3a4-0000-1111-2222-333344445555");
  EXPECT_EQ(gpus[1], "GPU-b2b3c4d5-0000-1111-2222-333344445555");
  EXPECT_TRUE(DiscoverGpus(root + "/missing").empty());
  fs::remove_all(root);
}

}  // namespace
}  // namespace orion::agent
