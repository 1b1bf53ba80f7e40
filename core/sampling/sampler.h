#pragma once
// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, stop ids, and a
// per-request seed that makes sampling reproducible. One Sampler per sequence (it owns the
// sequence's random state); not thread-safe.

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace estuary {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off; keeps tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1 = off; >1 discourages tokens already seen (CTRL rule)
  uint64_t seed = 0;                // same seed, same logits -> same tokens
  std::vector<int32_t> stop_token_ids;

  // Ranges: temperature in [0, 100], top_k >= 0, top_p in (0, 1], min_p in [0, 1],
  // repetition_penalty in (0, 10]. INVALID_ARGUMENT names the field and its limit.
  absl::Status Validate() const;
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params);

  // Picks the next token from `logits` (modified in place by penalties and temperature).
  // `history` is every token of the sequence so far (prompt and generated), for the
  // repetition penalty.
  int32_t Sample(absl::Span<float> logits, absl::Span<const int32_t> history);

  bool IsStopToken(int32_t id) const;
  const SamplingParams& params() const { return params_; }
  // Whether Sample is the argmax of the raw logits (temperature 0, no repetition penalty), so
  // an argmax taken elsewhere (on a GPU) may stand in for it. Sample draws no randomness then.
  bool greedy() const {
    return params_.temperature == 0.0f && params_.repetition_penalty == 1.0f;
  }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

// Index of the largest value; the lowest index among equal maxima.
int32_t Argmax(absl::Span<const float> values);

}  // namespace estuary
