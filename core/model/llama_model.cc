#include "core/model/llama_model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/forward_batch.h"
#include "core/model/tensor_parallel.h"

namespace estuary {
namespace {

absl::Status CheckWeight(const Tensor& tensor, const std::string& name, const Shape& expected) {
  if (!tensor.defined()) return absl::InvalidArgumentError(absl::StrCat("missing weight ", name));
  if (tensor.shape() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("weight ", name, " has shape [",
                                                   absl::StrJoin(tensor.shape(), ", "),
                                                   "], expected [",
                                                   absl::StrJoin(expected, ", "), "]"));
  }
  if (tensor.dtype() == DType::kInt4) {
    return absl::InvalidArgumentError(absl::StrCat("weight ", name, " is int4"));
  }
  return absl::OkStatus();
}

}  // namespace

LlamaModel::LlamaModel(LlamaConfig config, LlamaWeights weights, TensorParallelRank tp)
    : config_(std::move(config)), weights_(std::move(weights)), tp_(tp) {
  resident_layers_ = config_.n_layers;
  rope_inv_freq_ = kernels::cpu::RopeInverseFrequencies(config_.head_dim, config_.rope_theta,
                                                        config_.rope_scaling);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(LlamaConfig config,
                                                               LlamaWeights weights,
                                                               TensorParallelRank tp) {
  ESTUARY_RETURN_IF_ERROR(config.Validate());
  ESTUARY_RETURN_IF_ERROR(CheckTensorParallelSize(config, tp.size));
  if (tp.rank < 0 || tp.rank >= tp.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel rank ", tp.rank, " outside [0, ", tp.size, ")"));
  }
  const int64_t dim = config.dim, hidden = config.hidden_dim / tp.size, vocab = config.vocab_size;
  const int64_t q_dim = int64_t{config.n_heads / tp.size} * config.head_dim;
  const int64_t kv_dim = int64_t{config.n_kv_heads / tp.size} * config.head_dim;
  ESTUARY_RETURN_IF_ERROR(CheckWeight(weights.embedding, "embedding", {vocab, dim}));
  ESTUARY_RETURN_IF_ERROR(CheckWeight(weights.final_norm, "final_norm", {dim}));
  ESTUARY_RETURN_IF_ERROR(CheckWeight(weights.lm_head, "lm_head", {vocab, dim}));
  if (weights.layers.size() != static_cast<size_t>(config.n_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", weights.layers.size(),
                                                   " layers of weights, config says ",
                                                   config.n_layers));
  }
  for (int l = 0; l < config.n_layers; ++l) {
    const LlamaLayerWeights& w = weights.layers[static_cast<size_t>(l)];
    const std::string p = absl::StrCat("layers.", l, ".");
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.attn_norm, p + "attn_norm", {dim}));
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.wq, p + "wq", {q_dim, dim}));
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.wk, p + "wk", {kv_dim, dim}));
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.wv, p + "wv", {kv_dim, dim}));
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.wo, p + "wo", {dim, q_dim}));
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.ffn_norm, p + "ffn_norm", {dim}));
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.w_gate, p + "w_gate", {hidden, dim}));
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.w_up, p + "w_up", {hidden, dim}));
    ESTUARY_RETURN_IF_ERROR(CheckWeight(w.w_down, p + "w_down", {dim, hidden}));
  }
  return std::unique_ptr<LlamaModel>(
      new LlamaModel(std::move(config), std::move(weights), tp));
}

absl::StatusOr<int64_t> LlamaModel::ReleaseBackboneLayersFrom(int resident_layers) {
  if (resident_layers < 1 || resident_layers > config_.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("resident backbone layers ", resident_layers,
                                                   " outside [1, ", config_.n_layers, "]"));
  }
  int64_t released = 0;
  for (int l = resident_layers; l < resident_layers_; ++l) {
    released += layer_bytes(l);
    LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    for (Tensor* t : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) *t = Tensor();
    if (row_parallel_blocks_ > 1) {
      for (Tensor& t : wo_blocks_[static_cast<size_t>(l)]) t = Tensor();
      for (Tensor& t : down_blocks_[static_cast<size_t>(l)]) t = Tensor();
    }
  }
  resident_layers_ = std::min(resident_layers_, resident_layers);
  return released;
}

LayerProjections LlamaModel::backbone_projections(int layer) const {
  const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  LayerProjections p{Linear::Dense(w.wq),     Linear::Dense(w.wk),     Linear::Dense(w.wv),
                     Linear::Dense(w.wo),     Linear::Dense(w.w_gate), Linear::Dense(w.w_up),
                     Linear::Dense(w.w_down)};
  if (row_parallel_blocks_ > 1) {
    p.wo = Linear::DenseBlocks(wo_blocks_[static_cast<size_t>(layer)]);
    p.w_down = Linear::DenseBlocks(down_blocks_[static_cast<size_t>(layer)]);
  }
  return p;
}

absl::Status LlamaModel::SplitRowParallel(int blocks) {
  if (blocks < 1 || local_heads() % blocks != 0 || local_hidden_dim() % blocks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row-parallel blocks ", blocks, " do not divide ", local_heads(), " heads and ",
        local_hidden_dim(), " MLP columns"));
  }
  wo_blocks_.clear();
  down_blocks_.clear();
  row_parallel_blocks_ = blocks;
  if (blocks == 1) return absl::OkStatus();
  const int64_t q_cols = int64_t{local_heads()} * config_.head_dim / blocks;
  const int64_t ffn_cols = local_hidden_dim() / blocks;
  for (int l = 0; l < config_.n_layers; ++l) {
    const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    std::vector<Tensor> wo, down;
    for (int b = 0; b < blocks; ++b) {
      if (l >= resident_layers_) {  // released: keep empty blocks
        wo.emplace_back();
        down.emplace_back();
        continue;
      }
      ESTUARY_ASSIGN_OR_RETURN(Tensor o, CopyColumns(w.wo, b * q_cols, (b + 1) * q_cols));
      ESTUARY_ASSIGN_OR_RETURN(Tensor d, CopyColumns(w.w_down, b * ffn_cols, (b + 1) * ffn_cols));
      wo.push_back(std::move(o));
      down.push_back(std::move(d));
    }
    wo_blocks_.push_back(std::move(wo));
    down_blocks_.push_back(std::move(down));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(absl::Span<const int32_t> tokens, int start_pos, KvView& cache,
                                 absl::Span<float> logits) const {
  BatchEntry entry;
  entry.tokens = tokens;
  entry.start_pos = start_pos;
  entry.kv = &cache;
  EntryOutcome outcome;
  return ForwardBatch(*this, absl::MakeConstSpan(&entry, 1), ForwardOptions(), logits,
                      absl::MakeSpan(&outcome, 1));
}

}  // namespace estuary
