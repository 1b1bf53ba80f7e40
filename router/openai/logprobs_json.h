#pragma once
// OpenAI's two shapes of per-token log-probabilities, from the router's TokenLogprobs:
//   completions: {"tokens": [..], "token_logprobs": [..], "top_logprobs": [{piece: lp}, ..],
//                 "text_offset": [..]}
//   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{..}]}, ..]}
// A token's text is its piece as the tokenizer spells it after the token before it
// (`TokenPiece`), which the caller supplies so that this layer links no tokenizer.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "estuary/v1/token_logprobs.pb.h"
#include "nlohmann/json.hpp"

namespace estuary::openai {

// The bytes token `id` adds after token `prev_id` (-1 at the start of the output).
using TokenPiece = std::function<std::string(int32_t prev_id, int32_t id)>;

// `ids` and `logprobs` are parallel; `prev_id` is the token before ids[0] (-1 for none);
// `text_offset` is where ids[0]'s text starts in the choice's text.
nlohmann::json CompletionLogprobs(absl::Span<const int32_t> ids,
                                  absl::Span<const estuary::v1::TokenLogprobs> logprobs,
                                  int32_t prev_id, size_t text_offset, const TokenPiece& piece);
nlohmann::json ChatLogprobs(absl::Span<const int32_t> ids,
                            absl::Span<const estuary::v1::TokenLogprobs> logprobs, int32_t prev_id,
                            const TokenPiece& piece);

}  // namespace estuary::openai
