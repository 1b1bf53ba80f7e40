// TtftFloor: the fastest recent time to first token of a prompt no longer than the new one
// refuses deadlines shorter than it, and only those; old or longer samples do not count.

#include "router/ttft_floor.h"

#include "gtest/gtest.h"

namespace estuary::router {
namespace {

TEST(TtftFloorTest, RefusesOnlyDeadlinesBelowTheFastestRecentFirstToken) {
  TtftFloor floor(/*window=*/8, /*max_age=*/absl::Seconds(10), /*min_samples=*/2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Nothing known: only a deadline already past is refused.
  EXPECT_TRUE(floor.Check(t0 + absl::Milliseconds(1), 10, t0).ok());
  EXPECT_EQ(floor.Check(t0, 10, t0).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(floor.Check(absl::InfiniteFuture(), 10, t0).ok());

  floor.Observe(/*prompt_tokens=*/20, absl::Milliseconds(120), t0);
  EXPECT_EQ(floor.Floor(20, t0), std::nullopt);  // one request alone refuses nothing
  floor.Observe(/*prompt_tokens=*/20, absl::Milliseconds(150), t0);
  floor.Observe(/*prompt_tokens=*/200, absl::Milliseconds(40), t0);  // longer: not a bound for 20
  floor.Observe(/*prompt_tokens=*/300, absl::Milliseconds(60), t0);
  EXPECT_EQ(floor.Floor(20, t0), absl::Milliseconds(120));
  EXPECT_EQ(floor.Floor(10, t0), std::nullopt);  // no prompt that short seen
  EXPECT_EQ(floor.Floor(500, t0), absl::Milliseconds(40));

  const absl::Status refused = floor.Check(t0 + absl::Milliseconds(50), 20, t0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(refused.message().find("refused at admission"), absl::string_view::npos)
      << refused.message();
  EXPECT_TRUE(floor.Check(t0 + absl::Milliseconds(130), 20, t0).ok());
  // Samples age out.
  EXPECT_EQ(floor.Floor(20, t0 + absl::Seconds(11)), std::nullopt);
}

TEST(TtftFloorTest, KeepsTheNewestWindow) {
  TtftFloor floor(/*window=*/2, absl::Minutes(1), /*min_samples=*/1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  floor.Observe(10, absl::Milliseconds(5), t0);
  floor.Observe(10, absl::Milliseconds(50), t0);
  floor.Observe(10, absl::Milliseconds(60), t0);  // the 5 ms one leaves the window
  EXPECT_EQ(floor.Floor(10, t0), absl::Milliseconds(50));
}

}  // namespace
}  // namespace estuary::router
