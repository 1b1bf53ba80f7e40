#include "core/model/llama_model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/forward_batch.h"

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

LlamaModel::LlamaModel(LlamaConfig config, LlamaWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  resident_layers_ = config_.n_layers;
  rope_inv_freq_ = kernels::cpu::RopeInverseFrequencies(config_.head_dim, config_.rope_theta,
                                                        config_.rope_scaling);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(LlamaConfig config,
                                                               LlamaWeights weights) {
  ESTUARY_RETURN_IF_ERROR(config.Validate());
  const int64_t dim = config.dim, hidden = config.hidden_dim, vocab = config.vocab_size;
  const int64_t q_dim = int64_t{config.n_heads} * config.head_dim;
  const int64_t kv_dim = int64_t{config.n_kv_heads} * config.head_dim;
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
  return std::unique_ptr<LlamaModel>(new LlamaModel(std::move(config), std::move(weights)));
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
  }
  resident_layers_ = std::min(resident_layers_, resident_layers);
  return released;
}

LayerProjections LlamaModel::backbone_projections(int layer) const {
  const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  return LayerProjections{Linear::Dense(w.wq),     Linear::Dense(w.wk),   Linear::Dense(w.wv),
                          Linear::Dense(w.wo),     Linear::Dense(w.w_gate), Linear::Dense(w.w_up),
                          Linear::Dense(w.w_down)};
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
