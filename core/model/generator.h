#pragma once
// Generate: the single-sequence generation loop behind `estuary generate` (prompt in, tokens
// out, one contiguous KV cache). The serving engines batch many sequences; this is the simple,
// exact path and the reference they are tested against.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/model/llama_model.h"
#include "core/model/request_checks.h"  // ValidatePromptIds
#include "core/model/sharded_model.h"
#include "core/sampling/finish_reason.h"
#include "core/sampling/sampler.h"
#include "core/tokenizer/tokenizer.h"

namespace estuary {

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;  // must be non-empty and inside the vocabulary
  int max_tokens = 256;             // new tokens at most; also capped by the context length
  SamplingParams sampling;
  bool ignore_eos = false;
};


struct GenerateResult {
  std::vector<int32_t> completion_ids;  // without the EOS / stop token that ended it
  FinishReason finish_reason = FinishReason::kLength;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  double tokens_per_second = 0.0;  // decode tokens per second (after the first token)
  // Backbone layers each forward step ran (the prompt first); ShardedModel overload only.
  std::vector<int> backbone_layers;
  // Lossless mode only (self_speculative.h): tokens the river drafted, drafts the verification
  // accepted, and verification passes run.
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  int64_t verifications = 0;
  // Lossless mode: backbone layers the verification passes ran, summed over passes (each pass
  // runs the layers above the round's smallest exit once, for all of its rows).
  int64_t verified_layers = 0;
  // Lossless mode: backbone layers the drafts ran before their exits, summed over drafts.
  int64_t draft_backbone_layers = 0;
  // Lossless mode: rounds without drafts (LosslessOptions::drafting), one full-depth token each.
  int64_t plain_rounds = 0;
};

// Checks a whole request: its prompt (ValidatePromptIds), max_tokens >= 0 and the sampling
// parameters. Shared by every generation loop.
absl::Status ValidateGenerateRequest(const LlamaConfig& config, const GenerateRequest& request);
// Positions a single-sequence cache must hold for `request`: the prompt and every generated
// token that is fed back, within the context.
int GenerateCacheCapacity(const LlamaConfig& config, const GenerateRequest& request);

// Sets result's decode_seconds (now - prefill_done) and tokens_per_second (tokens after the
// first, which the prefill produced, per decode second).
void RecordDecodeTime(absl::Time prefill_done, GenerateResult& result);

// Whether sampling `token` ends the sequence before it is emitted: an EOS id of the model
// (unless ignore_eos) or one of the request's stop token ids. Shared by Generate and the decode
// engine so both stop on exactly the same tokens.
std::optional<FinishReason> EndsSequence(const LlamaConfig& config, const Sampler& sampler,
                                         int32_t token, bool ignore_eos);

// Called with each new token as it is produced (before the next forward).
using TokenCallback = std::function<void(int32_t id)>;

// Runs the prompt, then samples until an EOS id of the model (unless ignore_eos), a stop token,
// max_tokens, or the context length. INVALID_ARGUMENT for an empty prompt, an id outside the
// vocabulary, a prompt that fills the context, or bad sampling parameters.
absl::StatusOr<GenerateResult> Generate(const LlamaModel& model, const GenerateRequest& request,
                                        const TokenCallback& on_token = nullptr);
// The same over a tensor-parallel model (one contiguous cache per rank). `forward` may turn on
// the exit river (per step, as in decode) or the batch-invariant kernels; by default it runs the
// backbone with the fastest kernels, as the single-model overload. Fills
// GenerateResult::backbone_layers.
absl::StatusOr<GenerateResult> Generate(ShardedModel& model, const GenerateRequest& request,
                                        const TokenCallback& on_token = nullptr,
                                        const ShardedForwardOptions& forward = {});

}  // namespace estuary
