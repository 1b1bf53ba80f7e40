#pragma once
// The checks every engine runs on a request before it takes it (the decode and prefill engines,
// the generation loop): the prompt against the model, the sampling parameters, the exit
// threshold. Kept apart from the engines and the forward pass (in estuary::model_config, no
// kernels) so that the fuzz build runs exactly these checks on decoded WorkerRequests
// (fuzz/worker_request_fuzzer.cc). Every refusal is INVALID_ARGUMENT naming the limit.

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/model/llama_config.h"
#include "core/sampling/sampler.h"

namespace estuary {

// Checks a prompt against the model: non-empty, every id inside the vocabulary, and room for
// at least one generated token in the context.
absl::Status ValidatePromptIds(const LlamaConfig& config, absl::Span<const int32_t> prompt_ids);

// An exit threshold τ, when a request sets one, lies in [-1, 2].
absl::Status ValidateExitThreshold(std::optional<float> threshold);

// What both worker engines check first: the prompt, the sampling parameters, the exit threshold.
absl::Status ValidateEngineRequest(const LlamaConfig& config,
                                   absl::Span<const int32_t> prompt_ids,
                                   const SamplingParams& sampling,
                                   std::optional<float> exit_threshold);

}  // namespace estuary
