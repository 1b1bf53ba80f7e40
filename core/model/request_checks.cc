#include "core/model/request_checks.h"

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace estuary {

absl::Status ValidatePromptIds(const LlamaConfig& config, absl::Span<const int32_t> prompt_ids) {
  if (prompt_ids.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  for (int32_t id : prompt_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", id,
                                                     " outside the vocabulary [0, ",
                                                     config.vocab_size, ")"));
    }
  }
  if (static_cast<int64_t>(prompt_ids.size()) >= config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", prompt_ids.size(),
                                                   " tokens leaves no room in the context of ",
                                                   config.max_seq_len));
  }
  return absl::OkStatus();
}

absl::Status ValidateExitThreshold(std::optional<float> threshold) {
  if (threshold && !(*threshold >= -1.0f && *threshold <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exit threshold ", *threshold, " must be in [-1, 2]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateEngineRequest(const LlamaConfig& config,
                                   absl::Span<const int32_t> prompt_ids,
                                   const SamplingParams& sampling,
                                   std::optional<float> exit_threshold) {
  ESTUARY_RETURN_IF_ERROR(ValidatePromptIds(config, prompt_ids));
  ESTUARY_RETURN_IF_ERROR(sampling.Validate());
  return ValidateExitThreshold(exit_threshold);
}

}  // namespace estuary
