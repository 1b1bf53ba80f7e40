#include "router/request_flow.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace estuary::router {

RequestFlow::RequestFlow(int max_attempts, int migration_limit)
    : max_attempts_(std::max(1, max_attempts)), migration_limit_(std::max(0, migration_limit)) {}

FlowDecision RequestFlow::Move(FlowState next, FlowAction action) {
  state_ = next;
  return FlowDecision{action, ""};
}

FlowDecision RequestFlow::Unexpected(FlowEvent event) {
  const std::string why = absl::StrCat("internal error: event ", Name(event), " in state ",
                                       Name(state_));
  state_ = FlowState::kDone;
  return FlowDecision{FlowAction::kEndFailed, why};
}

FlowDecision RequestFlow::TryAgain() {
  if (!streamed_) {
    if (attempts_ >= max_attempts_) {
      state_ = FlowState::kDone;
      return FlowDecision{FlowAction::kEndFailed,
                          absl::StrCat("gave up after ", attempts_, " attempts")};
    }
    ++attempts_;
    return Move(FlowState::kAdmitted, FlowAction::kRetry);
  }
  if (migrations_ >= migration_limit_) {
    state_ = FlowState::kDone;
    return FlowDecision{
        FlowAction::kEndFailed,
        migration_limit_ == 0
            ? std::string("not resumed elsewhere: migration is off (--migration-limit 0)")
            : absl::StrCat("not resumed elsewhere: --migration-limit ", migration_limit_,
                           " reached")};
  }
  ++attempts_;
  ++migrations_;
  return Move(FlowState::kAdmitted, FlowAction::kMigrate);
}

FlowDecision RequestFlow::On(FlowEvent event) {
  if (state_ == FlowState::kDone) return FlowDecision{FlowAction::kIgnore, ""};
  switch (event) {
    case FlowEvent::kCancelled:
      return Move(FlowState::kDone, FlowAction::kEndCancelled);
    case FlowEvent::kDeadline:
      return Move(FlowState::kDone, FlowAction::kEndDeadline);
    case FlowEvent::kFailed:
      return Move(FlowState::kDone, FlowAction::kEndFailed);
    case FlowEvent::kPeerFailed:
    case FlowEvent::kStageTimeout:
    case FlowEvent::kWorkerFull:
      return TryAgain();
    case FlowEvent::kPlaced:
      if (state_ != FlowState::kAdmitted) return Unexpected(event);
      return Move(FlowState::kPlaced, FlowAction::kProceed);
    case FlowEvent::kReserved:
      if (state_ != FlowState::kPlaced) return Unexpected(event);
      return Move(FlowState::kReserved, FlowAction::kProceed);
    case FlowEvent::kPrefilled:
      if (state_ != FlowState::kReserved) return Unexpected(event);
      return Move(FlowState::kPrefilled, FlowAction::kProceed);
    case FlowEvent::kTokens:
      if (state_ != FlowState::kPlaced && state_ != FlowState::kPrefilled &&
          state_ != FlowState::kStreaming) {
        return Unexpected(event);
      }
      streamed_ = true;
      return Move(FlowState::kStreaming, FlowAction::kProceed);
    case FlowEvent::kFinished:
      if (state_ != FlowState::kPlaced && state_ != FlowState::kPrefilled &&
          state_ != FlowState::kStreaming && !(state_ == FlowState::kAdmitted && streamed_)) {
        return Unexpected(event);
      }
      return Move(FlowState::kDone, FlowAction::kComplete);
  }
  return Unexpected(event);
}

const char* RequestFlow::Name(FlowState state) {
  switch (state) {
    case FlowState::kAdmitted: return "admitted";
    case FlowState::kPlaced: return "placed";
    case FlowState::kReserved: return "reserved";
    case FlowState::kPrefilled: return "prefilled";
    case FlowState::kStreaming: return "streaming";
    case FlowState::kDone: return "done";
  }
  return "unknown";
}

const char* RequestFlow::Name(FlowEvent event) {
  switch (event) {
    case FlowEvent::kPlaced: return "placed";
    case FlowEvent::kReserved: return "reserved";
    case FlowEvent::kPrefilled: return "prefilled";
    case FlowEvent::kTokens: return "tokens";
    case FlowEvent::kFinished: return "finished";
    case FlowEvent::kCancelled: return "cancelled";
    case FlowEvent::kDeadline: return "deadline";
    case FlowEvent::kPeerFailed: return "peer failed";
    case FlowEvent::kStageTimeout: return "stage timeout";
    case FlowEvent::kWorkerFull: return "worker full";
    case FlowEvent::kFailed: return "failed";
  }
  return "unknown";
}

}  // namespace estuary::router
