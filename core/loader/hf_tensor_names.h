#pragma once
// The tensors of a Hugging Face Llama checkpoint: names, expected shapes, and where each goes in
// LlamaWeights. Shared by the loader, the converter and the synthesizer so they agree.

#include <string>
#include <vector>

#include "core/model/llama_config.h"
#include "core/model/llama_weights.h"

namespace estuary {

enum class WeightRole {
  kEmbedding,
  kAttnNorm,
  kWq,
  kWk,
  kWv,
  kWo,
  kFfnNorm,
  kGate,
  kUp,
  kDown,
  kFinalNorm,
  kLmHead,
};

struct HfTensorInfo {
  std::string name;  // e.g. "model.layers.3.self_attn.q_proj.weight"
  Shape shape;       // what the config implies
  WeightRole role;
  int layer = -1;  // -1 for the embedding, final norm and LM head
  bool is_norm() const {
    return role == WeightRole::kAttnNorm || role == WeightRole::kFfnNorm ||
           role == WeightRole::kFinalNorm;
  }
};

// All tensors of a checkpoint for `config`, in the usual file order (embedding, layers, final
// norm, then lm_head only when the embeddings are untied).
std::vector<HfTensorInfo> HfLlamaTensors(const LlamaConfig& config);

// The slot of `weights` for `info`; `weights.layers` must already have config.n_layers entries.
Tensor& WeightSlot(LlamaWeights& weights, const HfTensorInfo& info);
const Tensor& WeightSlot(const LlamaWeights& weights, const HfTensorInfo& info);

}  // namespace estuary
