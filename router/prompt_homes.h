#pragma once
// PromptHomes: which decode worker recent requests ran on, with their prompts, kept for a while
// after they end (the worker's prefix cache keeps their full prompt pages), so that a later
// sample of the same prompt (GenerateRequest.same_prompt_as) can run beside the first one and
// adopt those pages. Owned by the router service; bounded (at most `capacity` entries, each for
// `ttl`); thread-safe.

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace estuary::router {

class PromptHomes {
 public:
  PromptHomes(size_t capacity, absl::Duration ttl);

  // `request_id` runs on `decode_worker_id` with `prompt` (a retry elsewhere records again).
  void Record(const std::string& request_id, const std::string& decode_worker_id,
              absl::Span<const int32_t> prompt, absl::Time now);
  // The decode worker of `request_id` when it was recorded with exactly `prompt` within `ttl`.
  std::optional<std::string> Find(const std::string& request_id, absl::Span<const int32_t> prompt,
                                  absl::Time now);

 private:
  struct Home {
    std::string decode_worker_id;
    std::vector<int32_t> prompt;
    absl::Time recorded;
  };
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const absl::Duration ttl_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Home> homes_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<absl::Time, std::string>> order_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace estuary::router
