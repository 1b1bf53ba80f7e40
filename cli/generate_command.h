#pragma once
// `estuary generate`: load a model, run one prompt, print the completion (or one JSON object).

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/sampling/sampler.h"
#include "core/tensor/dtype.h"

namespace estuary::cli {

struct GenerateOptions {
  std::string model;  // resolved path
  std::string prompt;
  int max_tokens = 256;
  SamplingParams sampling;
  std::optional<DType> dtype;
  bool json = false;
  int threads = 0;  // 0: library default
};

absl::Status ValidateGenerateOptions(const GenerateOptions& options);
absl::Status RunGenerate(const GenerateOptions& options);

}  // namespace estuary::cli
