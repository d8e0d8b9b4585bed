// ABI contract of the built liborion_interpose.so, read with `objdump -T`: it exports exactly the
// hooks of interpose/hooked_functions.def and interpose/blas_functions.def plus dlsym and the NVTX tool entry point, needs no glibc symbol version newer than
// GLIBC_2.17, and depends on neither libstdc++ nor libgcc_s.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string RunCommand(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  pclose(pipe);
  return out;
}

// The names of a hook list: `macro(name, ...)` or `macro(name)` at the start of a line.
std::set<std::string> HookListNames(const char* path, const std::string& macro) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::set<std::string> names;
  const std::string s = text.str();
  std::regex entry("^" + macro + R"(\((\w+)[,)])", std::regex::multiline);
  for (auto it = std::sregex_iterator(s.begin(), s.end(), entry); it != std::sregex_iterator();
       ++it) {
    names.insert((*it)[1]);
  }
  return names;
}

class ExportsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dynsym_ = RunCommand(std::string("objdump -T ") + ORION_INTERPOSE_LIB + " 2>&1");
    ASSERT_NE(dynsym_.find("DYNAMIC SYMBOL TABLE"), std::string::npos) << dynsym_;
  }
  std::string dynsym_;
};

TEST_F(ExportsTest, ExportsExactlyTheHookListDlsymAndTheNvtxEntryPoint) {
  std::set<std::string> expected = HookListNames(ORION_HOOK_LIST, "ORION_HOOK");
  ASSERT_GT(expected.size(), 40u);
  const std::set<std::string> blas = HookListNames(ORION_BLAS_HOOK_LIST, "ORION_BLAS_HOOK");
  ASSERT_EQ(blas.size(), 5u);
  expected.insert(blas.begin(), blas.end());
  expected.insert("dlsym");
  expected.insert("InitializeInjectionNvtx2");
  std::set<std::string> exported;
  std::istringstream lines(dynsym_);
  std::string line;
  while (std::getline(lines, line)) {
    // Defined symbols carry a section name instead of *UND*; skip the header lines.
    if (line.find("*UND*") != std::string::npos || line.find(" .text") == std::string::npos) {
      if (line.find(" DF ") != std::string::npos && line.find("*UND*") == std::string::npos) {
        ADD_FAILURE() << "function exported outside .text: " << line;
      }
      continue;
    }
    std::istringstream fields(line);
    std::string field, last;
    while (fields >> field) last = field;
    exported.insert(last);
  }
  EXPECT_EQ(exported, expected);
  // Nothing but functions in .text may be defined (no data objects leak).
  std::regex defined_data(R"(\s(\.data|\.bss|\.rodata)\s)");
  EXPECT_FALSE(std::regex_search(dynsym_, defined_data)) << dynsym_;
}

TEST_F(ExportsTest, NoGlibcNewerThan2_17) {
  std::regex version(R"(GLIBC_2\.(\d+))");
  for (auto it = std::sregex_iterator(dynsym_.begin(), dynsym_.end(), version);
       it != std::sregex_iterator(); ++it) {
    EXPECT_LE(std::stoi((*it)[1]), 17) << "needs " << (*it)[0];
  }
}

TEST_F(ExportsTest, NoCxxRuntimeDependency) {
  EXPECT_EQ(dynsym_.find("GLIBCXX"), std::string::npos);
  EXPECT_EQ(dynsym_.find("CXXABI"), std::string::npos);
  const std::string needed =
      RunCommand(std::string("objdump -p ") + ORION_INTERPOSE_LIB + " | grep NEEDED");
  EXPECT_EQ(needed.find("libstdc++"), std::string::npos) << needed;
  EXPECT_EQ(needed.find("libgcc_s"), std::string::npos) << needed;
}

TEST_F(ExportsTest, NoConstructorsOfOurOwn) {
  // crtbegin's frame_dummy is the only allowed .init_array entry (8 bytes on 64-bit).
  const std::string sections =
      RunCommand(std::string("objdump -h ") + ORION_INTERPOSE_LIB + " | grep init_array");
  std::istringstream fields(sections);
  std::string idx, name, size;
  fields >> idx >> name >> size;
  if (!name.empty()) EXPECT_LE(std::stoul(size, nullptr, 16), 8u) << sections;
}

}  // namespace
