#pragma once
// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition, presence and frequency
// penalties, logit bias, min_tokens, stop ids, log-probabilities of the chosen and the most
// likely tokens, and a per-request seed that makes sampling reproducible. One Sampler per
// sequence; its randomness is a function of (seed, output position) alone, so a sequence whose
// tokens are sampled in several processes draws the same stream as one process would.

#include <cstdint>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace estuary {

inline constexpr int kMaxLogprobs = 20;         // top log-probabilities per token, at most
inline constexpr size_t kMaxLogitBiasEntries = 1024;

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy; 1.0 is OpenAI's and vLLM's default
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off; keeps tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1 = off; >1 discourages tokens already seen (CTRL rule)
  float presence_penalty = 0.0f;    // subtracted once from every token already generated
  float frequency_penalty = 0.0f;   // subtracted per occurrence among the generated tokens
  int min_tokens = 0;               // end-of-sequence and stop ids are masked before this many
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the raw logits
  int logprobs = -1;                // -1 = off; N >= 0: chosen token's and the top N's
  uint64_t seed = 0;                // same seed, same logits -> same tokens
  std::vector<int32_t> stop_token_ids;

  // Ranges: temperature in [0, 100], top_k >= 0, top_p in (0, 1], min_p in [0, 1],
  // repetition_penalty in (0, 10], presence/frequency penalties in [-2, 2], min_tokens >= 0,
  // logit_bias values in [-100, 100] (at most kMaxLogitBiasEntries, ids >= 0), logprobs in
  // [-1, kMaxLogprobs]. INVALID_ARGUMENT names the field and its limit.
  absl::Status Validate() const;
};

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.0f;
};

// Natural log of the softmax of the raw logits (before bias, penalties and temperature), as
// vLLM and OpenAI report them.
struct TokenLogprobs {
  float logprob = 0.0f;           // of the chosen token
  std::vector<TokenLogprob> top;  // the N most likely, most likely first (lowest id on ties)
};

struct SampledToken {
  int32_t id = -1;
  std::optional<TokenLogprobs> logprobs;  // set when params.logprobs >= 0
};

// The log-probabilities of `chosen` and the `top_n` most likely entries of `raw_logits`.
TokenLogprobs LogprobsOf(absl::Span<const float> raw_logits, int32_t chosen, int top_n);

class Sampler {
 public:
  // `eos_ids`: the model's end-of-sequence ids, masked (with the stop ids) before min_tokens.
  explicit Sampler(SamplingParams params, std::vector<int32_t> eos_ids = {});

  // Picks the next token from `logits` (modified in place by bias, penalties and temperature).
  // `history` is every token of the sequence so far, prompt then output; its last `generated`
  // tokens are the output (the presence and frequency penalties and min_tokens count those;
  // the repetition penalty counts all).
  SampledToken Sample(absl::Span<float> logits, absl::Span<const int32_t> history,
                      int generated);

  // The distribution Sample draws from at output position `generated`: probabilities over the
  // vocabulary after bias, penalties, temperature, top-k, min-p and top-p (0 outside the kept
  // candidates), summing to 1; at temperature 0 all mass on the argmax. `logits` is modified as
  // by Sample. Speculative sampling (core/model/self_speculative.h) compares two of them.
  std::vector<double> Distribution(absl::Span<float> logits, absl::Span<const int32_t> history,
                                   int generated) const;
  // A uniform draw in [0, 1) of output position `generated` from random stream `stream` >= 1
  // (stream 0 is Sample's own): a function of (seed, generated, stream) alone.
  double Uniform(int generated, uint32_t stream) const;

  bool IsStopToken(int32_t id) const;
  const SamplingParams& params() const { return params_; }
  // Whether Sample is the argmax of the raw logits (temperature 0, nothing that changes the
  // logits, no log-probabilities asked), so an argmax taken elsewhere (on a GPU) may stand in
  // for it. Sample draws no randomness then.
  bool greedy() const;

 private:
  // Bias, min_tokens masking and the three penalties, in that order, on the raw logits.
  void AdjustLogits(absl::Span<float> logits, absl::Span<const int32_t> history,
                    int generated) const;
  // The random draw of output position `generated`: its own engine, seeded from (seed,
  // position), so that whichever process samples a position (prefill samples the first token,
  // decode the rest; a migrated stream resumes elsewhere) draws what one process would have.
  int32_t Draw(absl::Span<const float> logits, int generated) const;
  // The kept candidates of adjusted `logits` (temperature > 0): ids by descending logit (lowest
  // id on ties), their probabilities (normalised over the top-k, before min-p and top-p), and
  // how many the min-p and top-p filters keep.
  struct Candidates {
    std::vector<int32_t> order;
    std::vector<double> probs;
    size_t keep = 0;
  };
  Candidates Filter(absl::Span<const float> logits) const;

  SamplingParams params_;
  std::vector<int32_t> eos_ids_;
};

// The id whose cumulative probability (in id order) first exceeds u * sum(probs); the last id
// with mass when rounding leaves u past the end. `probs` must have some mass.
int32_t DrawFrom(absl::Span<const double> probs, double u);

// Index of the largest value; the lowest index among equal maxima.
int32_t Argmax(absl::Span<const float> values);

}  // namespace estuary
