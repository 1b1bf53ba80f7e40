#include "core/loader/widen_model.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "core/common/mapped_file.h"
#include "core/common/status_macros.h"
#include "core/loader/hf_tensor_names.h"
#include "core/loader/hf_writer.h"
#include "core/loader/rope_permute.h"
#include "core/loader/safetensors.h"
#include "core/loader/safetensors_writer.h"

namespace estuary {
namespace {

namespace fs = std::filesystem;

using IndexMap = std::vector<int64_t>;  // small index -> wide index

IndexMap Identity(int64_t n) {
  IndexMap map(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) map[static_cast<size_t>(i)] = i;
  return map;
}

// Where the small model's numbers go in the wide one (see the header).
class WidthMaps {
 public:
  WidthMaps(const LlamaConfig& small, const LlamaConfig& wide) : small_(small), wide_(wide) {}

  const IndexMap& residual() const { return residual_; }
  const IndexMap& hidden() const { return hidden_; }
  const IndexMap& query_rows() const { return query_rows_; }
  const IndexMap& kv_rows() const { return kv_rows_; }

  absl::Status Build() {
    auto too_small = [](const char* field, int small, int wide) {
      return absl::InvalidArgumentError(absl::StrCat("widen: the target's ", field, " (", wide,
                                                     ") is smaller than the model's (", small,
                                                     ")"));
    };
    if (wide_.dim < small_.dim) return too_small("dim", small_.dim, wide_.dim);
    if (wide_.hidden_dim < small_.hidden_dim) {
      return too_small("hidden_dim", small_.hidden_dim, wide_.hidden_dim);
    }
    if (wide_.n_kv_heads < small_.n_kv_heads) {
      return too_small("n_kv_heads", small_.n_kv_heads, wide_.n_kv_heads);
    }
    const int group_s = small_.n_heads / small_.n_kv_heads;
    const int group_w = wide_.n_heads / wide_.n_kv_heads;
    if (group_w < group_s) return too_small("query heads per KV head", group_s, group_w);
    if (wide_.head_dim % small_.head_dim != 0 || small_.head_dim % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("widen: the model's head_dim (", small_.head_dim,
                       ") must be even and divide the target's (", wide_.head_dim, ")"));
    }
    residual_ = Identity(small_.dim);
    hidden_ = Identity(small_.hidden_dim);
    for (int h = 0; h < small_.n_heads; ++h) {
      AppendHeadRows(h / group_s * group_w + h % group_s, query_rows_);
    }
    for (int j = 0; j < small_.n_kv_heads; ++j) AppendHeadRows(j, kv_rows_);
    return absl::OkStatus();
  }

 private:
  // The rows of small head dimensions 0..hd_s-1 in wide head `wide_head`: RoPE pair p (rows p
  // and hd_s/2 + p in the halves layout) goes to wide pair p * ratio, whose frequency
  // theta^(-2 p ratio / hd_w) is the small pair's. v and o use the same map (any one-to-one map
  // works there, as long as the two agree).
  void AppendHeadRows(int wide_head, IndexMap& rows) const {
    const int64_t ratio = wide_.head_dim / small_.head_dim;
    const int64_t half_s = small_.head_dim / 2, half_w = wide_.head_dim / 2;
    const int64_t base = int64_t{wide_head} * wide_.head_dim;
    for (int64_t c = 0; c < small_.head_dim; ++c) {
      rows.push_back(base + (c < half_s ? c * ratio : half_w + (c - half_s) * ratio));
    }
  }

  const LlamaConfig& small_;
  const LlamaConfig& wide_;
  IndexMap residual_, hidden_, query_rows_, kv_rows_;
};

// The wide f32 tensor of `wide_shape` with small[r][c] * scale at [rows[r]][cols[c]] and zeros
// elsewhere (a vector when `cols` is empty).
absl::StatusOr<Tensor> Scatter(const Tensor& small, const Shape& wide_shape, const IndexMap& rows,
                               const IndexMap& cols, float scale) {
  ESTUARY_ASSIGN_OR_RETURN(Tensor wide, Tensor::Zeros(DType::kF32, wide_shape));
  const float* in = small.data<float>();
  float* out = wide.mutable_data<float>();
  if (cols.empty()) {
    for (size_t r = 0; r < rows.size(); ++r) out[rows[r]] = in[r] * scale;
    return wide;
  }
  const int64_t wide_cols = wide_shape[1];
  for (size_t r = 0; r < rows.size(); ++r) {
    const float* src = in + r * cols.size();
    float* dst = out + rows[r] * wide_cols;
    for (size_t c = 0; c < cols.size(); ++c) dst[cols[c]] = src[c] * scale;
  }
  return wide;
}

struct Placement {
  const IndexMap* rows;
  const IndexMap* cols;  // nullptr for vectors
  float scale;
};

Placement PlacementOf(WeightRole role, const WidthMaps& maps, const IndexMap& vocab,
                      float norm_scale, float query_scale) {
  switch (role) {
    case WeightRole::kEmbedding:
    case WeightRole::kLmHead:
      return {&vocab, &maps.residual(), 1.0f};
    case WeightRole::kAttnNorm:
    case WeightRole::kFfnNorm:
    case WeightRole::kFinalNorm:
      return {&maps.residual(), nullptr, norm_scale};
    case WeightRole::kWq:
      return {&maps.query_rows(), &maps.residual(), query_scale};
    case WeightRole::kWk:
    case WeightRole::kWv:
      return {&maps.kv_rows(), &maps.residual(), 1.0f};
    case WeightRole::kWo:
      return {&maps.residual(), &maps.query_rows(), 1.0f};
    case WeightRole::kGate:
    case WeightRole::kUp:
      return {&maps.hidden(), &maps.residual(), 1.0f};
    case WeightRole::kDown:
      return {&maps.residual(), &maps.hidden(), 1.0f};
  }
  return {&maps.residual(), nullptr, 1.0f};
}

}  // namespace

