#include "core/model/model_loader.h"

#include <filesystem>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_checkpoint.h"
#include "core/loader/llama2c_checkpoint.h"
#include "core/loader/model_metadata.h"

namespace estuary {
namespace fs = std::filesystem;
namespace {

// Calls `place` on every weight tensor once; a tied LM head stays tied (it follows the
// embedding).
absl::Status ForEachWeight(LlamaWeights& weights,
                           const std::function<absl::Status(Tensor&)>& place) {
  const bool tied = weights.lm_head.defined() && weights.lm_head.raw() == weights.embedding.raw();
  ESTUARY_RETURN_IF_ERROR(place(weights.embedding));
  ESTUARY_RETURN_IF_ERROR(place(weights.final_norm));
  if (tied) {
    weights.lm_head = weights.embedding;
  } else {
    ESTUARY_RETURN_IF_ERROR(place(weights.lm_head));
  }
  for (LlamaLayerWeights& w : weights.layers) {
    for (Tensor* t : {&w.attn_norm, &w.wq, &w.wk, &w.wv, &w.wo, &w.ffn_norm, &w.w_gate, &w.w_up,
                      &w.w_down}) {
      ESTUARY_RETURN_IF_ERROR(place(*t));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLoadDType(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load weights as ", DTypeName(dtype), " (use f32 or bf16)"));
  }
  return absl::OkStatus();
}

// One weight as the model keeps it: converted to `dtype` when set and different (a new
// allocation), else copied out of the file mapping into streamed memory when `copy` is set. A
// weight the checkpoint reader already copied (a misaligned safetensors tensor) is in such memory
// and stays where it is.
absl::Status PlaceWeight(Tensor& tensor, std::optional<DType> dtype, bool copy) {
  if (!tensor.defined()) return absl::OkStatus();
  if (dtype && tensor.dtype() != *dtype) {
    ESTUARY_ASSIGN_OR_RETURN(tensor, ConvertDType(tensor, *dtype));
    return absl::OkStatus();
  }
  if (!copy || !tensor.in_file_mapping()) return absl::OkStatus();
  // A file mapping is host memory, so raw() can be read here.
  ESTUARY_ASSIGN_OR_RETURN(tensor,
                           Tensor::HostCopyOf(tensor.raw(), tensor.dtype(), tensor.shape()));
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> Build(LlamaCheckpoint checkpoint, const fs::path& dir,
                                  std::string format, const LoadOptions& options) {
  if (options.max_model_len > checkpoint.config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len = ", options.max_model_len, " exceeds the model's context length of ",
        checkpoint.config.max_seq_len));
  }
  if (options.max_model_len > 0) checkpoint.config.max_seq_len = options.max_model_len;
  if (options.dtype) ESTUARY_RETURN_IF_ERROR(CheckLoadDType(*options.dtype));
  ESTUARY_RETURN_IF_ERROR(ForEachWeight(checkpoint.weights, [&](Tensor& tensor) {
    return PlaceWeight(tensor, options.dtype, options.copy_mapped_weights);
  }));
  LoadedModel loaded;
  // The tokenizer as the router reads it (core/loader/model_metadata.h).
  ESTUARY_ASSIGN_OR_RETURN(loaded.tokenizer, LoadModelTokenizer(dir.string(), checkpoint.config));
  ESTUARY_ASSIGN_OR_RETURN(loaded.model, LlamaModel::Create(std::move(checkpoint.config),
                                                            std::move(checkpoint.weights)));
  loaded.format = std::move(format);
  return loaded;
}

absl::StatusOr<LoadedModel> LoadLlama2c(const fs::path& model_bin, const LoadOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(LlamaCheckpoint checkpoint, LoadLlama2cCheckpoint(model_bin.string()));
  return Build(std::move(checkpoint), model_bin.parent_path(), "llama2.c", options);
}

absl::StatusOr<LoadedModel> LoadHuggingFace(const fs::path& dir, const LoadOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(LlamaCheckpoint checkpoint,
                           LoadHfCheckpoint(dir.string(), options.progress));
  return Build(std::move(checkpoint), dir, "huggingface", options);
}

}  // namespace

absl::Status ConvertWeights(LlamaWeights& weights, DType dtype) {
  ESTUARY_RETURN_IF_ERROR(CheckLoadDType(dtype));
  return ForEachWeight(weights,
                       [dtype](Tensor& tensor) { return PlaceWeight(tensor, dtype, false); });
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, const LoadOptions& options) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_regular_file(p, ec) && p.filename() == "model.bin") return LoadLlama2c(p, options);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "config.json", ec)) return LoadHuggingFace(p, options);
    if (fs::exists(p / "model.bin", ec)) return LoadLlama2c(p / "model.bin", options);
    return absl::NotFoundError(absl::StrCat(
        path, ": neither a Hugging Face folder (config.json) nor a llama2.c folder (model.bin)"));
  }
  return absl::NotFoundError(absl::StrCat(path, ": no such model folder or model.bin file"));
}

}  // namespace estuary
