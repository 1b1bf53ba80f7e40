#include "core/loader/llama2c_checkpoint.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/mapped_file.h"
#include "core/common/status_macros.h"
#include "core/loader/llama2c_config.h"
#include "core/loader/mapped_buffer.h"

namespace estuary {
namespace {

constexpr int64_t kHeaderBytes = 7 * 4;

// Hands out consecutive f32 tensors of the mapping. Sizes were checked against the file first.
class Cursor {
 public:
  explicit Cursor(std::shared_ptr<Buffer> storage) : storage_(std::move(storage)) {}

  absl::StatusOr<Tensor> Next(Shape shape) {
    ESTUARY_ASSIGN_OR_RETURN(Tensor t, Tensor::View(storage_, offset_, DType::kF32, shape));
    offset_ += t.nbytes();
    return t;
  }
  void Skip(int64_t floats) { offset_ += static_cast<size_t>(floats) * 4; }
  size_t offset() const { return offset_; }

 private:
  std::shared_ptr<Buffer> storage_;
  size_t offset_ = kHeaderBytes;
};

}  // namespace

absl::StatusOr<LlamaCheckpoint> LoadLlama2cCheckpoint(const std::string& model_bin_path) {
  ESTUARY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
                           MappedFile::Open(model_bin_path));
  const int64_t file_size = static_cast<int64_t>(file->size());
  if (file_size < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(model_bin_path, ": file is ", file_size,
                                            " bytes, shorter than the ", kHeaderBytes,
                                            "-byte llama2.c header"));
  }
  int32_t header[7];
  std::memcpy(header, file->data(), sizeof(header));  // little-endian, as written by llama2.c
  const auto [dim, hidden_dim, n_layers, n_heads, n_kv_heads, raw_vocab, seq_len] =
      std::to_array(header);

  LlamaCheckpoint checkpoint;
  ESTUARY_ASSIGN_OR_RETURN(checkpoint.config, ConfigFromLlama2cHeader(header, model_bin_path));
  const LlamaConfig& config = checkpoint.config;
  const bool tied = config.tied_embeddings;

  // Validate() bounds every field, so these products fit comfortably in int64.
  const int64_t d = dim, hd = config.head_dim, h = hidden_dim, l = n_layers;
  const int64_t v = config.vocab_size, kv_dim = int64_t{n_kv_heads} * hd;
  const int64_t q_dim = int64_t{n_heads} * hd;
  const int64_t rope_floats = int64_t{seq_len} * hd / 2;
  int64_t floats = v * d                                 // token embedding
                   + l * d                               // rms_att
                   + l * q_dim * d + 2 * l * kv_dim * d  // wq, wk, wv
                   + l * d * q_dim                       // wo
                   + l * d                               // rms_ffn
                   + 3 * l * h * d                       // w1, w2, w3
                   + d                                   // rms_final
                   + 2 * rope_floats;                    // freq_cis_real, freq_cis_imag
  if (!tied) floats += v * d;                            // wcls
  const int64_t expected = kHeaderBytes + floats * 4;
  if (file_size != expected) {
    return absl::DataLossError(
        absl::StrCat(model_bin_path, ": file is ", file_size, " bytes, header implies ", expected,
                     " (dim ", dim, ", hidden_dim ", hidden_dim, ", n_layers ", n_layers,
                     ", n_heads ", n_heads, ", n_kv_heads ", n_kv_heads, ", vocab_size ", raw_vocab,
                     ", seq_len ", seq_len, tied ? ", tied classifier)" : ", untied classifier)"));
  }

  Cursor cursor(MappedRangeBuffer(file, 0, file->size()));
  LlamaWeights& w = checkpoint.weights;
  w.layers.resize(static_cast<size_t>(l));
  ESTUARY_ASSIGN_OR_RETURN(w.embedding, cursor.Next({v, d}));
  // Each family of tensors is stored for all layers before the next family starts.
  auto family = [&](Tensor LlamaLayerWeights::*slot, Shape shape) -> absl::Status {
    for (LlamaLayerWeights& layer : w.layers) {
      ESTUARY_ASSIGN_OR_RETURN(layer.*slot, cursor.Next(shape));
    }
    return absl::OkStatus();
  };
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::attn_norm, {d}));
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::wq, {q_dim, d}));
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::wk, {kv_dim, d}));
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::wv, {kv_dim, d}));
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::wo, {d, q_dim}));
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::ffn_norm, {d}));
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::w_gate, {h, d}));  // w1
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::w_down, {d, h}));  // w2
  ESTUARY_RETURN_IF_ERROR(family(&LlamaLayerWeights::w_up, {h, d}));    // w3
  ESTUARY_ASSIGN_OR_RETURN(w.final_norm, cursor.Next({d}));
  cursor.Skip(2 * rope_floats);  // RoPE tables: recomputed by the model
  if (tied) {
    w.lm_head = w.embedding;
  } else {
    ESTUARY_ASSIGN_OR_RETURN(w.lm_head, cursor.Next({v, d}));
  }
  return checkpoint;
}

}  // namespace estuary
