#pragma once
// The JSON OpenAI clients read back: the whole body of a non-streamed answer, and the chunks of
// a streamed one (Server-Sent Events: `data: {json}\n\n` each, then `data: [DONE]\n\n`), for
// /v1/completions ("text_completion") and /v1/chat/completions ("chat.completion",
// "chat.completion.chunk"). Usage counts each prompt once (not once per sample) and carries the
// exit river's figures as an extension: "estuary": {"mean_backbone_layers", "num_layers"}.

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/types/span.h"
#include "estuary/v1/inference.pb.h"
#include "nlohmann/json.hpp"
#include "router/openai/logprobs_json.h"

namespace estuary::openai {

enum class Endpoint { kCompletions, kChat };

struct ResponseEnvelope {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  int n = 1;            // samples per prompt (usage counts a prompt once)
  int num_layers = 0;   // the model's, for the river's figures
  bool return_token_ids = false;
  int logprobs = -1;  // >= 0: choices carry "logprobs" (see logprobs_json.h)
  TokenPiece piece;   // a token's text, for "logprobs"; set when logprobs >= 0
};

// What one choice has produced so far.
struct ChoiceResult {
  std::string text;  // the echoed prompt (completions' echo), then the generated text
  size_t echo_bytes = 0;  // how much of `text` is the echoed prompt
  std::vector<int32_t> token_ids;
  std::vector<estuary::v1::TokenLogprobs> logprobs;  // parallel to token_ids when asked
  std::string finish_reason;  // "" while running
  estuary::v1::Usage usage;
};

// "stop" for EOS, a stop string or a stop token; "length" for max_tokens or the context.
std::string FinishReasonName(estuary::v1::FinishReason reason);

nlohmann::json UsageJson(const ResponseEnvelope& envelope, const std::vector<ChoiceResult>& choices);
// The non-streamed answer.
nlohmann::json FullBody(const ResponseEnvelope& envelope, const std::vector<ChoiceResult>& choices);
// The log-probabilities of a streamed delta: its tokens', the token before them (-1: none) and
// where the delta's text starts in the choice's text.
struct DeltaLogprobs {
  absl::Span<const estuary::v1::TokenLogprobs> logprobs;
  int32_t prev_id = -1;
  size_t text_offset = 0;
};
// A streamed delta of one choice (`role_first`: chat's first chunk of a choice names the role).
nlohmann::json DeltaChunk(const ResponseEnvelope& envelope, int index, absl::string_view text,
                          const std::vector<int32_t>& token_ids, bool role_first,
                          const DeltaLogprobs& logprobs = {});
// A choice's last streamed chunk: empty delta, its finish_reason.
nlohmann::json FinishChunk(const ResponseEnvelope& envelope, int index,
                           absl::string_view finish_reason);
// The usage chunk (stream_options.include_usage): "choices": [].
nlohmann::json UsageChunk(const ResponseEnvelope& envelope, const std::vector<ChoiceResult>& choices);

// One SSE event of `json` (dumped with invalid UTF-8 replaced: JSON never fails to print).
std::string SseEvent(const nlohmann::json& json);
inline constexpr absl::string_view kSseDone = "data: [DONE]\n\n";
// `json` as text, invalid UTF-8 replaced by U+FFFD.
std::string Dump(const nlohmann::json& json);

}  // namespace estuary::openai
