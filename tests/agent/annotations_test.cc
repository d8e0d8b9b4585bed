// Unit tests of the orion/* pod annotation parser: every accepted form, and that a malformed
// value keeps the default and is reported.
#include "agent/annotations.h"

#include <gtest/gtest.h>

namespace orion::agent {
namespace {

TEST(ParsePriority, AcceptsBothValuesCaseInsensitive) {
  EXPECT_EQ(*ParsePriority("high"), PodPriority::kHigh);
  EXPECT_EQ(*ParsePriority(" High "), PodPriority::kHigh);
  EXPECT_EQ(*ParsePriority("best-effort"), PodPriority::kBestEffort);
  EXPECT_EQ(*ParsePriority("BEST-EFFORT"), PodPriority::kBestEffort);
}

TEST(ParsePriority, RejectsOthers) {
  for (const char* bad : {"", "low", "critical", "besteffort", "high!", "1"}) {
    EXPECT_FALSE(ParsePriority(bad).ok()) << bad;
  }
}

TEST(ParseMemoryQuantity, BinaryAndDecimalSuffixes) {
  EXPECT_EQ(*ParseMemoryQuantity("8Gi"), 8ull << 30);
  EXPECT_EQ(*ParseMemoryQuantity("512Mi"), 512ull << 20);
  EXPECT_EQ(*ParseMemoryQuantity("1Ki"), 1024u);
  EXPECT_EQ(*ParseMemoryQuantity("2Ti"), 2ull << 40);
  EXPECT_EQ(*ParseMemoryQuantity("2G"), 2000000000ull);
  EXPECT_EQ(*ParseMemoryQuantity("300M"), 300000000ull);
  EXPECT_EQ(*ParseMemoryQuantity("5k"), 5000u);
  EXPECT_EQ(*ParseMemoryQuantity("1073741824"), 1073741824ull);
  EXPECT_EQ(*ParseMemoryQuantity(" 4Gi "), 4ull << 30);
}

TEST(ParseMemoryQuantity, FractionsRoundUpAndExponents) {
  EXPECT_EQ(*ParseMemoryQuantity("1.5Gi"), 3ull << 29);
  EXPECT_EQ(*ParseMemoryQuantity("0.5Ki"), 512u);
  EXPECT_EQ(*ParseMemoryQuantity("1.5"), 2u);
  EXPECT_EQ(*ParseMemoryQuantity("1e9"), 1000000000ull);
  EXPECT_EQ(*ParseMemoryQuantity("2E3"), 2000u);
  EXPECT_EQ(*ParseMemoryQuantity("1E"), 1000000000000000000ull);
}

TEST(ParseMemoryQuantity, RejectsMalformed) {
  for (const char* bad :
       {"", "Gi", "8gi", "8GB", "-1Gi", "8 Gi", "0x10", "1.2.3", "abc", "8Gii", "1e", "1e99",
        "100Ei", "inf", "nan", "+5"}) {
    EXPECT_FALSE(ParseMemoryQuantity(bad).ok()) << bad;
  }
}

TEST(ParseLatencyTargetMs, ToMicroseconds) {
  EXPECT_EQ(*ParseLatencyTargetMs("10"), 10000u);
  EXPECT_EQ(*ParseLatencyTargetMs("2.5"), 2500u);
  EXPECT_EQ(*ParseLatencyTargetMs("0.0001"), 1u);
  EXPECT_FALSE(ParseLatencyTargetMs("0").ok());
  EXPECT_FALSE(ParseLatencyTargetMs("-3").ok());
  EXPECT_FALSE(ParseLatencyTargetMs("10ms").ok());
  EXPECT_FALSE(ParseLatencyTargetMs("").ok());
  EXPECT_FALSE(ParseLatencyTargetMs("4000000").ok());
}

TEST(ParsePodAnnotations, DefaultsWithoutAnnotations) {
  ParsedAnnotations p = ParsePodAnnotations({{"app", "x"}});
  EXPECT_EQ(p.settings, PodSettings{});
  EXPECT_FALSE(p.has_priority_annotation);
  EXPECT_TRUE(p.problems.empty());
}

TEST(ParsePodAnnotations, AllThree) {
  ParsedAnnotations p = ParsePodAnnotations({{"orion/priority", "high"},
                                             {"orion/memory-limit", "8Gi"},
                                             {"orion/latency-target-ms", "15"}});
  EXPECT_TRUE(p.has_priority_annotation);
  EXPECT_TRUE(p.problems.empty());
  EXPECT_EQ(p.settings.priority, PodPriority::kHigh);
  EXPECT_EQ(p.settings.memory_limit_bytes, 8ull << 30);
  EXPECT_EQ(p.settings.latency_target_us, 15000u);
}

TEST(ParsePodAnnotations, MalformedValuesKeepDefaultsAndAreReported) {
  ParsedAnnotations p = ParsePodAnnotations({{"orion/priority", "urgent"},
                                             {"orion/memory-limit", "8GB"},
                                             {"orion/latency-target-ms", "5"}});
  EXPECT_TRUE(p.has_priority_annotation);
  EXPECT_EQ(p.settings.priority, PodPriority::kBestEffort);
  EXPECT_EQ(p.settings.memory_limit_bytes, 0u);
  EXPECT_EQ(p.settings.latency_target_us, 5000u);  // the good one still applies
  ASSERT_EQ(p.problems.size(), 2u);
  EXPECT_EQ(p.problems[0].key, "orion/priority");
  EXPECT_EQ(p.problems[0].value, "urgent");
  EXPECT_EQ(p.problems[1].key, "orion/memory-limit");
  EXPECT_NE(p.problems[1].Message().find("orion/memory-limit=\"8GB\""), std::string::npos);
}

// Jobs: orion/job first, then the JobSet label, then Kubeflow's; none: the pod alone (empty).
namespace jobs {

using Map = std::map<std::string, std::string>;

TEST(PodJob, AnnotationThenJobSetThenKubeflowThenThePodAlone) {
  const Map jobset = {{"jobset.sigs.k8s.io/jobset-name", "llama-ft"},
                      {"training.kubeflow.org/job-name", "other"}};
  EXPECT_EQ(ParsePodAnnotations({{"orion/job", "bench-1"}}, jobset).settings.job, "bench-1");
  EXPECT_EQ(ParsePodAnnotations({}, jobset).settings.job, "llama-ft");
  EXPECT_EQ(ParsePodAnnotations({}, {{"training.kubeflow.org/job-name", "resnet.v2"}}).settings.job,
            "resnet.v2");
  EXPECT_EQ(ParsePodAnnotations({}, {{"kubeflow.org/job-name", "old-op"}}).settings.job, "old-op");
  const ParsedAnnotations alone = ParsePodAnnotations({{"orion/priority", "high"}}, {});
  EXPECT_EQ(alone.settings.job, "");
  EXPECT_TRUE(alone.problems.empty());
  // A label the agent does not read names no job.
  EXPECT_EQ(ParsePodAnnotations({}, {{"app", "llama"}}).settings.job, "");
}

TEST(PodJob, AnInvalidAnnotationIsRefusedWithAClearMessageAndTheLabelsApply) {
  for (const char* bad : {"Llama", "a/b", "-x", "", "has space", "x_y",
                          "a234567890123456789012345678901234567890123456789012345678901234"}) {
    const ParsedAnnotations p =
        ParsePodAnnotations({{"orion/job", bad}}, {{"jobset.sigs.k8s.io/jobset-name", "js"}});
    EXPECT_EQ(p.settings.job, "js") << bad;
    ASSERT_EQ(p.problems.size(), 1u) << bad;
    EXPECT_EQ(p.problems[0].key, "orion/job");
    EXPECT_NE(p.problems[0].Message().find("annotation orion/job=\""), std::string::npos)
        << p.problems[0].Message();
    EXPECT_NE(p.problems[0].Message().find("lowercase letters, digits"), std::string::npos)
        << p.problems[0].Message();
  }
  // A job label out of shape is reported too, and names no job.
  const ParsedAnnotations p = ParsePodAnnotations({}, {{"kubeflow.org/job-name", "Bad_Name"}});
  EXPECT_EQ(p.settings.job, "");
  ASSERT_EQ(p.problems.size(), 1u);
  EXPECT_EQ(p.problems[0].Message().rfind("label kubeflow.org/job-name=\"Bad_Name\" ignored", 0), 0u)
      << p.problems[0].Message();
  EXPECT_EQ(*ParseJobName(" llama "), "llama");
}

}  // namespace jobs
}  // namespace
}  // namespace orion::agent
