#pragma once
// Writing Hugging Face Llama folders: `estuary convert` (llama2.c -> HF) and `estuary synth`
// (random-weight models of real sizes for benchmarks and GPU tests).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/loader/checkpoint.h"
#include "core/model/llama_config.h"
#include "core/tensor/dtype.h"

namespace estuary {

// Writes `dir`/config.json and `dir`/generation_config.json for `config` (torch_dtype from
// `dtype`). `dir` must exist.
absl::Status WriteHfConfig(const std::string& dir, const LlamaConfig& config, DType dtype);

// A llama2.c model read for writing elsewhere (convert, widen): its checkpoint and its
// tokenizer as tokenizer.json text.
struct Llama2cSource {
  LlamaCheckpoint checkpoint;
  std::string model_bin;  // the path read
  std::string tokenizer_json;
};
// Reads `from_dir_or_model_bin` (a folder with model.bin and tokenizer.bin, or a model.bin path
// beside tokenizer.bin) for a writer of `dtype` files; INVALID_ARGUMENT, naming `command`, when
// the dtype is not one safetensors holds (f32, bf16, f16).
absl::StatusOr<Llama2cSource> ReadLlama2cSource(const std::string& from_dir_or_model_bin,
                                                DType dtype, absl::string_view command);

// Converts a llama2.c model (a folder with model.bin and tokenizer.bin, or a model.bin path
// beside tokenizer.bin) to a Hugging Face folder `to_dir` (created if needed): config.json,
// generation_config.json, tokenizer.json and model.safetensors in `dtype` (f32, bf16 or f16).
// wq and wk rows are permuted from interleaved RoPE pairs to halves; lm_head is written only
// when the model is untied. Streams tensor by tensor.
absl::Status ConvertLlama2cToHf(const std::string& from_dir_or_model_bin, const std::string& to_dir,
                                DType dtype);

// Writes a random-weight bf16 model of a known architecture to `out_dir` (created if needed):
// config.json, generation_config.json, tokenizer.json (byte-level BPE) and model.safetensors,
// or shards of at most 5 GB plus model.safetensors.index.json. The same seed gives the same
// bytes. Weights are N(0, 1/fan_in)-like, norms are 1, so activations stay finite. Tensors are
// generated and written one at a time: memory stays small even for 8B.
// Presets: SynthPresetConfig's.
absl::Status SynthesizeModel(absl::string_view preset, const std::string& out_dir, uint64_t seed);

// The shapes of the presets: "tiny" and "small" (tests), "llama-3.2-1b", "llama-1b-v512" (the
// 1B decoder with a 512-token vocabulary), "llama-3.1-8b". INVALID_ARGUMENT for others.
absl::StatusOr<LlamaConfig> SynthPresetConfig(absl::string_view preset);

}  // namespace estuary
