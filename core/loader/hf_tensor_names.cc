#include "core/loader/hf_tensor_names.h"

#include "absl/strings/str_cat.h"

namespace estuary {

std::vector<HfTensorInfo> HfLlamaTensors(const LlamaConfig& config) {
  const int64_t d = config.dim, h = config.hidden_dim, v = config.vocab_size;
  const int64_t q = int64_t{config.n_heads} * config.head_dim;
  const int64_t kv = int64_t{config.n_kv_heads} * config.head_dim;
  std::vector<HfTensorInfo> out;
  out.push_back({"model.embed_tokens.weight", {v, d}, WeightRole::kEmbedding});
  for (int i = 0; i < config.n_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    out.push_back({p + "input_layernorm.weight", {d}, WeightRole::kAttnNorm, i});
    out.push_back({p + "self_attn.q_proj.weight", {q, d}, WeightRole::kWq, i});
    out.push_back({p + "self_attn.k_proj.weight", {kv, d}, WeightRole::kWk, i});
    out.push_back({p + "self_attn.v_proj.weight", {kv, d}, WeightRole::kWv, i});
    out.push_back({p + "self_attn.o_proj.weight", {d, q}, WeightRole::kWo, i});
    out.push_back({p + "post_attention_layernorm.weight", {d}, WeightRole::kFfnNorm, i});
    out.push_back({p + "mlp.gate_proj.weight", {h, d}, WeightRole::kGate, i});
    out.push_back({p + "mlp.up_proj.weight", {h, d}, WeightRole::kUp, i});
    out.push_back({p + "mlp.down_proj.weight", {d, h}, WeightRole::kDown, i});
  }
  out.push_back({"model.norm.weight", {d}, WeightRole::kFinalNorm});
  if (!config.tied_embeddings) out.push_back({"lm_head.weight", {v, d}, WeightRole::kLmHead});
  return out;
}

Tensor& WeightSlot(LlamaWeights& weights, const HfTensorInfo& info) {
  switch (info.role) {
    case WeightRole::kEmbedding:
      return weights.embedding;
    case WeightRole::kFinalNorm:
      return weights.final_norm;
    case WeightRole::kLmHead:
      return weights.lm_head;
    default:
      break;
  }
  LlamaLayerWeights& layer = weights.layers[static_cast<size_t>(info.layer)];
  switch (info.role) {
    case WeightRole::kAttnNorm:
      return layer.attn_norm;
    case WeightRole::kWq:
      return layer.wq;
    case WeightRole::kWk:
      return layer.wk;
    case WeightRole::kWv:
      return layer.wv;
    case WeightRole::kWo:
      return layer.wo;
    case WeightRole::kFfnNorm:
      return layer.ffn_norm;
    case WeightRole::kGate:
      return layer.w_gate;
    case WeightRole::kUp:
      return layer.w_up;
    default:
      return layer.w_down;
  }
}

const Tensor& WeightSlot(const LlamaWeights& weights, const HfTensorInfo& info) {
  return WeightSlot(const_cast<LlamaWeights&>(weights), info);
}

}  // namespace estuary
