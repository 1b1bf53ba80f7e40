#pragma once
// Hugging Face config.json / generation_config.json <-> LlamaConfig.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/llama_config.h"
#include "core/tensor/dtype.h"

namespace estuary {

// Largest config.json / generation_config.json accepted.
inline constexpr size_t kHfConfigMaxBytes = size_t{1} << 20;

// Reads a Llama config.json (architectures LlamaForCausalLM or model_type llama). Fields absent
// from the file take the transformers LlamaConfig defaults (num_key_value_heads = heads,
// head_dim = hidden_size / heads, rms_norm_eps 1e-6, rope_theta 10000, untied, bos 1, eos 2);
// rope_scaling "llama3" is supported, other types are UNIMPLEMENTED. Sets rope_style kHalves.
// Does not call Validate(). Errors name `file_name` and the field.
absl::StatusOr<LlamaConfig> ParseHfConfigJson(absl::string_view json, absl::string_view file_name);

// Applies generation_config.json: its bos_token_id and eos_token_id (an int or a list), when
// present and not null, replace the config's.
absl::Status ApplyHfGenerationConfigJson(absl::string_view json, absl::string_view file_name,
                                         LlamaConfig& config);

// `dir`/config.json with `dir`/generation_config.json applied when present, named after the
// folder and validated: the config LoadHfCheckpoint uses, read without touching a weight file.
absl::StatusOr<LlamaConfig> ReadHfConfig(const std::string& dir);

// The config.json / generation_config.json text for `config` (torch_dtype from `dtype`).
std::string HfConfigJson(const LlamaConfig& config, DType dtype);
std::string HfGenerationConfigJson(const LlamaConfig& config);

}  // namespace estuary
