#pragma once
// StageTimeouts: how long each hop of a request may take when the client's own deadline is
// later or absent, so that every call the router makes to a worker has a deadline and a hung
// worker is noticed (issue 14 item 1). estuary-router's flags set them (router_main.cc; `estuary
// up` passes them on); GenerateCall (generate_call.h) applies them:
//
//   --reserve-timeout      DecodeWorker.Reserve (pages for the prompt)
//   --prefill-timeout      PrefillWorker.Prefill (the prompt and its KV push)
//   --first-token-timeout  a Decode stream's first token (a local prefill and the worker's
//                          queue included)
//   --token-gap-timeout    the gap between two tokens of a Decode stream
//   --abort-timeout        a worker Abort
//
// A stage past its timeout counts as a hung worker: the request is retried or resumed elsewhere
// (request_flow.h), and aborted on that worker.

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace estuary::router {

struct StageTimeouts {
  absl::Duration reserve = absl::Seconds(5);
  absl::Duration prefill = absl::Seconds(120);
  absl::Duration first_token = absl::Seconds(120);
  absl::Duration token_gap = absl::Seconds(30);
  absl::Duration abort = absl::Seconds(1);

  // INVALID_ARGUMENT naming the flag of a timeout that is not positive.
  absl::Status Validate() const;
};

// The deadline of a stage that starts at `now` and may take `stage`: the client's deadline when
// that comes first.
absl::Time StageDeadline(absl::Time now, absl::Duration stage, absl::Time client_deadline);

}  // namespace estuary::router
