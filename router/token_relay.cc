#include "router/token_relay.h"

#include <algorithm>
#include <utility>

namespace estuary::router {

TokenRelay::TokenRelay(const Tokenizer& tokenizer, int32_t last_prompt_id,
                       std::vector<std::string> stops, bool include_stop, int num_layers)
    : detokenizer_(tokenizer, last_prompt_id),
      stops_(std::move(stops), include_stop),
      num_layers_(num_layers),
      histogram_(static_cast<size_t>(num_layers) + 1, 0) {}

bool TokenRelay::Add(const estuary::v1::DecodeResponse& response, bool final,
                     estuary::v1::Chunk* chunk) {
  std::string text;
  // Log-probabilities pass through only when the worker gave one per token.
  const bool with_logprobs = response.logprobs_size() == response.token_ids_size();
  draft_tokens_ += response.draft_tokens();  // the final response of a lossless request
  accepted_tokens_ += response.accepted_tokens();
  for (int i = 0; i < response.token_ids_size(); ++i) {
    const int32_t id = response.token_ids(i);
    const int layers =
        i < response.backbone_layers_size() ? response.backbone_layers(i) : num_layers_;
    chunk->add_token_ids(id);
    if (with_logprobs) *chunk->add_logprobs() = response.logprobs(i);
    chunk->add_exit_layers(layers >= num_layers_ || layers <= 0 ? -1 : layers - 1);
    ids_.push_back(id);
    layer_sum_ += std::clamp(layers, 0, num_layers_);
    ++histogram_[static_cast<size_t>(std::clamp(layers, 0, num_layers_))];
    StopMatcher::Result r = stops_.Push(detokenizer_.Push(id));
    text += r.text;
    if (r.stopped) {
      chunk->mutable_text()->append(text);
      return true;
    }
  }
  if (final) {
    StopMatcher::Result r = stops_.Push(detokenizer_.Flush());
    text += r.text;
    if (r.stopped) {
      chunk->mutable_text()->append(text);
      return true;
    }
    text += stops_.Flush();
  }
  chunk->mutable_text()->append(text);
  return false;
}

void TokenRelay::FillUsage(int prompt_tokens, estuary::v1::Usage* usage) const {
  const int tokens = this->tokens();
  usage->set_prompt_tokens(prompt_tokens);
  usage->set_completion_tokens(tokens);
  usage->set_mean_backbone_layers(tokens > 0 ? static_cast<double>(layer_sum_) / tokens : 0.0);
  for (int64_t n : histogram_) usage->add_exit_layer_histogram(n);
  usage->set_draft_tokens(draft_tokens_);
  usage->set_accepted_tokens(accepted_tokens_);
}

}  // namespace estuary::router
