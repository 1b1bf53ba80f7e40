#include "core/model/generator.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "core/model/kv_cache.h"

namespace estuary {

std::optional<FinishReason> EndsSequence(const LlamaConfig& config, const Sampler& sampler,
                                         int32_t token, bool ignore_eos) {
  const bool is_eos =
      std::find(config.eos_ids.begin(), config.eos_ids.end(), token) != config.eos_ids.end();
  if (is_eos && !ignore_eos) return FinishReason::kEos;
  if (sampler.IsStopToken(token)) return FinishReason::kStopToken;
  return std::nullopt;
}

namespace {

// Runs `tokens` at `start_pos` and writes the last token's logits.
using StepFn = std::function<absl::Status(absl::Span<const int32_t> tokens, int start_pos,
                                          absl::Span<float> logits)>;

// The generation loop shared by both Generate overloads; `step` owns the KV cache(s).
absl::StatusOr<GenerateResult> GenerateLoop(const LlamaConfig& config,
                                            const GenerateRequest& request, const StepFn& step,
                                            const TokenCallback& on_token) {
  const int prompt_len = static_cast<int>(request.prompt_ids.size());
  GenerateResult result;
  std::vector<int32_t> history = request.prompt_ids;
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  Sampler sampler(request.sampling, config.eos_ids);

  const absl::Time start = absl::Now();
  ESTUARY_RETURN_IF_ERROR(step(request.prompt_ids, 0, absl::MakeSpan(logits)));
  const absl::Time prefill_done = absl::Now();
  result.prefill_seconds = absl::ToDoubleSeconds(prefill_done - start);

  int pos = prompt_len;
  while (true) {
    if (static_cast<int>(result.completion_ids.size()) >= request.max_tokens) {
      result.finish_reason = FinishReason::kLength;
      break;
    }
    const int32_t next =
        sampler.Sample(absl::MakeSpan(logits), history,
                       static_cast<int>(result.completion_ids.size())).id;
    if (const auto end = EndsSequence(config, sampler, next, request.ignore_eos)) {
      result.finish_reason = *end;
      break;
    }
    result.completion_ids.push_back(next);
    history.push_back(next);
    if (on_token) on_token(next);
    if (prompt_len + static_cast<int>(result.completion_ids.size()) >= config.max_seq_len) {
      result.finish_reason = FinishReason::kContext;
      break;
    }
    if (static_cast<int>(result.completion_ids.size()) >= request.max_tokens) {
      result.finish_reason = FinishReason::kLength;
      break;
    }
    ESTUARY_RETURN_IF_ERROR(step({next}, pos, absl::MakeSpan(logits)));
    ++pos;
  }
  RecordDecodeTime(prefill_done, result);
  return result;
}

}  // namespace

void RecordDecodeTime(absl::Time prefill_done, GenerateResult& result) {
  result.decode_seconds = absl::ToDoubleSeconds(absl::Now() - prefill_done);
  const size_t decoded = result.completion_ids.size() > 1 ? result.completion_ids.size() - 1 : 0;
  result.tokens_per_second =
      result.decode_seconds > 0 ? static_cast<double>(decoded) / result.decode_seconds : 0.0;
}

absl::Status ValidateGenerateRequest(const LlamaConfig& config, const GenerateRequest& request) {
  ESTUARY_RETURN_IF_ERROR(ValidatePromptIds(config, request.prompt_ids));
  if (request.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens = ", request.max_tokens, " must be >= 0"));
  }
  return request.sampling.Validate();
}

int GenerateCacheCapacity(const LlamaConfig& config, const GenerateRequest& request) {
  const int prompt_len = static_cast<int>(request.prompt_ids.size());
  return std::max(std::min(config.max_seq_len, prompt_len + request.max_tokens), prompt_len);
}

absl::StatusOr<GenerateResult> Generate(const LlamaModel& model, const GenerateRequest& request,
                                        const TokenCallback& on_token) {
  const LlamaConfig& config = model.config();
  ESTUARY_RETURN_IF_ERROR(ValidateGenerateRequest(config, request));
  ESTUARY_ASSIGN_OR_RETURN(ContiguousKvCache cache,
                           ContiguousKvCache::Create(config, GenerateCacheCapacity(config, request)));
  return GenerateLoop(
      config, request,
      [&](absl::Span<const int32_t> tokens, int start_pos, absl::Span<float> logits) {
        return model.Forward(tokens, start_pos, cache, logits);
      },
      on_token);
}

absl::StatusOr<GenerateResult> Generate(ShardedModel& model, const GenerateRequest& request,
                                        const TokenCallback& on_token,
                                        const ShardedForwardOptions& forward) {
  const LlamaConfig& config = model.config();
  ESTUARY_RETURN_IF_ERROR(ValidateGenerateRequest(config, request));
  std::vector<ContiguousKvCache> caches;
  for (int r = 0; r < model.tp_size(); ++r) {
    ESTUARY_ASSIGN_OR_RETURN(
        ContiguousKvCache cache,
        ContiguousKvCache::Create(config, GenerateCacheCapacity(config, request), model.tp_size()));
    caches.push_back(std::move(cache));
  }
  const auto kv_for = [&](int rank, size_t) -> KvView* {
    return &caches[static_cast<size_t>(rank)];
  };
  std::vector<int> backbone_layers;
  absl::StatusOr<GenerateResult> result = GenerateLoop(
      config, request,
      [&](absl::Span<const int32_t> tokens, int start_pos, absl::Span<float> logits) {
        BatchEntry entry;
        entry.tokens = tokens;
        entry.start_pos = start_pos;
        entry.exit_threshold = forward.policy.default_threshold;
        EntryOutcome outcome;
        ESTUARY_RETURN_IF_ERROR(model.Forward(absl::MakeConstSpan(&entry, 1), kv_for, forward,
                                              logits, absl::MakeSpan(&outcome, 1)));
        backbone_layers.push_back(outcome.backbone_layers);
        return absl::OkStatus();
      },
      on_token);
  if (result.ok()) result->backbone_layers = std::move(backbone_layers);
  return result;
}

}  // namespace estuary
