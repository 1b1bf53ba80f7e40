#pragma once
// LoadModel: finds the checkpoint format of a path, loads weights (converting the dtype when
// asked), the tokenizer, and builds the LlamaModel. The one entry point binaries use.
//
// Accepted paths:
//   - a llama2.c folder (model.bin + tokenizer.bin) or a model.bin file beside tokenizer.bin;
//   - a Hugging Face folder (config.json, model.safetensors or an index with shards,
//     tokenizer.json, optional generation_config.json).

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/loader/checkpoint.h"
#include "core/model/llama_model.h"
#include "core/tokenizer/tokenizer.h"

namespace estuary {

struct LoadOptions {
  std::optional<DType> dtype;  // convert weights to this (f32 or bf16); keep the file's if unset
  ProgressCallback progress;   // optional
  // > 0: the context is capped at this many tokens (config.max_seq_len; --max-model-len);
  // INVALID_ARGUMENT when it exceeds the checkpoint's.
  int max_model_len = 0;
  // Weights the checkpoint maps from its file (every one the dtype leaves as it is) are copied
  // into huge-page host memory (core/common/streamed_memory.h): page-cache pages are 4 KiB,
  // and a decode GEMV streaming them ran at 3-8 GB/s instead of 25+ on a 2-core VM. Off where
  // the host copy is only a staging step (weights bound for a GPU) or memory is tighter than
  // speed; the mapping then serves the kernels.
  bool copy_mapped_weights = true;
};

struct LoadedModel {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string format;  // "llama2.c" or "huggingface"
};

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, const LoadOptions& options = {});

// Converts every weight of `weights` to `dtype` (a no-op for tensors already in it). A tied LM
// head stays tied.
absl::Status ConvertWeights(LlamaWeights& weights, DType dtype);

}  // namespace estuary