absl::Status WidenLlama2cToHf(const std::string& from_dir_or_model_bin,
                              const LlamaConfig& widths, const std::string& to_dir, DType dtype) {
  ESTUARY_ASSIGN_OR_RETURN(Llama2cSource read,
                           ReadLlama2cSource(from_dir_or_model_bin, dtype, "widen"));
  LlamaCheckpoint& source = read.checkpoint;
  const LlamaConfig& small = source.config;

  LlamaConfig wide = small;
  wide.dim = widths.dim;
  wide.hidden_dim = widths.hidden_dim;
  wide.n_heads = widths.n_heads;
  wide.n_kv_heads = widths.n_kv_heads;
  wide.head_dim = widths.head_dim;
  wide.rope_style = RopeStyle::kHalves;
  wide.rms_eps = small.rms_eps * static_cast<float>(small.dim) / static_cast<float>(widths.dim);
  wide.name = absl::StrCat(small.name, "-widened");
  ESTUARY_RETURN_IF_ERROR(wide.Validate());
  WidthMaps maps(small, wide);
  ESTUARY_RETURN_IF_ERROR(maps.Build());
  const IndexMap vocab = Identity(small.vocab_size);
  const float norm_scale = static_cast<float>(std::sqrt(double(small.dim) / wide.dim));
  const float query_scale = static_cast<float>(std::sqrt(double(wide.head_dim) / small.head_dim));

  std::error_code ec;
  fs::create_directories(to_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", to_dir, ": ", ec.message()));
  const fs::path out(to_dir);
  ESTUARY_RETURN_IF_ERROR(
      WriteStringToFile((out / "tokenizer.json").string(), read.tokenizer_json));
  ESTUARY_RETURN_IF_ERROR(WriteHfConfig(to_dir, wide, dtype));

  const std::vector<HfTensorInfo> small_infos = HfLlamaTensors(small);
  const std::vector<HfTensorInfo> wide_infos = HfLlamaTensors(wide);  // same order and count
  std::vector<SafetensorsTensorSpec> specs;
  for (const HfTensorInfo& info : wide_infos) specs.push_back({info.name, dtype, info.shape});
  ESTUARY_ASSIGN_OR_RETURN(
      auto writer, SafetensorsStreamWriter::Create((out / "model.safetensors").string(), specs,
                                                   {{"format", "pt"}}));
  for (size_t i = 0; i < wide_infos.size(); ++i) {
    const HfTensorInfo& info = small_infos[i];
    Tensor tensor = WeightSlot(source.weights, info);
    if (tensor.dtype() != DType::kF32) {
      ESTUARY_ASSIGN_OR_RETURN(tensor, ConvertDType(tensor, DType::kF32));
    }
    if (info.role == WeightRole::kWq || info.role == WeightRole::kWk) {
      ESTUARY_ASSIGN_OR_RETURN(tensor, InterleavedToHalvesRows(tensor, small.head_dim));
    }
    const Placement place = PlacementOf(info.role, maps, vocab, norm_scale, query_scale);
    ESTUARY_ASSIGN_OR_RETURN(
        Tensor widened, Scatter(tensor, wide_infos[i].shape, *place.rows,
                                place.cols != nullptr ? *place.cols : IndexMap{}, place.scale));
    if (dtype != DType::kF32) {
      ESTUARY_ASSIGN_OR_RETURN(widened, ConvertDType(widened, dtype));
    }
    ESTUARY_RETURN_IF_ERROR(writer->AppendTensor(widened));
  }
  ESTUARY_RETURN_IF_ERROR(writer->Finish());
  ESTUARY_LOG(INFO) << "widened " << read.model_bin << " (dim " << small.dim << ") to "
                    << to_dir << " (dim " << wide.dim << ", hidden " << wide.hidden_dim << ", "
                    << wide.n_heads << "/" << wide.n_kv_heads << " heads of " << wide.head_dim
                    << ", " << DTypeName(dtype) << ")";
  return absl::OkStatus();
}

}  // namespace estuary
