#pragma once
// Validation of a public GenerateRequest at the router (design §8), and its translation into
// what the workers see: token ids, a resolved max_tokens, sampling and exit parameters. Every
// refusal is INVALID_ARGUMENT naming the field and the limit it broke.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tokenizer/tokenizer.h"
#include "router/generation_defaults.h"
#include "estuary/v1/inference.pb.h"

namespace estuary::router {

// The served model's limits.
struct ModelLimits {
  int context_length = 0;  // prompt + generated tokens at most
  int vocab_size = 0;      // token ids in [0, vocab_size)
  int num_layers = 0;
  GenerationDefaults defaults;  // what unset sampling fields become (generation_defaults.h)
};

inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 256;
inline constexpr int kMaxStopTokenIds = 64;
// max_tokens = 0 asks for this many new tokens, or fewer when the context ends sooner.
inline constexpr int kDefaultMaxTokens = 256;

struct PreparedRequest {
  std::vector<int32_t> prompt_ids;  // BOS first for text input
  int max_tokens = 0;               // resolved: >= 1, prompt + max_tokens <= context
  // As sent to workers: max_tokens resolved, defaults and a seed filled in, no stop strings.
  estuary::v1::SamplingParams sampling;
  estuary::v1::ExitParams exit;
  std::vector<std::string> stop;    // stop strings, matched on the detokenized text
  bool include_stop_str = false;    // the matched stop string ends the text
};

// Checks `request` against the model and tokenizes text input (with BOS).
absl::StatusOr<PreparedRequest> PrepareRequest(const estuary::v1::GenerateRequest& request,
                                               const Tokenizer& tokenizer,
                                               const ModelLimits& limits);

}  // namespace estuary::router
