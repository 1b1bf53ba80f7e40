#pragma once
// TtftFloor: refusing at admission a deadline that cannot be met (issue 14 item 1; checklist
// C3: "unmeetable deadlines rejected at admission"). The router keeps the time to first token
// of its recent requests (arrival to first token: its queue, placement, prefill and KV push)
// with their prompt lengths; a new request whose deadline is shorter than the fastest of them
// for a prompt no longer than its own cannot get its first token in time, and Generate refuses
// it with DEADLINE_EXCEEDED at once, before any worker is called. The figure is a lower bound
// (the best the cluster did lately), so a refusal is never a guess; a deadline that merely
// looks tight goes ahead. The memory is short (`max_age`, 10 s) so that a burst's slow first
// tokens do not refuse deadlines once it is over, and a floor needs `min_samples` requests, so
// one slow request alone refuses nothing. Without them, only a deadline already past is refused.
//
// Bounded: the newest `window` requests within `max_age`. Thread-safe.

#include <cstddef>
#include <deque>
#include <optional>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace estuary::router {

class TtftFloor {
 public:
  explicit TtftFloor(size_t window = 64, absl::Duration max_age = absl::Seconds(10),
                     int min_samples = 3)
      : window_(window), max_age_(max_age), min_samples_(min_samples) {}

  // A request with a prompt of `prompt_tokens` tokens got its first token `ttft` after arrival.
  void Observe(int prompt_tokens, absl::Duration ttft, absl::Time now);
  // The shortest recent time to first token of a prompt of at most `prompt_tokens` tokens, when
  // at least min_samples such requests were seen.
  std::optional<absl::Duration> Floor(int prompt_tokens, absl::Time now);
  // OK, or DEADLINE_EXCEEDED naming both figures when the time left before `deadline` is below
  // Floor(prompt_tokens) (or nothing is left).
  absl::Status Check(absl::Time deadline, int prompt_tokens, absl::Time now);

 private:
  struct Sample {
    int prompt_tokens;
    absl::Duration ttft;
    absl::Time at;
  };
  const size_t window_;
  const absl::Duration max_age_;
  const int min_samples_;
  absl::Mutex mu_;
  std::deque<Sample> samples_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace estuary::router
