#include "core/model/llama_model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/kernels/cpu/kernels.h"

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

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

LlamaModel::LlamaModel(LlamaConfig config, LlamaWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
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

int64_t LlamaModel::weight_bytes() const {
  int64_t total = static_cast<int64_t>(weights_.embedding.nbytes() + weights_.final_norm.nbytes());
  if (weights_.lm_head.raw() != weights_.embedding.raw()) {
    total += static_cast<int64_t>(weights_.lm_head.nbytes());
  }
  for (const LlamaLayerWeights& w : weights_.layers) {
    for (const Tensor* t : {&w.attn_norm, &w.wq, &w.wk, &w.wv, &w.wo, &w.ffn_norm, &w.w_gate,
                            &w.w_up, &w.w_down}) {
      total += static_cast<int64_t>(t->nbytes());
    }
  }
  return total;
}

absl::Status LlamaModel::Forward(absl::Span<const int32_t> tokens, int start_pos,
                                 ContiguousKvCache& cache, absl::Span<float> logits) const {
  namespace k = kernels::cpu;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("Forward needs at least one token");
  if (start_pos < 0 || start_pos + n > cache.capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("positions [", start_pos, ", ", start_pos + n,
                                                   ") exceed the KV cache capacity ",
                                                   cache.capacity()));
  }
  if (logits.size() != static_cast<size_t>(config_.vocab_size)) {
    return absl::InvalidArgumentError("logits buffer is not vocab_size long");
  }
  const int64_t dim = config_.dim, hidden = config_.hidden_dim, hd = config_.head_dim;
  const int64_t q_dim = config_.n_heads * hd, kv_dim = config_.n_kv_heads * hd;

  // Activations for the whole chunk, [token][feature].
  std::vector<float> x(n * dim), xb(n * dim), q(n * q_dim), kv_k(n * kv_dim), kv_v(n * kv_dim),
      att(n * q_dim), proj(n * dim), gate(n * hidden), up(n * hidden);
  ESTUARY_RETURN_IF_ERROR(k::Embedding(weights_.embedding, tokens, x.data()));

  for (int l = 0; l < config_.n_layers; ++l) {
    const LlamaLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    k::RmsNorm(x.data(), w.attn_norm, n, dim, config_.rms_eps, xb.data());
    ESTUARY_RETURN_IF_ERROR(k::MatMul(w.wq, xb.data(), n, q.data()));
    ESTUARY_RETURN_IF_ERROR(k::MatMul(w.wk, xb.data(), n, kv_k.data()));
    ESTUARY_RETURN_IF_ERROR(k::MatMul(w.wv, xb.data(), n, kv_v.data()));
    for (int64_t t = 0; t < n; ++t) {
      const int pos = start_pos + static_cast<int>(t);
      k::ApplyRope(q.data() + t * q_dim, config_.n_heads, config_.head_dim, pos, rope_inv_freq_,
                   config_.rope_style);
      k::ApplyRope(kv_k.data() + t * kv_dim, config_.n_kv_heads, config_.head_dim, pos,
                   rope_inv_freq_, config_.rope_style);
      std::copy_n(kv_k.data() + t * kv_dim, kv_dim, cache.k(l, pos));
      std::copy_n(kv_v.data() + t * kv_dim, kv_dim, cache.v(l, pos));
    }
    k::CausalAttention(q.data(), static_cast<int>(n), start_pos, cache.k(l, 0), cache.v(l, 0),
                       config_.n_heads, config_.n_kv_heads, config_.head_dim, att.data());
    ESTUARY_RETURN_IF_ERROR(k::MatMul(w.wo, att.data(), n, proj.data()));
    AddInPlace(x.data(), proj.data(), n * dim);

    k::RmsNorm(x.data(), w.ffn_norm, n, dim, config_.rms_eps, xb.data());
    ESTUARY_RETURN_IF_ERROR(k::MatMul(w.w_gate, xb.data(), n, gate.data()));
    ESTUARY_RETURN_IF_ERROR(k::MatMul(w.w_up, xb.data(), n, up.data()));
    k::SwiGlu(gate.data(), up.data(), n * hidden, gate.data());
    ESTUARY_RETURN_IF_ERROR(k::MatMul(w.w_down, gate.data(), n, proj.data()));
    AddInPlace(x.data(), proj.data(), n * dim);
  }
  // Only the last token's logits are needed to continue the sequence.
  const float* last = x.data() + (n - 1) * dim;
  k::RmsNorm(last, weights_.final_norm, 1, dim, config_.rms_eps, xb.data());
  return k::MatMul(weights_.lm_head, xb.data(), 1, logits.data());
}

}  // namespace estuary
