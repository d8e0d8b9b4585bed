// Unit tests of the interposer's environment parsing and UUID formatting.
#include "interpose/env_config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "interpose/cpu_limits.h"

namespace orion::interpose {
namespace {

TEST(ParseByteSizeTest, AcceptsKubernetesQuantities) {
  uint64_t v = 0;
  EXPECT_TRUE(ParseByteSize("1073741824", &v));
  EXPECT_EQ(v, 1073741824u);
  EXPECT_TRUE(ParseByteSize("2Gi", &v));
  EXPECT_EQ(v, 2ull << 30);
  EXPECT_TRUE(ParseByteSize("512Mi", &v));
  EXPECT_EQ(v, 512ull << 20);
  EXPECT_TRUE(ParseByteSize("64Ki", &v));
  EXPECT_EQ(v, 64ull << 10);
  EXPECT_TRUE(ParseByteSize("1Ti", &v));
  EXPECT_EQ(v, 1ull << 40);
  EXPECT_TRUE(ParseByteSize("500M", &v));
  EXPECT_EQ(v, 500'000'000u);
  EXPECT_TRUE(ParseByteSize("2G", &v));
  EXPECT_EQ(v, 2'000'000'000u);
  EXPECT_TRUE(ParseByteSize("3GiB", &v));
  EXPECT_EQ(v, 3ull << 30);
}

TEST(ParseByteSizeTest, RejectsJunkAndOverflow) {
  uint64_t v = 7;
  EXPECT_FALSE(ParseByteSize("", &v));
  EXPECT_FALSE(ParseByteSize(nullptr, &v));
  EXPECT_FALSE(ParseByteSize("Gi", &v));
  EXPECT_FALSE(ParseByteSize("-1", &v));
  EXPECT_FALSE(ParseByteSize("12Xi", &v));
  EXPECT_FALSE(ParseByteSize("100m", &v));  // milli: meaningless for bytes
  EXPECT_FALSE(ParseByteSize("2Gi extra", &v));
  EXPECT_FALSE(ParseByteSize("99999999999999999999", &v));
  EXPECT_FALSE(ParseByteSize("17179869184Gi", &v));
  EXPECT_EQ(v, 7u);
}

TEST(CopyDirectionOfTest, FromWhereTheEndsLive) {
  using contract::CopyDirection;
  EXPECT_EQ(CopyDirectionOf(true, false), CopyDirection::kHostToDevice);
  EXPECT_EQ(CopyDirectionOf(false, true), CopyDirection::kDeviceToHost);
  EXPECT_EQ(CopyDirectionOf(true, true), CopyDirection::kDeviceToDevice);
  EXPECT_EQ(CopyDirectionOf(false, false), CopyDirection::kHostToHost);
}

TEST(ParsePriorityTest, KnownWords) {
  EXPECT_EQ(ParsePriority("high"), static_cast<uint32_t>(contract::Priority::kHigh));
  EXPECT_EQ(ParsePriority("HIGH"), static_cast<uint32_t>(contract::Priority::kHigh));
  EXPECT_EQ(ParsePriority("best-effort"), static_cast<uint32_t>(contract::Priority::kBestEffort));
  EXPECT_EQ(ParsePriority("BestEffort"), static_cast<uint32_t>(contract::Priority::kBestEffort));
  EXPECT_EQ(ParsePriority("urgent"), contract::kNoValue32);
  EXPECT_EQ(ParsePriority(""), contract::kNoValue32);
  EXPECT_EQ(ParsePriority(nullptr), contract::kNoValue32);
  EXPECT_EQ(ParsePriority("a-very-long-priority-word"), contract::kNoValue32);
}

TEST(ParseFlagTest, TruthyWords) {
  EXPECT_TRUE(ParseFlag("1"));
  EXPECT_TRUE(ParseFlag("true"));
  EXPECT_TRUE(ParseFlag("Yes"));
  EXPECT_FALSE(ParseFlag("0"));
  EXPECT_FALSE(ParseFlag(""));
  EXPECT_FALSE(ParseFlag(nullptr));
  EXPECT_FALSE(ParseFlag("11"));
}

TEST(FormatGpuUuidTest, NvidiaSmiForm) {
  const unsigned char raw[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0,
                                 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
  char out[contract::kGpuUuidBytes];
  FormatGpuUuid(raw, out, sizeof(out));
  EXPECT_STREQ(out, "GPU-12345678-9abc-def0-0123-456789abcdef");
  char tiny[10];
  FormatGpuUuid(raw, tiny, sizeof(tiny));
  EXPECT_STREQ(tiny, "");
}

TEST(ReadEnvConfigTest, ParsesEverythingWithDefaults) {
  std::map<std::string, std::string> env = {
      {"ORION_PRIORITY", "high"}, {"ORION_MEMORY_LIMIT", "2Gi"}, {"ORION_LATENCY_TARGET_MS", "15"},
      {"ORION_QUIET", "1"},       {"ORION_PROFILE", "1"},
  };
  auto get = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EnvConfig config = ReadEnvConfig(get);
  EXPECT_FALSE(config.disabled);
  EXPECT_TRUE(config.quiet);
  EXPECT_TRUE(config.profile);
  EXPECT_EQ(config.requested_priority, static_cast<uint32_t>(contract::Priority::kHigh));
  EXPECT_EQ(config.requested_memory_limit, 2ull << 30);
  EXPECT_EQ(config.requested_latency_target_us, 15'000u);
  EXPECT_STREQ(config.socket_path, contract::kDefaultSocketPath);
  EXPECT_STREQ(config.log_dir, "");  // no call log unless asked
  EXPECT_FALSE(config.no_timing);
  EXPECT_EQ(config.start_latency.idle_ns, kDefaultKernelStartNs);
  EXPECT_EQ(config.start_latency.queued_ns, kDefaultQueuedStartNs);
  EXPECT_EQ(config.start_latency.held_ns, kDefaultHeldStartNs);
  EXPECT_EQ(config.start_latency.held_compute_ns, kDefaultHeldComputeStartNs);
  EXPECT_TRUE(config.timing_hold);  // on unless said otherwise
  EXPECT_EQ(config.lazy_poll_ns, kDefaultLazyPollNs);

  env = {{"ORION_DISABLE", "1"}, {"ORION_SOCKET", "/tmp/x.sock"}, {"ORION_MEMORY_LIMIT", "lots"},
         {"ORION_LOG_DIR", "/tmp/orion-logs"}, {"ORION_KERNEL_START_NS", "0"},
         {"ORION_QUEUED_START_NS", "500000"},  // past the 100 us bound: the default stays
         {"ORION_NO_TIMING", "1"}, {"ORION_LAZY_POLL_MS", "100"},
         {"ORION_HELD_START_NS", "2600"}, {"ORION_HELD_COMPUTE_START_NS", "2900"},
         {"ORION_TIMING_HOLD", "off"}};
  config = ReadEnvConfig(get);
  EXPECT_TRUE(config.no_timing);
  EXPECT_EQ(config.start_latency.held_ns, 2'600u);
  EXPECT_EQ(config.start_latency.held_compute_ns, 2'900u);
  EXPECT_FALSE(config.timing_hold);
  EXPECT_EQ(config.lazy_poll_ns, 100'000'000u);
  EXPECT_EQ(config.start_latency.idle_ns, 0u);
  EXPECT_EQ(config.start_latency.queued_ns, kDefaultQueuedStartNs);
  EXPECT_TRUE(config.disabled);
  // A blocking launch waits for its own stream: never held. A word that is not "off" keeps it.
  env = {{"CUDA_LAUNCH_BLOCKING", "1"}};
  EXPECT_FALSE(ReadEnvConfig(get).timing_hold);
  env = {{"ORION_TIMING_HOLD", "maybe"}};
  EXPECT_TRUE(ReadEnvConfig(get).timing_hold);
  // Past the 100 us bound, or not a number: the compute kernels' default stays.
  env = {{"ORION_HELD_COMPUTE_START_NS", "200000"}};
  EXPECT_EQ(ReadEnvConfig(get).start_latency.held_compute_ns, kDefaultHeldComputeStartNs);
  env = {{"ORION_HELD_COMPUTE_START_NS", "2.9us"}};
  EXPECT_EQ(ReadEnvConfig(get).start_latency.held_compute_ns, kDefaultHeldComputeStartNs);
  EXPECT_EQ(config.requested_priority, contract::kNoValue32);
  EXPECT_EQ(config.requested_memory_limit, 0u);
  EXPECT_STREQ(config.socket_path, "/tmp/x.sock");
  EXPECT_STREQ(config.log_dir, "/tmp/orion-logs");

  // Sampling: 1 in 64 of a best-effort client's launches and 1 in 256 of a high-priority one's;
  // a power of two up to 4096 replaces either, anything else keeps the default.
  EXPECT_EQ(config.sample_every, 64u);
  EXPECT_EQ(config.sample_every_high, 256u);
  env = {{"ORION_SAMPLE_EVERY", "16"}, {"ORION_SAMPLE_EVERY_HIGH", "1"}};
  EXPECT_EQ(ReadEnvConfig(get).sample_every, 16u);
  EXPECT_EQ(ReadEnvConfig(get).sample_every_high, 1u);
  for (const char* bad : {"0", "48", "8192", "x"}) {
    env = {{"ORION_SAMPLE_EVERY", bad}, {"ORION_SAMPLE_EVERY_HIGH", bad}};
    EXPECT_EQ(ReadEnvConfig(get).sample_every, kDefaultSampleEvery) << bad;
    EXPECT_EQ(ReadEnvConfig(get).sample_every_high, kDefaultSampleEveryHigh) << bad;
  }

  // A lazy period of 0 or past a second (or not a number) keeps the default.
  for (const char* bad : {"0", "1001", "50ms", "-5"}) {
    env = {{"ORION_LAZY_POLL_MS", bad}};
    EXPECT_EQ(ReadEnvConfig(get).lazy_poll_ns, kDefaultLazyPollNs) << bad;
  }
}

TEST(ReadEnvConfigTest, LazyPeriodIsLongerBelowTwoCpusUnlessSet) {
  std::map<std::string, std::string> env;
  auto get = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EnvConfig config = ReadEnvConfig(get);
  EXPECT_FALSE(config.lazy_poll_set);
  // A pod with limits.cpu 1 (1000), 1.5 CPUs, a process pinned to one core: the long period.
  EXPECT_EQ(LazyPollNsFor(config, 1000), kFewCpusLazyPollNs);
  EXPECT_EQ(LazyPollNsFor(config, 1999), kFewCpusLazyPollNs);
  // Two CPUs or more, or no limit at all: the default.
  EXPECT_EQ(LazyPollNsFor(config, 2000), kDefaultLazyPollNs);
  EXPECT_EQ(LazyPollNsFor(config, kUnlimitedMilliCpus), kDefaultLazyPollNs);
  // ORION_LAZY_POLL_MS wins wherever it is set; an invalid one counts as unset.
  env = {{"ORION_LAZY_POLL_MS", "50"}};
  config = ReadEnvConfig(get);
  EXPECT_TRUE(config.lazy_poll_set);
  EXPECT_EQ(LazyPollNsFor(config, 1000), 50'000'000u);
  env = {{"ORION_LAZY_POLL_MS", "0"}};
  EXPECT_EQ(LazyPollNsFor(ReadEnvConfig(get), 1000), kFewCpusLazyPollNs);
}

TEST(CopyTruncatedTest, AlwaysTerminates) {
  char buf[4];
  CopyTruncated(buf, sizeof(buf), "abcdef");
  EXPECT_STREQ(buf, "abc");
  CopyTruncated(buf, sizeof(buf), nullptr);
  EXPECT_STREQ(buf, "");
}

}  // namespace
}  // namespace orion::interpose
