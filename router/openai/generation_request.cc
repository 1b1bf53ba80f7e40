#include "router/openai/generation_request.h"

#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/sampling/sampler.h"
#include "router/openai/api_error.h"
#include "router/openai/request_fields.h"

namespace estuary::openai {
namespace {

constexpr int64_t kMaxTokenId = std::numeric_limits<int32_t>::max();
constexpr size_t kMaxPromptIds = 1 << 20;

// A list of token ids from `value` (prompt or prompt[i]).
absl::StatusOr<estuary::v1::GenerateRequest> IdsInput(const nlohmann::json& value,
                                                      const std::string& name) {
  nlohmann::json holder = {{name, value}};
  ESTUARY_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                           IntsField(holder, name, kMaxPromptIds, 0, kMaxTokenId));
  if (ids.empty()) return InvalidField(name, "is an empty list of token ids");
  estuary::v1::GenerateRequest input;
  for (int64_t id : ids) input.mutable_tokens()->add_ids(static_cast<int32_t>(id));
  return input;
}

estuary::v1::GenerateRequest TextInput(const std::string& text) {
  estuary::v1::GenerateRequest input;
  input.set_text(text);
  return input;
}

// Completions' `logprobs: N` (an integer), or chat's `logprobs: true` with `top_logprobs: N`.
absl::StatusOr<int> ParseLogprobs(const nlohmann::json& body) {
  const nlohmann::json* logprobs = Field(body, "logprobs");
  ESTUARY_ASSIGN_OR_RETURN(const int64_t top, IntField(body, "top_logprobs", 0, 0, kMaxLogprobs));
  if (logprobs == nullptr) {
    if (Field(body, "top_logprobs") != nullptr && top > 0) {
      return InvalidField("top_logprobs", "needs logprobs: true");
    }
    return -1;
  }
  if (logprobs->is_boolean()) return logprobs->get<bool>() ? static_cast<int>(top) : -1;
  ESTUARY_ASSIGN_OR_RETURN(const int64_t n, IntField(body, "logprobs", 0, 0, kMaxLogprobs));
  return static_cast<int>(n);
}

// {"token id": bias, ...}; ids are checked against the vocabulary by the router.
absl::Status ParseLogitBias(const nlohmann::json& body,
                            google::protobuf::Map<int32_t, float>& out) {
  const nlohmann::json* bias = Field(body, "logit_bias");
  if (bias == nullptr) return absl::OkStatus();
  if (!bias->is_object()) return InvalidField("logit_bias", "must be an object of token id: bias");
  if (bias->size() > kMaxLogitBiasEntries) {
    return InvalidField("logit_bias", absl::StrCat("has ", bias->size(), " entries; at most ",
                                                   kMaxLogitBiasEntries));
  }
  for (const auto& [key, value] : bias->items()) {
    const std::string name = absl::StrCat("logit_bias[\"", key, "\"]");
    int32_t id = 0;
    if (!absl::SimpleAtoi(key, &id) || id < 0) {
      return InvalidField(name, "must be keyed by a token id (a non-negative integer)");
    }
    if (!value.is_number()) return InvalidField(name, "must be a number");
    const double v = value.get<double>();
    if (!(v >= -100.0 && v <= 100.0)) return InvalidField(name, "must be in [-100, 100]");
    out[id] = static_cast<float>(v);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<estuary::v1::GenerateRequest> ParseSampling(const nlohmann::json& body,
                                                           int max_tokens_default,
                                                           GenerationRequest& request) {
  if (!body.is_object()) return InvalidField("body", "must be a JSON object");
  ESTUARY_ASSIGN_OR_RETURN(request.model, StringField(body, "model", ""));
  ESTUARY_ASSIGN_OR_RETURN(request.stream, BoolField(body, "stream", false));
  if (const nlohmann::json* options = Field(body, "stream_options")) {
    if (!options->is_object()) return InvalidField("stream_options", "must be an object");
    if (!request.stream) return InvalidField("stream_options", "is only allowed with stream");
    ESTUARY_ASSIGN_OR_RETURN(request.include_usage,
                             BoolField(*options, "include_usage", false));
  }
  ESTUARY_ASSIGN_OR_RETURN(request.return_token_ids, BoolField(body, "return_token_ids", false));
  ESTUARY_ASSIGN_OR_RETURN(const int64_t n, IntField(body, "n", 1, 1, kMaxN));
  request.n = static_cast<int>(n);
  ESTUARY_RETURN_IF_ERROR(StringField(body, "user", "").status());  // accepted, not used

  ESTUARY_ASSIGN_OR_RETURN(request.logprobs, ParseLogprobs(body));
  ESTUARY_ASSIGN_OR_RETURN(request.echo, BoolField(body, "echo", false));
  if (request.echo && request.logprobs >= 0) {
    return InvalidField("echo", "with logprobs is not supported (prompt log-probabilities are "
                                "not computed); drop one of them");
  }

  // Not implemented yet: refused unless neutral.
  ESTUARY_RETURN_IF_ERROR(RefuseUnsupported(body, "best_of", 1));
  ESTUARY_RETURN_IF_ERROR(RefuseUnsupported(body, "suffix", ""));
  ESTUARY_RETURN_IF_ERROR(RefuseUnsupported(body, "skip_special_tokens", true));
  ESTUARY_RETURN_IF_ERROR(RefuseUnsupported(body, "tools", nlohmann::json::array()));
  ESTUARY_RETURN_IF_ERROR(RefuseUnsupported(body, "response_format", nlohmann::json::object()));

  estuary::v1::GenerateRequest one;
  estuary::v1::SamplingParams& s = *one.mutable_sampling();
  // Absent fields stay at the wire's "default" (unset, or 0) for the router to fill.
  if (Field(body, "temperature") != nullptr) {
    ESTUARY_ASSIGN_OR_RETURN(const double temperature,
                             NumberField(body, "temperature", 1.0, 0.0, 2.0));
    s.set_temperature(static_cast<float>(temperature));
  }
  ESTUARY_ASSIGN_OR_RETURN(const double top_p, NumberField(body, "top_p", 0.0, 0.0, 1.0));
  if (Field(body, "top_p") != nullptr && top_p == 0.0) {
    return InvalidField("top_p", "must be in (0, 1]");
  }
  s.set_top_p(static_cast<float>(top_p));
  ESTUARY_ASSIGN_OR_RETURN(const int64_t top_k, IntField(body, "top_k", 0, -1, 1 << 20));
  s.set_top_k(top_k < 0 ? 0 : static_cast<int32_t>(top_k));  // vLLM: -1 = off
  ESTUARY_ASSIGN_OR_RETURN(const double min_p, NumberField(body, "min_p", 0.0, 0.0, 1.0));
  s.set_min_p(static_cast<float>(min_p));
  ESTUARY_ASSIGN_OR_RETURN(const double repetition,
                           NumberField(body, "repetition_penalty", 0.0, 0.0, 10.0));
  if (Field(body, "repetition_penalty") != nullptr && repetition == 0.0) {
    return InvalidField("repetition_penalty", "must be > 0");
  }
  s.set_repetition_penalty(static_cast<float>(repetition));
  ESTUARY_ASSIGN_OR_RETURN(const double presence,
                           NumberField(body, "presence_penalty", 0.0, -2.0, 2.0));
  s.set_presence_penalty(static_cast<float>(presence));
  ESTUARY_ASSIGN_OR_RETURN(const double frequency,
                           NumberField(body, "frequency_penalty", 0.0, -2.0, 2.0));
  s.set_frequency_penalty(static_cast<float>(frequency));
  ESTUARY_RETURN_IF_ERROR(ParseLogitBias(body, *s.mutable_logit_bias()));
  ESTUARY_ASSIGN_OR_RETURN(const int64_t min_tokens, IntField(body, "min_tokens", 0, 0, 1 << 24));
  s.set_min_tokens(static_cast<int32_t>(min_tokens));
  if (request.logprobs >= 0) s.set_logprobs(request.logprobs);
  ESTUARY_ASSIGN_OR_RETURN(bool ignore_eos, BoolField(body, "ignore_eos", false));
  s.set_ignore_eos(ignore_eos);

  // max_completion_tokens (chat's newer name) wins over max_tokens.
  ESTUARY_ASSIGN_OR_RETURN(const int64_t max_tokens,
                           IntField(body, "max_tokens", max_tokens_default, 1, 1 << 24));
  ESTUARY_ASSIGN_OR_RETURN(const int64_t max_completion,
                           IntField(body, "max_completion_tokens", max_tokens, 1, 1 << 24));
  s.set_max_tokens(static_cast<int32_t>(max_completion));

  ESTUARY_ASSIGN_OR_RETURN(const bool include_stop,
                           BoolField(body, "include_stop_str_in_output", false));
  s.set_include_stop_str_in_output(include_stop);
  ESTUARY_ASSIGN_OR_RETURN(std::vector<std::string> stop, StringsField(body, "stop", 16));
  for (std::string& text : stop) s.add_stop(std::move(text));
  ESTUARY_ASSIGN_OR_RETURN(std::vector<int64_t> stop_ids,
                           IntsField(body, "stop_token_ids", 64, 0, kMaxTokenId));
  for (int64_t id : stop_ids) s.add_stop_token_ids(static_cast<int32_t>(id));

  if (Field(body, "seed") != nullptr) {  // else the router draws one per choice
    ESTUARY_ASSIGN_OR_RETURN(const int64_t seed,
                             IntField(body, "seed", 0, std::numeric_limits<int64_t>::min(),
                                      std::numeric_limits<int64_t>::max()));
    s.set_seed(static_cast<uint64_t>(seed));
  }

  // The river per request (vLLM-style extra_body fields).
  ESTUARY_ASSIGN_OR_RETURN(const double tau, NumberField(body, "exit_threshold", 0.0, 0.0, 1.0));
  one.mutable_exit()->set_threshold(static_cast<float>(tau));
  ESTUARY_ASSIGN_OR_RETURN(bool disable, BoolField(body, "exit_disable", false));
  one.mutable_exit()->set_disable(disable);
  ESTUARY_ASSIGN_OR_RETURN(const std::string mode, StringField(body, "exit_mode", ""));
  if (mode == "lossless") {
    one.mutable_exit()->set_mode(estuary::v1::EXIT_MODE_LOSSLESS);
  } else if (mode == "lossy") {
    one.mutable_exit()->set_mode(estuary::v1::EXIT_MODE_LOSSY);
  } else if (!mode.empty()) {
    return InvalidField("exit_mode", absl::StrCat("\"", mode, "\" is not \"lossy\" or \"lossless\""));
  }
  return one;
}

void ExpandChoices(const std::vector<estuary::v1::GenerateRequest>& inputs,
                   const estuary::v1::GenerateRequest& sampling, GenerationRequest& request) {
  request.choices.clear();
  for (const estuary::v1::GenerateRequest& input : inputs) {
    for (int k = 0; k < request.n; ++k) {
      estuary::v1::GenerateRequest choice = sampling;
      if (input.has_tokens()) {
        *choice.mutable_tokens() = input.tokens();
      } else {
        choice.set_text(input.text());
      }
      choice.set_model(request.model);
      if (sampling.sampling().has_seed()) {
        choice.mutable_sampling()->set_seed(sampling.sampling().seed() +
                                            static_cast<uint64_t>(request.choices.size()));
      }
      request.choices.push_back(std::move(choice));
    }
  }
}

absl::StatusOr<GenerationRequest> ParseCompletionRequest(const nlohmann::json& body) {
  GenerationRequest request;
  ESTUARY_ASSIGN_OR_RETURN(estuary::v1::GenerateRequest sampling,
                           ParseSampling(body, kDefaultCompletionMaxTokens, request));
  const nlohmann::json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return InvalidField("prompt", "is required");
  std::vector<estuary::v1::GenerateRequest> inputs;
  if (prompt->is_string()) {
    inputs.push_back(TextInput(prompt->get<std::string>()));
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    ESTUARY_ASSIGN_OR_RETURN(estuary::v1::GenerateRequest ids, IdsInput(*prompt, "prompt"));
    inputs.push_back(std::move(ids));
  } else if (prompt->is_array() && !prompt->empty()) {
    if (prompt->size() > static_cast<size_t>(kMaxPrompts)) {
      return InvalidField("prompt", absl::StrCat("has ", prompt->size(), " prompts; at most ",
                                                 kMaxPrompts));
    }
    for (size_t i = 0; i < prompt->size(); ++i) {
      const nlohmann::json& item = (*prompt)[i];
      const std::string name = absl::StrCat("prompt[", i, "]");
      if (item.is_string()) {
        inputs.push_back(TextInput(item.get<std::string>()));
      } else if (item.is_array()) {
        ESTUARY_ASSIGN_OR_RETURN(estuary::v1::GenerateRequest ids, IdsInput(item, name));
        inputs.push_back(std::move(ids));
      } else {
        return InvalidField(name, "must be a string or a list of token ids");
      }
    }
  } else {
    return InvalidField("prompt", "must be a string, a list of strings, a list of token ids or "
                                  "a list of lists of token ids (and not empty)");
  }
  if (inputs.size() * static_cast<size_t>(request.n) > static_cast<size_t>(kMaxChoices)) {
    return InvalidField("n", absl::StrCat(inputs.size(), " prompts x n = ", request.n,
                                          " exceeds ", kMaxChoices, " choices"));
  }
  ExpandChoices(inputs, sampling, request);
  return request;
}

}  // namespace estuary::openai
