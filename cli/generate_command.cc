#include "cli/generate_command.h"

#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/progress_bar.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/generator.h"
#include "core/model/model_loader.h"
#include "nlohmann/json.hpp"

namespace estuary::cli {

absl::Status ValidateGenerateOptions(const GenerateOptions& options) {
  if (options.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens = ", options.max_tokens, " must be >= 0"));
  }
  if (options.threads < 0) return absl::InvalidArgumentError("--threads must be >= 0");
  if (options.dtype && *options.dtype != DType::kF32 && *options.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("--dtype must be f32 or bf16");
  }
  return options.sampling.Validate();
}

absl::Status RunGenerate(const GenerateOptions& options) {
  ESTUARY_RETURN_IF_ERROR(ValidateGenerateOptions(options));
  kernels::cpu::SetCpuThreads(options.threads);
  LoadOptions load_options;
  load_options.dtype = options.dtype;
  load_options.progress = MakeProgressReporter();
  ESTUARY_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(options.model, load_options));
  const Tokenizer& tokenizer = *loaded.tokenizer;

  GenerateRequest request;
  ESTUARY_ASSIGN_OR_RETURN(request.prompt_ids, tokenizer.Encode(options.prompt, /*add_bos=*/true));
  request.max_tokens = options.max_tokens;
  request.sampling = options.sampling;

  // The completion's text, built a complete UTF-8 piece at a time; text mode prints each piece
  // as soon as it exists.
  IncrementalDetokenizer detokenizer(tokenizer, request.prompt_ids.back());
  std::string completion_text;
  if (!options.json) std::cout << options.prompt << std::flush;
  auto on_token = [&](int32_t id) {
    const std::string piece = detokenizer.Push(id);
    completion_text += piece;
    if (!options.json) std::cout << piece << std::flush;
  };
  ESTUARY_ASSIGN_OR_RETURN(GenerateResult result, Generate(*loaded.model, request, on_token));
  const std::string tail = detokenizer.Flush();
  completion_text += tail;

  if (!options.json) {
    std::cout << tail << std::endl;
    ESTUARY_LOG(INFO) << result.completion_ids.size() << " tokens, "
                      << result.tokens_per_second << " tokens/s, finish: "
                      << FinishReasonName(result.finish_reason);
    return absl::OkStatus();
  }
  nlohmann::json out = {
      {"model", options.model},
      {"prompt", options.prompt},
      {"prompt_ids", request.prompt_ids},
      {"completion_ids", result.completion_ids},
      {"completion_text", completion_text},
      {"finish_reason", FinishReasonName(result.finish_reason)},
      {"tokens_per_second", result.tokens_per_second},
      {"prefill_seconds", result.prefill_seconds},
      {"decode_seconds", result.decode_seconds},
  };
  std::cout << out.dump() << std::endl;
  return absl::OkStatus();
}

}  // namespace estuary::cli
