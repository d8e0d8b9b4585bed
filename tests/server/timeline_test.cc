// The per-GPU timeline ring: windows by time, reading after a cursor in arrival order (what
// StreamTimeline follows), what a slow reader lost to the ring, and the recording window.
#include "server/timeline.h"

#include <gtest/gtest.h>

namespace orion::server {
namespace {

Span At(int64_t start, uint32_t client = 1) {
  Span s;
  s.start_unix_ns = start;
  s.client_id = client;
  return s;
}

TEST(TimelineStoreTest, AfterCursorInArrivalOrderAndWhatTheRingOverwrote) {
  TimelineStore store(4);
  for (int64_t t : {30, 10, 20}) store.Add(At(t));  // clients interleave: arrival order != time
  uint64_t cursor = 0, lost = 0;
  std::vector<Span> out = store.After(&cursor, 2, &lost);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].start_unix_ns, 30);
  EXPECT_EQ(out[1].start_unix_ns, 10);
  EXPECT_EQ(cursor, 2u);
  out = store.After(&cursor, 100, &lost);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(cursor, 3u);
  EXPECT_TRUE(store.After(&cursor, 100, &lost).empty());

  for (int64_t t = 40; t < 100; t += 10) store.Add(At(t));  // 6 more: the ring keeps 4
  out = store.After(&cursor, 100, &lost);
  EXPECT_EQ(lost, 2u);  // spans 4 and 5 were overwritten before this read
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out.front().start_unix_ns, 60);
  EXPECT_EQ(out.back().start_unix_ns, 90);
  EXPECT_EQ(cursor, 9u);
  uint64_t ahead = 1000;  // a cursor from a previous server run: starts at now
  EXPECT_TRUE(store.After(&ahead, 100, &lost).empty());
  EXPECT_EQ(ahead, 9u);
}

TEST(TimelineStoreTest, RecordingWindowKeepsOnlySpansStartingInside) {
  TimelineStore store(100);
  store.SetRecording(100, 200);
  for (int64_t t : {50, 100, 150, 200, 250}) store.Add(At(t));
  bool truncated = false;
  std::vector<Span> kept = store.Window(0, 1000, 100, &truncated);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept.front().start_unix_ns, 100);
  EXPECT_EQ(kept.back().start_unix_ns, 200);
  EXPECT_EQ(store.added(), 3u);
  store.SetRecording(0, 0);  // open again
  store.Add(At(5000));
  EXPECT_EQ(store.added(), 4u);
}

}  // namespace
}  // namespace orion::server
