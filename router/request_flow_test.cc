// RequestFlow alone: the happy paths (disaggregated and local), cancel, deadline and
// peer-failure transitions from every state, the retry and migration limits, and events that
// cannot happen where they arrive.

#include "router/request_flow.h"

#include <vector>

#include "gtest/gtest.h"

namespace estuary::router {
namespace {

// A flow driven to `state` along the disaggregated path (streaming: one chunk of tokens).
RequestFlow At(FlowState state, int max_attempts = 3, int migration_limit = 3) {
  RequestFlow flow(max_attempts, migration_limit);
  const std::vector<FlowEvent> path = {FlowEvent::kPlaced, FlowEvent::kReserved,
                                       FlowEvent::kPrefilled, FlowEvent::kTokens};
  for (FlowEvent event : path) {
    if (flow.state() == state) break;
    EXPECT_EQ(flow.On(event).action, FlowAction::kProceed) << RequestFlow::Name(event);
  }
  EXPECT_EQ(flow.state(), state);
  return flow;
}

const std::vector<FlowState>& LiveStates() {
  static const std::vector<FlowState> states = {FlowState::kAdmitted, FlowState::kPlaced,
                                                FlowState::kReserved, FlowState::kPrefilled,
                                                FlowState::kStreaming};
  return states;
}

TEST(RequestFlowTest, DisaggregatedAndLocalPathsEndComplete) {
  RequestFlow flow = At(FlowState::kStreaming);
  EXPECT_TRUE(flow.streamed());
  EXPECT_EQ(flow.On(FlowEvent::kTokens).action, FlowAction::kProceed);
  EXPECT_EQ(flow.On(FlowEvent::kFinished).action, FlowAction::kComplete);
  EXPECT_TRUE(flow.done());
  EXPECT_EQ(flow.attempts(), 1);

  RequestFlow local(3, 3);  // the decode worker prefills: placed -> streaming
  EXPECT_EQ(local.On(FlowEvent::kPlaced).action, FlowAction::kProceed);
  EXPECT_EQ(local.On(FlowEvent::kTokens).action, FlowAction::kProceed);
  EXPECT_EQ(local.state(), FlowState::kStreaming);
  EXPECT_EQ(local.On(FlowEvent::kFinished).action, FlowAction::kComplete);

  RequestFlow silent = At(FlowState::kPrefilled);  // EOS as the first token: no token at all
  EXPECT_EQ(silent.On(FlowEvent::kFinished).action, FlowAction::kComplete);
  EXPECT_FALSE(silent.streamed());
}

TEST(RequestFlowTest, CancelAndDeadlineEndEveryLiveState) {
  for (FlowState state : LiveStates()) {
    RequestFlow cancelled = At(state);
    EXPECT_EQ(cancelled.On(FlowEvent::kCancelled).action, FlowAction::kEndCancelled)
        << RequestFlow::Name(state);
    EXPECT_TRUE(cancelled.done());
    RequestFlow late = At(state);
    EXPECT_EQ(late.On(FlowEvent::kDeadline).action, FlowAction::kEndDeadline)
        << RequestFlow::Name(state);
    EXPECT_TRUE(late.done());
    RequestFlow failed = At(state);
    EXPECT_EQ(failed.On(FlowEvent::kFailed).action, FlowAction::kEndFailed)
        << RequestFlow::Name(state);
  }
}

TEST(RequestFlowTest, PeerFailuresRetryBeforeTheFirstTokenAndMigrateAfter) {
  for (FlowState state : LiveStates()) {
    for (FlowEvent failure :
         {FlowEvent::kPeerFailed, FlowEvent::kStageTimeout, FlowEvent::kWorkerFull}) {
      RequestFlow flow = At(state);
      const FlowDecision decision = flow.On(failure);
      const FlowAction want =
          state == FlowState::kStreaming ? FlowAction::kMigrate : FlowAction::kRetry;
      EXPECT_EQ(decision.action, want)
          << RequestFlow::Name(state) << " + " << RequestFlow::Name(failure);
      EXPECT_EQ(flow.state(), FlowState::kAdmitted);  // placed afresh
      EXPECT_EQ(flow.attempts(), 2);
      EXPECT_EQ(flow.migrations(), state == FlowState::kStreaming ? 1 : 0);
    }
  }
}

TEST(RequestFlowTest, RetriesStopAtMaxAttempts) {
  RequestFlow flow(/*max_attempts=*/2, /*migration_limit=*/3);
  EXPECT_EQ(flow.On(FlowEvent::kPlaced).action, FlowAction::kProceed);
  EXPECT_EQ(flow.On(FlowEvent::kPeerFailed).action, FlowAction::kRetry);
  EXPECT_EQ(flow.On(FlowEvent::kPlaced).action, FlowAction::kProceed);
  const FlowDecision last = flow.On(FlowEvent::kWorkerFull);
  EXPECT_EQ(last.action, FlowAction::kEndFailed);
  EXPECT_NE(last.why.find("2 attempts"), std::string::npos) << last.why;
  EXPECT_TRUE(flow.done());
}

TEST(RequestFlowTest, AMigratedStreamResumesAndMigrationsStopAtTheLimit) {
  RequestFlow flow = At(FlowState::kStreaming, /*max_attempts=*/1, /*migration_limit=*/2);
  for (int m = 1; m <= 2; ++m) {
    EXPECT_EQ(flow.On(FlowEvent::kPeerFailed).action, FlowAction::kMigrate);
    EXPECT_EQ(flow.migrations(), m);
    // The resumed attempt: placed, reserved, prefilled, then its tokens continue the stream.
    EXPECT_EQ(flow.On(FlowEvent::kPlaced).action, FlowAction::kProceed);
    if (m == 1) {
      EXPECT_EQ(flow.On(FlowEvent::kReserved).action, FlowAction::kProceed);
      EXPECT_EQ(flow.On(FlowEvent::kPrefilled).action, FlowAction::kProceed);
    }
    EXPECT_EQ(flow.On(FlowEvent::kTokens).action, FlowAction::kProceed);
  }
  const FlowDecision last = flow.On(FlowEvent::kStageTimeout);
  EXPECT_EQ(last.action, FlowAction::kEndFailed);
  EXPECT_NE(last.why.find("--migration-limit 2"), std::string::npos) << last.why;
  EXPECT_EQ(flow.attempts(), 3);
}

TEST(RequestFlowTest, MigrationOffEndsAfterTheFirstToken) {
  RequestFlow flow = At(FlowState::kStreaming, 3, /*migration_limit=*/0);
  const FlowDecision decision = flow.On(FlowEvent::kPeerFailed);
  EXPECT_EQ(decision.action, FlowAction::kEndFailed);
  EXPECT_NE(decision.why.find("--migration-limit 0"), std::string::npos) << decision.why;
}

TEST(RequestFlowTest, AResumedStreamWithNothingLeftFinishesFromAdmitted) {
  RequestFlow flow = At(FlowState::kStreaming);
  EXPECT_EQ(flow.On(FlowEvent::kPeerFailed).action, FlowAction::kMigrate);
  EXPECT_EQ(flow.On(FlowEvent::kFinished).action, FlowAction::kComplete);
  // A fresh request cannot finish before it was placed.
  RequestFlow fresh(3, 3);
  const FlowDecision odd = fresh.On(FlowEvent::kFinished);
  EXPECT_EQ(odd.action, FlowAction::kEndFailed);
  EXPECT_NE(odd.why.find("finished in state admitted"), std::string::npos) << odd.why;
}

TEST(RequestFlowTest, EventsOutOfOrderEndTheRequestAndEventsAfterTheEndAreIgnored) {
  RequestFlow flow(3, 3);
  const FlowDecision odd = flow.On(FlowEvent::kPrefilled);  // before placement and Reserve
  EXPECT_EQ(odd.action, FlowAction::kEndFailed);
  EXPECT_NE(odd.why.find("prefilled in state admitted"), std::string::npos) << odd.why;
  EXPECT_EQ(flow.On(FlowEvent::kTokens).action, FlowAction::kIgnore);
  EXPECT_EQ(flow.On(FlowEvent::kCancelled).action, FlowAction::kIgnore);
  RequestFlow reserved = At(FlowState::kReserved);
  EXPECT_EQ(reserved.On(FlowEvent::kTokens).action, FlowAction::kEndFailed);  // no Decode yet
}

}  // namespace
}  // namespace estuary::router
