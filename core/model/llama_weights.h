#pragma once
// The tensors of a Llama model, by role. Matrices are [out][in], row-major, in the checkpoint's
// dtype (f32, bf16 or f16) unless the loader was asked to convert. Norm weights are vectors.
// Tensors share storage with the checkpoint where possible (memory-mapped files).

#include <vector>

#include "core/tensor/tensor.h"

namespace estuary {

struct LlamaLayerWeights {
  Tensor attn_norm;  // [dim]
  Tensor wq;         // [n_heads * head_dim][dim]
  Tensor wk;         // [n_kv_heads * head_dim][dim]
  Tensor wv;         // [n_kv_heads * head_dim][dim]
  Tensor wo;         // [dim][n_heads * head_dim]
  Tensor ffn_norm;   // [dim]
  Tensor w_gate;     // [hidden_dim][dim]   (llama2.c w1, HF gate_proj)
  Tensor w_up;       // [hidden_dim][dim]   (llama2.c w3, HF up_proj)
  Tensor w_down;     // [dim][hidden_dim]   (llama2.c w2, HF down_proj)
};

struct LlamaWeights {
  Tensor embedding;   // [vocab][dim]
  std::vector<LlamaLayerWeights> layers;
  Tensor final_norm;  // [dim]
  Tensor lm_head;     // [vocab][dim]; shares storage with `embedding` when tied
};

}  // namespace estuary
