#pragma once
// What the decode engine takes in (DecodeRequest) and gives out (TokenEvent). The gRPC layer
// converts its protos to and from these at the service edge.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/model/generator.h"
#include "core/sampling/sampler.h"

namespace estuary {

struct DecodeRequest {
  std::string request_id;           // unique among live requests
  std::vector<int32_t> prompt_ids;  // non-empty, inside the vocabulary
  int max_tokens = 256;
  SamplingParams sampling;
  std::optional<float> exit_threshold;  // τ; the engine's default when unset
  bool exit_disabled = false;           // every layer on the backbone
  bool ignore_eos = false;
  // Exit mode lossless: the river drafts, the backbone verifies, so the tokens are the full
  // model's (core/model/lossless_round.h); needs the engine's river, CPU ranks only.
  bool lossless = false;
  // A resumed (migrated) stream: the last `resumed_output` ids of prompt_ids are output already
  // generated elsewhere (WorkerRequest.resumed_output_tokens). Sampling continues at that output
  // position, the penalties and min_tokens count them, max_tokens includes them; only the new
  // tokens are emitted. In [0, prompt_ids.size()) and below max_tokens.
  int resumed_output = 0;
};

// One event per generated token, then (or with the last token) the final one.
struct TokenEvent {
  std::string request_id;
  int32_t token_id = -1;        // -1 on a final event that carries no token
  int backbone_layers = 0;      // layers this token ran on the backbone (n_layers: full depth)
  std::optional<TokenLogprobs> logprobs;  // when the request asked for logprobs
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;
  absl::Status status;          // CANCELLED on abort, RESOURCE_EXHAUSTED if it can never fit
  // On the final event of a lossless request: drafts verified and drafts kept.
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
};

// Called on the engine's thread, in order per request. Must not call back into the engine.
using TokenSink = std::function<void(const TokenEvent&)>;

}  // namespace estuary
