#include "core/loader/hf_writer.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "core/common/mapped_file.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_config.h"
#include "core/loader/hf_tensor_names.h"
#include "core/loader/llama2c_checkpoint.h"
#include "core/loader/rope_permute.h"
#include "core/loader/safetensors.h"
#include "core/loader/safetensors_writer.h"
#include "core/tokenizer/tokenizer_json_export.h"

namespace estuary {
namespace {

namespace fs = std::filesystem;

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

// The HF tensor for `info`, converted from the llama2.c weight.
absl::StatusOr<Tensor> HfTensor(const LlamaCheckpoint& source, const HfTensorInfo& info,
                                DType dtype) {
  Tensor tensor = WeightSlot(source.weights, info);
  if (info.role == WeightRole::kWq || info.role == WeightRole::kWk) {
    ESTUARY_ASSIGN_OR_RETURN(tensor, InterleavedToHalvesRows(tensor, source.config.head_dim));
  }
  if (tensor.dtype() != dtype) {
    ESTUARY_ASSIGN_OR_RETURN(tensor, ConvertDType(tensor, dtype));
  }
  return tensor;
}

}  // namespace

absl::Status WriteHfConfig(const std::string& dir, const LlamaConfig& config, DType dtype) {
  ESTUARY_RETURN_IF_ERROR(
      WriteStringToFile((fs::path(dir) / "config.json").string(), HfConfigJson(config, dtype)));
  return WriteStringToFile((fs::path(dir) / "generation_config.json").string(),
                           HfGenerationConfigJson(config));
}

absl::StatusOr<Llama2cSource> ReadLlama2cSource(const std::string& from_dir_or_model_bin,
                                                DType dtype, absl::string_view command) {
  if (SafetensorsDTypeName(dtype) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(command, ": dtype ", DTypeName(dtype),
                                                   " is not one of f32, bf16, f16"));
  }
  std::error_code ec;
  fs::path model_bin(from_dir_or_model_bin);
  if (fs::is_directory(model_bin, ec)) model_bin /= "model.bin";
  const fs::path tokenizer_bin = model_bin.parent_path() / "tokenizer.bin";
  Llama2cSource source;
  source.model_bin = model_bin.string();
  ESTUARY_ASSIGN_OR_RETURN(source.checkpoint, LoadLlama2cCheckpoint(source.model_bin));
  ESTUARY_ASSIGN_OR_RETURN(
      source.tokenizer_json,
      ExportLlama2cTokenizerJson(tokenizer_bin.string(), source.checkpoint.config.vocab_size));
  return source;
}

absl::Status ConvertLlama2cToHf(const std::string& from_dir_or_model_bin, const std::string& to_dir,
                                DType dtype) {
  ESTUARY_ASSIGN_OR_RETURN(Llama2cSource read,
                           ReadLlama2cSource(from_dir_or_model_bin, dtype, "convert"));
  const LlamaCheckpoint& source = read.checkpoint;
  const std::string& tokenizer_json = read.tokenizer_json;
  LlamaConfig config = source.config;
  config.rope_style = RopeStyle::kHalves;

  ESTUARY_RETURN_IF_ERROR(MakeDirs(to_dir));
  const fs::path out(to_dir);
  ESTUARY_RETURN_IF_ERROR(WriteStringToFile((out / "tokenizer.json").string(), tokenizer_json));
  ESTUARY_RETURN_IF_ERROR(WriteHfConfig(to_dir, config, dtype));

  const std::vector<HfTensorInfo> infos = HfLlamaTensors(config);
  std::vector<SafetensorsTensorSpec> specs;
  for (const HfTensorInfo& info : infos) specs.push_back({info.name, dtype, info.shape});
  ESTUARY_ASSIGN_OR_RETURN(
      auto writer, SafetensorsStreamWriter::Create((out / "model.safetensors").string(), specs,
                                                   {{"format", "pt"}}));
  for (const HfTensorInfo& info : infos) {
    ESTUARY_ASSIGN_OR_RETURN(Tensor tensor, HfTensor(source, info, dtype));
    ESTUARY_RETURN_IF_ERROR(writer->AppendTensor(tensor));
  }
  ESTUARY_RETURN_IF_ERROR(writer->Finish());
  ESTUARY_LOG(INFO) << "converted " << read.model_bin << " to " << to_dir << " ("
                    << DTypeName(dtype) << ", " << infos.size() << " tensors)";
  return absl::OkStatus();
}

}  // namespace estuary
