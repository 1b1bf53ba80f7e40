#pragma once
// The OpenAI request bodies (/v1/completions, /v1/chat/completions) translated into
// estuary.v1.GenerateRequests, one per choice (prompt x n), and how to answer them. The router's
// own validation (router/request_validation.h) still checks every GenerateRequest against the
// model: this layer checks JSON types, OpenAI's ranges and defaults, and refuses the fields
// Estuary does not implement yet rather than ignoring them.
//
// Defaults follow OpenAI: n 1, max_tokens 16 for completions (the model's remaining context for
// chat, capped by the router's default). Sampling fields a request leaves out stay unset here:
// the router fills them from the model's generation_config.json, else temperature 1.0, and
// draws a random seed (router/generation_defaults.h), so unseeded sampling differs between
// requests while the same seed gives the same output.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "estuary/v1/inference.pb.h"
#include "nlohmann/json.hpp"

namespace estuary::openai {

inline constexpr int kMaxPrompts = 16;
inline constexpr int kMaxN = 16;
inline constexpr int kMaxChoices = 32;  // prompts x n
inline constexpr int kDefaultCompletionMaxTokens = 16;

struct GenerationRequest {
  std::string model;       // as asked ("" = the served one)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool return_token_ids = false;  // extension: choices carry "token_ids"
  int n = 1;
  // -1: no log-probabilities; N >= 0: each token's and the N most likely (completions'
  // `logprobs: N`; chat's `logprobs: true` with `top_logprobs: N`).
  int logprobs = -1;
  bool echo = false;  // completions: the prompt's text comes first in each choice's text
  std::vector<std::string> echo_texts;  // with echo: each choice's prompt text (the server's)
  // One per choice, in OpenAI's order (choice index = prompt index x n + sample index). Input
  // set for completions; left empty by ParseSampling (chat sets it after the template).
  std::vector<estuary::v1::GenerateRequest> choices;
};

// The fields both endpoints share: n, stream, stream_options, sampling, stop, seed, the river
// extension (`exit_threshold`; `exit_disable`; `exit_mode` "lossy" or "lossless"), the vLLM extras. `max_tokens_default`: 0 = the
// router's default. Fills `request` except `choices`; returns the sampling template of one
// choice (the seed of choice k is seed + k).
absl::StatusOr<estuary::v1::GenerateRequest> ParseSampling(const nlohmann::json& body,
                                                           int max_tokens_default,
                                                           GenerationRequest& request);

// /v1/completions: `prompt` as a string, a list of strings, a list of token ids or a list of
// lists of token ids.
absl::StatusOr<GenerationRequest> ParseCompletionRequest(const nlohmann::json& body);

// One choice per (input, sample) for `inputs` (text or token ids already set in each).
void ExpandChoices(const std::vector<estuary::v1::GenerateRequest>& inputs,
                   const estuary::v1::GenerateRequest& sampling, GenerationRequest& request);

}  // namespace estuary::openai
