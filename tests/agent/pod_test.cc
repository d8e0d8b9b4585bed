// Parsing of recorded API-server JSON: pod lists, watch streams, 410 Gone.
#include "agent/pod.h"

#include <gtest/gtest.h>

#include <sstream>

#include "tests/agent/testdata.h"

namespace orion::agent {
namespace {

using testing::ReadTestdata;

TEST(ParsePodList, RecordedList) {
  absl::StatusOr<PodList> list = ParsePodList(ReadTestdata("pods-list.json"));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->resource_version, "184467");
  ASSERT_EQ(list->pods.size(), 3u);
  const PodInfo& a = list->pods[0];
  EXPECT_EQ(a.uid, "5d3b2a1c-0f9e-4d8c-b7a6-951e2f3a4b5c");
  EXPECT_EQ(a.namespace_name, "ml");
  EXPECT_EQ(a.name, "resnet-inference-7d9c8b6f5d-x2x9q");
  EXPECT_EQ(a.node_name, "gpu-node-a");
  EXPECT_EQ(a.phase, "Running");
  EXPECT_EQ(a.annotations.at("orion/priority"), "high");
  EXPECT_TRUE(list->pods[2].annotations.empty());
}

// Only the labels that name a pod's job are kept; the pod's job follows them.
TEST(PodFromJson, KeepsOnlyTheJobLabels) {
  absl::StatusOr<WatchEvent> e = ParseWatchEvent(R"({"type":"ADDED","object":{"metadata":{
      "uid":"5d3b2a1c-0f9e-4d8c-b7a6-951e2f3a4b5c","namespace":"training","name":"llama-w-0-1",
      "labels":{"app":"llama","jobset.sigs.k8s.io/jobset-name":"llama",
                "jobset.sigs.k8s.io/replicatedjob-name":"w"}}}})");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->pod.labels,
            (std::map<std::string, std::string>{{"jobset.sigs.k8s.io/jobset-name", "llama"}}));
}

TEST(ParsePodList, RejectsOtherKinds) {
  EXPECT_FALSE(ParsePodList(ReadTestdata("status-410-gone.json")).ok());
  EXPECT_FALSE(ParsePodList("not json").ok());
}

TEST(ParseWatchEvent, RecordedStream) {
  std::istringstream stream(ReadTestdata("pods-watch.jsonl"));
  std::vector<WatchEvent> events;
  for (std::string line; std::getline(stream, line);) {
    absl::StatusOr<WatchEvent> e = ParseWatchEvent(line);
    ASSERT_TRUE(e.ok()) << e.status();
    events.push_back(*e);
  }
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].type, WatchEventType::kModified);
  EXPECT_EQ(events[0].pod.annotations.at("orion/memory-limit"), "4Gi");
  EXPECT_EQ(events[0].pod.resource_version, "184502");
  EXPECT_EQ(events[1].type, WatchEventType::kAdded);
  EXPECT_EQ(events[2].type, WatchEventType::kModified);
  EXPECT_TRUE(events[2].pod.Finished());
  EXPECT_EQ(events[3].type, WatchEventType::kDeleted);
  EXPECT_EQ(events[4].type, WatchEventType::kBookmark);
  EXPECT_EQ(events[4].pod.resource_version, "184600");
}

TEST(ParseWatchEvent, Gone) {
  absl::StatusOr<WatchEvent> e = ParseWatchEvent(ReadTestdata("pods-watch-410.jsonl"));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->type, WatchEventType::kError);
  EXPECT_EQ(e->error_code, 410);
  EXPECT_NE(e->error_message.find("too old resource version"), std::string::npos);
}

TEST(ParseWatchEvent, Malformed) {
  EXPECT_FALSE(ParseWatchEvent("").ok());
  EXPECT_FALSE(ParseWatchEvent(R"({"type":"ADDED"})").ok());
  EXPECT_FALSE(ParseWatchEvent(R"({"type":"EXPLODED","object":{}})").ok());
  EXPECT_FALSE(ParseWatchEvent(R"({"type":"ADDED","object":{"metadata":{}}})").ok());
}

}  // namespace
}  // namespace orion::agent
