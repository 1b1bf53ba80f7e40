#pragma once
// TokenRelay: turns a request's decode responses into the client's Chunks (design §1 step 4):
// token ids, text through the incremental detokenizer and the stop strings, exit layers,
// log-probabilities; and keeps what the Complete message's usage reports. One per request, kept
// across its attempts, so that a stream resumed on another worker (migration) continues the
// same text and counts every token once. Not thread-safe: its owner serializes the calls.

#include <cstdint>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "estuary/v1/inference.pb.h"
#include "estuary/v1/worker.pb.h"
#include "router/stop_matcher.h"

namespace estuary::router {

class TokenRelay {
 public:
  // `last_prompt_id` starts the detokenizer; `num_layers` maps backbone layers to exit layers.
  TokenRelay(const Tokenizer& tokenizer, int32_t last_prompt_id, std::vector<std::string> stops,
             bool include_stop, int num_layers);

  // Adds the tokens of `response` to `chunk`; true when a stop string matched (the tokens after
  // it are dropped). `final` flushes the text held back (a normal end only).
  bool Add(const estuary::v1::DecodeResponse& response, bool final, estuary::v1::Chunk* chunk);

  int tokens() const { return static_cast<int>(ids_.size()); }
  // Every token relayed so far, in order: what a resumed stream continues from.
  const std::vector<int32_t>& ids() const { return ids_; }
  // Usage over every attempt: `prompt_tokens`, the relayed tokens, exit layers, drafts.
  void FillUsage(int prompt_tokens, estuary::v1::Usage* usage) const;

 private:
  IncrementalDetokenizer detokenizer_;
  StopMatcher stops_;
  const int num_layers_;
  std::vector<int32_t> ids_;
  int64_t layer_sum_ = 0;
  std::vector<int64_t> histogram_;
  int64_t draft_tokens_ = 0;  // summed over attempts (a migrated stream's workers)
  int64_t accepted_tokens_ = 0;
};

}  // namespace estuary::router
