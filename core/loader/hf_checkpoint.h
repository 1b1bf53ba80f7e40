#pragma once
// Loader for Hugging Face Llama folders: config.json, optional generation_config.json, and
// model.safetensors or model.safetensors.index.json with its shards.

#include <string>

#include "absl/status/statusor.h"
#include "core/loader/checkpoint.h"
#include "core/loader/hf_config.h"  // ReadHfConfig

namespace estuary {

// Reads the config (config.json capped at 1 MiB; generation_config.json, when present,
// overrides bos/eos), memory-maps the safetensors files and returns weights that view them
// (f32, bf16 or f16, per tensor as stored; zero-copy unless a tensor is misaligned). Checks
// that every required tensor is present with the shape the config implies. Shard names in the
// index must be plain file names inside `dir`. rope_style is kHalves; name = the folder's name.
// A tied model's lm_head shares the embedding's storage.
//
// `progress`, when set, is called once at the start and after each tensor.
// Errors name the file and the tensor or field.
absl::StatusOr<LlamaCheckpoint> LoadHfCheckpoint(const std::string& dir,
                                                 const ProgressCallback& progress = nullptr);

}  // namespace estuary
