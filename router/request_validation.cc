#include "router/request_validation.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/sampling/sampler.h"
#include "rpc/worker_request.h"

namespace estuary::router {
namespace {

absl::Status CheckTokenIds(const char* what, absl::Span<const int32_t> ids, int vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] = ", ids[i],
                                                     " is outside the vocabulary [0, ", vocab_size,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PreparedRequest> PrepareRequest(const estuary::v1::GenerateRequest& request,
                                               const Tokenizer& tokenizer,
                                               const ModelLimits& limits) {
  PreparedRequest prepared;
  // Input.
  switch (request.input_case()) {
    case estuary::v1::GenerateRequest::kText: {
      if (request.text().empty()) return absl::InvalidArgumentError("text is empty");
      if (request.text().size() > kMaxEncodeTextBytes) {
        return absl::InvalidArgumentError(absl::StrCat("text of ", request.text().size(),
                                                       " bytes exceeds the limit of ",
                                                       kMaxEncodeTextBytes, " bytes"));
      }
      absl::StatusOr<std::vector<int32_t>> ids =
          tokenizer.Encode(std::string_view(request.text()), /*add_bos=*/true);
      if (!ids.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("text cannot be tokenized: ", ids.status().message()));
      }
      prepared.prompt_ids = std::move(*ids);
      break;
    }
    case estuary::v1::GenerateRequest::kTokens:
      if (request.tokens().ids().empty()) return absl::InvalidArgumentError("tokens.ids is empty");
      prepared.prompt_ids.assign(request.tokens().ids().begin(), request.tokens().ids().end());
      ESTUARY_RETURN_IF_ERROR(CheckTokenIds("tokens.ids", prepared.prompt_ids, limits.vocab_size));
      break;
    default:
      return absl::InvalidArgumentError("the request has no input: set text or tokens");
  }
  if (prepared.prompt_ids.empty()) {
    return absl::InvalidArgumentError("the prompt has no tokens");
  }
  const int64_t prompt = static_cast<int64_t>(prepared.prompt_ids.size());
  if (prompt >= limits.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt of ", prompt, " tokens leaves no room for a new token in the context "
                     "length of ", limits.context_length, " (--max-model-len, or the model's)"));
  }

  // Length.
  const estuary::v1::SamplingParams& s = request.sampling();
  const int64_t room = limits.context_length - prompt;
  if (s.max_tokens() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens = ", s.max_tokens(), " must be >= 0 (0 = default)"));
  }
  if (s.max_tokens() == 0) {
    prepared.max_tokens = static_cast<int>(std::min<int64_t>(kDefaultMaxTokens, room));
  } else if (s.max_tokens() > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", prompt, " tokens + sampling.max_tokens = ", s.max_tokens(),
        " exceeds the context length of ", limits.context_length,
        " (--max-model-len, or the model's; at most ", room,
        " new tokens)"));
  } else {
    prepared.max_tokens = s.max_tokens();
  }

  // Sampling ranges (the engines' own rules), stop token ids and stop strings.
  ESTUARY_RETURN_IF_ERROR(rpc::SamplingFromProto(s).Validate());
  if (s.stop_token_ids_size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop_token_ids has ",
                                                   s.stop_token_ids_size(), " ids; at most ",
                                                   kMaxStopTokenIds));
  }
  ESTUARY_RETURN_IF_ERROR(CheckTokenIds(
      "sampling.stop_token_ids", absl::MakeConstSpan(s.stop_token_ids().data(), s.stop_token_ids_size()),
      limits.vocab_size));
  for (const auto& [id, bias] : s.logit_bias()) {
    if (id < 0 || id >= limits.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias names token ", id,
                                                     ", outside the vocabulary [0, ",
                                                     limits.vocab_size, ")"));
    }
  }
  if (s.min_tokens() > prepared.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.min_tokens = ", s.min_tokens(),
                                                   " exceeds max_tokens = ", prepared.max_tokens));
  }
  if (s.stop_size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop has ", s.stop_size(),
                                                   " strings; at most ", kMaxStopStrings));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const std::string& stop = s.stop(i);
    if (stop.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop[", i, "] is empty"));
    }
    if (stop.size() > static_cast<size_t>(kMaxStopStringBytes)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.stop[", i, "] has ", stop.size(),
                                                     " bytes; at most ", kMaxStopStringBytes));
    }
    prepared.stop.push_back(stop);
  }

  prepared.include_stop_str = s.include_stop_str_in_output();

  // Exit river.
  const float tau = request.exit().threshold();
  if (!(tau >= -1.0f && tau <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exit.threshold = ", tau, " must be in [-1, 2] (0 = the server default)"));
  }
  if (!estuary::v1::ExitMode_IsValid(request.exit().mode())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exit.mode = ", request.exit().mode(),
        " is not an exit mode (0 = the server default, 1 = lossy, 2 = lossless)"));
  }
  prepared.exit = request.exit();

  prepared.sampling = s;
  prepared.sampling.set_max_tokens(prepared.max_tokens);
  prepared.sampling.clear_stop();
  ApplyGenerationDefaults(limits.defaults, prepared.sampling);
  return prepared;
}

}  // namespace estuary::router
