#include "core/model/draft_payoff.h"

#include "gtest/gtest.h"

namespace estuary {
namespace {

// Runs `rounds` rounds through `payoff`: a drafted round emits 4 tokens in `draft_ms`, a plain
// one 1 token in `plain_ms`. Returns how many of them drafted.
int RunRounds(DraftPayoff& payoff, int rounds, double draft_ms, double plain_ms) {
  int drafted = 0;
  for (int i = 0; i < rounds; ++i) {
    const bool drafts = payoff.NextRoundDrafts();
    drafted += drafts ? 1 : 0;
    payoff.Record(drafts, absl::Microseconds(1000 * (drafts ? draft_ms : plain_ms)),
                  drafts ? 4 : 1);
  }
  return drafted;
}

TEST(DraftPayoffTest, MeasuresBothKindsThenRunsTheCheaperAndProbesTheOther) {
  DraftPayoff payoff;
  // Drafts first, then plain rounds, kProbeRounds each.
  for (int i = 0; i < DraftPayoff::kProbeRounds; ++i) {
    EXPECT_TRUE(payoff.NextRoundDrafts());
    payoff.Record(true, absl::Milliseconds(30), 4);  // 7.5 ms a token
  }
  for (int i = 0; i < DraftPayoff::kProbeRounds; ++i) {
    EXPECT_FALSE(payoff.NextRoundDrafts());
    payoff.Record(false, absl::Milliseconds(10), 1);  // 10 ms a token
  }
  EXPECT_NEAR(payoff.seconds_per_token(true), 0.0075, 1e-9);
  EXPECT_NEAR(payoff.seconds_per_token(false), 0.010, 1e-9);
  // Drafts pay, and run until kProbeEvery tokens since the last probe (15 came in the first
  // rounds, so 61 rounds of 4); then kProbeRounds plain rounds, then drafts again.
  int drafted = 0;
  while (payoff.NextRoundDrafts()) {
    payoff.Record(true, absl::Milliseconds(30), 4);
    ASSERT_LT(++drafted, 1000);
  }
  EXPECT_EQ(drafted, 61);
  payoff.Record(false, absl::Milliseconds(10), 1);
  for (int i = 1; i < DraftPayoff::kProbeRounds; ++i) {
    EXPECT_FALSE(payoff.NextRoundDrafts()) << i;
    payoff.Record(false, absl::Milliseconds(10), 1);
  }
  EXPECT_TRUE(payoff.NextRoundDrafts());
  payoff.Record(true, absl::Milliseconds(30), 4);
  // The drafts turn dear (a large batch, a model in cache): 60 ms for 4 tokens. The estimate
  // moves within a few rounds and plain rounds take over, the drafts probed now and then.
  const int dear = RunRounds(payoff, 1000, 60, 10);
  EXPECT_LT(dear, 40);
  EXPECT_GT(dear, 3);  // probes
  EXPECT_GT(payoff.seconds_per_token(true), payoff.seconds_per_token(false));
  // And back: the drafts cheap again are found at the next probe.
  EXPECT_GT(RunRounds(payoff, 600, 20, 10), 300);
}

TEST(DraftPayoffTest, RoundsThatEmitNothingAreIgnored) {
  DraftPayoff payoff;
  payoff.Record(true, absl::Seconds(5), 0);
  EXPECT_LT(payoff.seconds_per_token(true), 0.0);
  EXPECT_TRUE(payoff.NextRoundDrafts());
}

}  // namespace
}  // namespace estuary
