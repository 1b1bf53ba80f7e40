#include "core/loader/model_metadata.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_config.h"
#include "core/loader/llama2c_config.h"
#include "core/tokenizer/hf_tokenizer.h"
#include "core/tokenizer/llama2c_tokenizer.h"

namespace estuary {
namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& dir,
                                                              const LlamaConfig& config) {
  std::error_code ec;
  const fs::path folder(dir);
  std::unique_ptr<Tokenizer> tokenizer;
  if (fs::exists(folder / "tokenizer.json", ec)) {
    HfTokenizerOptions options;
    options.bos_id = config.bos_id;
    options.eos_ids = std::vector<int32_t>(config.eos_ids.begin(), config.eos_ids.end());
    ESTUARY_ASSIGN_OR_RETURN(tokenizer,
                             LoadHfTokenizer((folder / "tokenizer.json").string(), options));
  } else if (fs::exists(folder / "tokenizer.bin", ec)) {
    ESTUARY_ASSIGN_OR_RETURN(
        tokenizer, LoadLlama2cTokenizer((folder / "tokenizer.bin").string(), config.vocab_size));
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no tokenizer (tokenizer.json or tokenizer.bin)"));
  }
  if (tokenizer->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": the tokenizer has ",
                                                   tokenizer->vocab_size(),
                                                   " tokens, the model only ", config.vocab_size));
  }
  return tokenizer;
}

absl::StatusOr<ModelMetadata> LoadModelMetadata(const std::string& path) {
  std::error_code ec;
  fs::path dir(path);
  if (fs::is_regular_file(dir, ec) && dir.filename() == "model.bin") dir = dir.parent_path();
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such model folder or model.bin file"));
  }
  ModelMetadata metadata;
  if (fs::exists(dir / "config.json", ec)) {
    ESTUARY_ASSIGN_OR_RETURN(metadata.config, ReadHfConfig(dir.string()));
    metadata.format = "huggingface";
  } else if (fs::exists(dir / "model.bin", ec)) {
    ESTUARY_ASSIGN_OR_RETURN(metadata.config, ReadLlama2cConfig((dir / "model.bin").string()));
    metadata.format = "llama2.c";
  } else {
    return absl::NotFoundError(absl::StrCat(
        path, ": neither a Hugging Face folder (config.json) nor a llama2.c folder (model.bin)"));
  }
  ESTUARY_ASSIGN_OR_RETURN(metadata.tokenizer, LoadModelTokenizer(dir.string(), metadata.config));
  return metadata;
}

std::string DefaultModelId(const std::string& model_path) {
  fs::path path(model_path);
  while (!path.empty() && path.filename().empty()) path = path.parent_path();
  return path.filename().string();
}

}  // namespace estuary
