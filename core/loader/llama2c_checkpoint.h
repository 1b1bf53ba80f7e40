#pragma once
// Loader for llama2.c checkpoints (model.bin, "version 0" layout), the format of the shipped
// stories models. See models/stories260K/README.md for the layout.

#include <string>

#include "absl/status/statusor.h"
#include "core/loader/checkpoint.h"

namespace estuary {

// Memory-maps `model_bin_path` and returns f32 weights that view the mapping (no copy).
//
// The header (7 int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len) is
// validated before any size is computed, and the file must be exactly as long as the header
// implies; a negative vocab_size means an untied classifier follows the RoPE tables.
//
// Config: rope_style kInterleaved, rope_theta 10000, rms_eps 1e-5, bos_id 1, eos_ids {2, 1},
// name = the containing folder's name. The stories models end a story with BOS (id 1), as
// llama2.c's own generation loop does, so BOS counts as an end-of-sequence id; a converted
// Hugging Face copy lists both in generation_config.json.
//
// Errors (INVALID_ARGUMENT, DATA_LOSS for a size mismatch) name the file and the field.
absl::StatusOr<LlamaCheckpoint> LoadLlama2cCheckpoint(const std::string& model_bin_path);

}  // namespace estuary
