#include "router/ttft_floor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace estuary::router {

void TtftFloor::Observe(int prompt_tokens, absl::Duration ttft, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (samples_.size() >= window_) samples_.pop_front();
  samples_.push_back(Sample{prompt_tokens, ttft, now});
}

std::optional<absl::Duration> TtftFloor::Floor(int prompt_tokens, absl::Time now) {
  absl::MutexLock lock(&mu_);
  while (!samples_.empty() && now - samples_.front().at > max_age_) samples_.pop_front();
  std::optional<absl::Duration> floor;
  int seen = 0;
  for (const Sample& s : samples_) {
    if (s.prompt_tokens > prompt_tokens) continue;
    ++seen;
    if (!floor.has_value() || s.ttft < *floor) floor = s.ttft;
  }
  if (seen < min_samples_) return std::nullopt;
  return floor;
}

absl::Status TtftFloor::Check(absl::Time deadline, int prompt_tokens, absl::Time now) {
  if (deadline == absl::InfiniteFuture()) return absl::OkStatus();
  const absl::Duration left = deadline - now;
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError("the request's deadline had passed when it arrived");
  }
  const std::optional<absl::Duration> floor = Floor(prompt_tokens, now);
  if (floor.has_value() && left < *floor) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the request's deadline leaves ", absl::FormatDuration(left),
        " but no recent request of at most ", prompt_tokens,
        " prompt tokens got its first token in less than ", absl::FormatDuration(*floor),
        " (queue, placement, prefill and KV push): refused at admission"));
  }
  return absl::OkStatus();
}

}  // namespace estuary::router
