#include "decode/token_streams.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

TokenEvent Token(const std::string& id, int32_t token, bool finished = false) {
  TokenEvent e;
  e.request_id = id;
  e.token_id = token;
  e.finished = finished;
  return e;
}

TEST(TokenStreamsTest, QueuesUntilTakenAndRefusesDuplicates) {
  TokenStreams streams;
  ASSERT_TRUE(streams.Open("a").ok());
  EXPECT_EQ(streams.Open("a").code(), absl::StatusCode::kInvalidArgument);
  streams.Push(Token("a", 5));
  streams.Push(Token("b", 6));  // not open: dropped
  auto events = streams.Next("a", absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].token_id, 5);
  auto none = streams.Next("a", absl::Now() + absl::Milliseconds(20));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(streams.Next("b", absl::Now()).status().code(), absl::StatusCode::kNotFound);
  streams.Close("a");
  EXPECT_FALSE(streams.IsOpen("a"));
}

// A finished stream nobody closes is dropped after the time to live; open ones stay.
TEST(TokenStreamsTest, UnclaimedFinishedStreamsAreDropped) {
  TokenStreams streams(absl::Milliseconds(20));
  ASSERT_TRUE(streams.Open("orphan").ok());
  ASSERT_TRUE(streams.Open("live").ok());
  streams.Push(Token("orphan", -1, /*finished=*/true));
  absl::SleepFor(absl::Milliseconds(40));
  ASSERT_TRUE(streams.Open("other").ok());
  streams.Push(Token("other", -1, /*finished=*/true));  // a push of a final event sweeps
  EXPECT_FALSE(streams.IsOpen("orphan"));
  EXPECT_TRUE(streams.IsOpen("live"));
  EXPECT_TRUE(streams.IsOpen("other"));
  EXPECT_EQ(streams.open_streams(), 2u);
}

// At most max_open streams: beyond, RESOURCE_EXHAUSTED until one closes; a finished stream
// nobody claimed past its time to live makes room too.
TEST(TokenStreamsTest, AtMostMaxOpenStreams) {
  TokenStreams streams(absl::Milliseconds(20), /*max_open=*/2);
  ASSERT_TRUE(streams.Open("a").ok());
  ASSERT_TRUE(streams.Open("b").ok());
  const absl::Status full = streams.Open("c");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("--max-waiting-requests"), absl::string_view::npos);
  EXPECT_EQ(streams.Open("a").code(), absl::StatusCode::kInvalidArgument);  // still a duplicate
  streams.Close("a");
  ASSERT_TRUE(streams.Open("c").ok());
  streams.Push(Token("b", -1, /*finished=*/true));
  absl::SleepFor(absl::Milliseconds(40));
  EXPECT_TRUE(streams.Open("d").ok());  // "b" was dropped, unclaimed
  EXPECT_FALSE(streams.IsOpen("b"));
}

}  // namespace
}  // namespace estuary
