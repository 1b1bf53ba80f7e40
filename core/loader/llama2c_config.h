#pragma once
// The config of a llama2.c checkpoint, from the 7 int32 at the start of model.bin (dim,
// hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len), with the conventions of the
// format (see llama2c_checkpoint.h). Kept apart from the weight loader so that a process that
// serves no weights (the router) reads 28 bytes and links no tensor code.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/model/llama_config.h"

namespace estuary {

// Validated; errors name the file and the field.
absl::StatusOr<LlamaConfig> ConfigFromLlama2cHeader(const int32_t (&header)[7],
                                                    const std::string& model_bin_path);

// Reads only the header (the file size is not checked against the weights).
absl::StatusOr<LlamaConfig> ReadLlama2cConfig(const std::string& model_bin_path);

}  // namespace estuary
