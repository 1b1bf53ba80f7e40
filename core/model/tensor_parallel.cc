#include "core/model/tensor_parallel.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace estuary {
absl::StatusOr<Tensor> CopyColumns(const Tensor& t, int64_t begin, int64_t end) {
  if (t.rank() != 2 || begin < 0 || end < begin || end > t.dim(1) || t.dtype() == DType::kInt4) {
    return absl::InvalidArgumentError(absl::StrCat("CopyColumns [", begin, ", ", end, ") of ",
                                                   t.DebugString()));
  }
  const int64_t rows = t.dim(0), cols = t.dim(1);
  ESTUARY_ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(t.dtype(), {rows, end - begin}));
  const size_t row_bytes = DTypeBytes(t.dtype(), static_cast<size_t>(cols));
  const size_t skip = DTypeBytes(t.dtype(), static_cast<size_t>(begin));
  const size_t take = DTypeBytes(t.dtype(), static_cast<size_t>(end - begin));
  const auto* src = static_cast<const uint8_t*>(t.raw());
  auto* dst = static_cast<uint8_t*>(out.mutable_raw());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + static_cast<size_t>(r) * take, src + static_cast<size_t>(r) * row_bytes + skip,
                take);
  }
  return out;
}

namespace {

absl::Status CheckDivides(const char* what, int64_t value, int tp_size) {
  if (value % tp_size == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor-parallel size ", tp_size,
                                                 " does not divide ", what, " = ", value,
                                                 " (each rank needs an equal whole share)"));
}

}  // namespace

absl::Status CheckTensorParallelSize(const LlamaConfig& config, int tp_size) {
  if (tp_size < 1 || tp_size > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", tp_size, " outside [1, 64]"));
  }
  ESTUARY_RETURN_IF_ERROR(CheckDivides("n_kv_heads", config.n_kv_heads, tp_size));
  ESTUARY_RETURN_IF_ERROR(CheckDivides("n_heads", config.n_heads, tp_size));
  return CheckDivides("hidden_dim", config.hidden_dim, tp_size);
}

absl::StatusOr<LlamaWeights> ShardWeights(const LlamaConfig& config, const LlamaWeights& weights,
                                          TensorParallelRank tp) {
  ESTUARY_RETURN_IF_ERROR(CheckTensorParallelSize(config, tp.size));
  if (tp.rank < 0 || tp.rank >= tp.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel rank ", tp.rank, " outside [0, ", tp.size, ")"));
  }
  if (weights.layers.size() != static_cast<size_t>(config.n_layers)) {
    return absl::InvalidArgumentError("ShardWeights: layer count differs from the config");
  }
  const int64_t hd = config.head_dim;
  const int64_t q_rows = int64_t{config.n_heads / tp.size} * hd;
  const int64_t kv_rows = int64_t{config.n_kv_heads / tp.size} * hd;
  const int64_t ffn = config.hidden_dim / tp.size;
  const int64_t r = tp.rank;

  LlamaWeights shard;
  shard.embedding = weights.embedding;
  shard.final_norm = weights.final_norm;
  shard.lm_head = weights.lm_head;
  shard.layers.reserve(weights.layers.size());
  for (const LlamaLayerWeights& w : weights.layers) {
    LlamaLayerWeights s;
    s.attn_norm = w.attn_norm;
    s.ffn_norm = w.ffn_norm;
    ESTUARY_ASSIGN_OR_RETURN(s.wq, w.wq.Rows(r * q_rows, (r + 1) * q_rows));
    ESTUARY_ASSIGN_OR_RETURN(s.wk, w.wk.Rows(r * kv_rows, (r + 1) * kv_rows));
    ESTUARY_ASSIGN_OR_RETURN(s.wv, w.wv.Rows(r * kv_rows, (r + 1) * kv_rows));
    ESTUARY_ASSIGN_OR_RETURN(s.w_gate, w.w_gate.Rows(r * ffn, (r + 1) * ffn));
    ESTUARY_ASSIGN_OR_RETURN(s.w_up, w.w_up.Rows(r * ffn, (r + 1) * ffn));
    ESTUARY_ASSIGN_OR_RETURN(s.wo, CopyColumns(w.wo, r * q_rows, (r + 1) * q_rows));
    ESTUARY_ASSIGN_OR_RETURN(s.w_down, CopyColumns(w.w_down, r * ffn, (r + 1) * ffn));
    shard.layers.push_back(std::move(s));
  }
  return shard;
}

}  // namespace estuary
