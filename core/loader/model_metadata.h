#pragma once
// LoadModelMetadata: what a process that runs no model needs from a model folder (the router):
// the config, the tokenizer and the generation defaults, read without opening a weight file.
//
// Reads only:
//   - a Hugging Face folder: config.json, generation_config.json (optional), tokenizer.json;
//   - a llama2.c folder: the 28-byte header of model.bin (when there is no config.json), and
//     tokenizer.bin.
// A folder with a config.json and a tokenizer but no weight file at all serves (a router pod
// mounts only these few kilobytes). LoadModel (core/model/model_loader.h) builds its tokenizer
// through the same LoadModelTokenizer, so router and workers agree on BOS and EOS.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/model/llama_config.h"
#include "core/tokenizer/tokenizer.h"

namespace estuary {

struct ModelMetadata {
  LlamaConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string format;  // "llama2.c" or "huggingface"
};

// NOT_FOUND naming the path when it holds neither format; errors of the files name the file.
absl::StatusOr<ModelMetadata> LoadModelMetadata(const std::string& path);

// The tokenizer of the model folder `dir` for `config`: tokenizer.json (BOS and EOS as the
// config says, as transformers does) or, failing that, llama2.c's tokenizer.bin. Checks that the
// tokenizer fits the config's vocabulary.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& dir,
                                                              const LlamaConfig& config);

// The model's served name by default: the folder's last path component ("stories12L").
std::string DefaultModelId(const std::string& model_path);

}  // namespace estuary
