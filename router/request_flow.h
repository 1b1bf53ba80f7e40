#pragma once
// RequestFlow: the life of one Generate request in the router as an explicit state machine
// (issue 14 item 7). It decides and keeps count; its owner (GenerateCall, generate_call.h) acts:
// places the request, calls the workers, relays the tokens and ends the client's call as each
// decision says. It knows no gRPC and no workers, so every transition is unit-tested alone
// (request_flow_test.cc).
//
//   admitted -placed-> placed -reserved-> reserved -prefilled-> prefilled -tokens-> streaming
//                        |                                                           |
//                        +--tokens (local prefill: the decode worker prefills)-------+
//   placed, prefilled, streaming --finished--> done (kComplete)
//   admitted --finished--> done: a resumed stream that has nothing left to generate (the worker
//                          that failed had sent max_tokens tokens, or filled the context)
//
// From every state but done:
//   - kCancelled (the client cancelled or went away, an Abort call, the router's drain ran past
//     its --shutdown-timeout) -> done, kEndCancelled;
//   - kDeadline (the client's deadline passed) -> done, kEndDeadline;
//   - kPeerFailed (a worker answered UNAVAILABLE, was dropped from the registry, or handed the
//     stream back as it drains), kStageTimeout (a stage ran past its own timeout: a hung worker,
//     stage_timeouts.h) and kWorkerFull (RESOURCE_EXHAUSTED) -> admitted again, to be placed on
//     other workers: kRetry while no token reached the client (at most max_attempts attempts in
//     all), kMigrate once one did (the stream resumes from the tokens sent so far; at most
//     migration_limit migrations, 0 = never); beyond its limit -> done, kEndFailed;
//   - kFailed (any other failure: a refused request, no worker to place it on) -> done,
//     kEndFailed.
// An event that cannot happen in the state it arrives in (a bug in the owner) ends the request
// with kEndFailed too, and the decision says so. Events after done change nothing (kIgnore): a
// late completion of a call already cancelled.
//
// Not thread-safe: its owner serializes the events.

#include <string>

namespace estuary::router {

enum class FlowState { kAdmitted, kPlaced, kReserved, kPrefilled, kStreaming, kDone };

enum class FlowEvent {
  kPlaced,       // workers chosen (the next call is Reserve, or a local-prefill Decode)
  kReserved,     // the decode worker reserved pages for the prompt
  kPrefilled,    // the prefill worker pushed the prompt's KV (the next call is Decode)
  kTokens,       // tokens of the Decode stream reached the client
  kFinished,     // the stream ended normally (EOS, stop token or string, length)
  kCancelled,
  kDeadline,
  kPeerFailed,
  kStageTimeout,
  kWorkerFull,
  kFailed,
};

enum class FlowAction {
  kProceed,       // make the call the new state waits on (or keep streaming)
  kRetry,         // place the request afresh (nothing reached the client yet)
  kMigrate,       // place it afresh, resumed from the tokens the client has
  kComplete,      // send the Complete message: the request finished
  kEndCancelled,  // end as cancelled (abort what runs on the workers)
  kEndDeadline,   // end with DEADLINE_EXCEEDED
  kEndFailed,     // end with the failure (see FlowDecision::why)
  kIgnore,        // the request had ended already: nothing to do
};

struct FlowDecision {
  FlowAction action = FlowAction::kProceed;
  // For kEndFailed: empty when the failure itself says why; otherwise what stopped another
  // attempt (e.g. "not resumed elsewhere: --migration-limit 0") or the unexpected event.
  std::string why;
};

class RequestFlow {
 public:
  // `max_attempts` >= 1: attempts before the first token (the first one included);
  // `migration_limit` >= 0: resumptions after it.
  RequestFlow(int max_attempts, int migration_limit);

  FlowDecision On(FlowEvent event);

  FlowState state() const { return state_; }
  bool done() const { return state_ == FlowState::kDone; }
  // Some token reached the client (so a new attempt is a migration).
  bool streamed() const { return streamed_; }
  int attempts() const { return attempts_; }      // started so far, the first one included
  int migrations() const { return migrations_; }  // of those, resumptions

  static const char* Name(FlowState state);
  static const char* Name(FlowEvent event);

 private:
  // kPeerFailed, kStageTimeout, kWorkerFull: another attempt, or the end at a limit.
  FlowDecision TryAgain();
  FlowDecision Unexpected(FlowEvent event);
  FlowDecision Move(FlowState next, FlowAction action);

  const int max_attempts_;
  const int migration_limit_;
  FlowState state_ = FlowState::kAdmitted;
  bool streamed_ = false;
  int attempts_ = 1;
  int migrations_ = 0;
};

}  // namespace estuary::router
