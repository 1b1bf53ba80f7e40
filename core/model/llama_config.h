#pragma once
// Hyper-parameters of a Llama-architecture model, read from the checkpoint (design §3).
// Loaders fill this; Validate() bounds every field before anything is allocated from it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor/rope_types.h"  // RopeStyle, RopeScaling

namespace estuary {

struct LlamaConfig {
  int dim = 0;           // hidden size
  int hidden_dim = 0;    // MLP intermediate size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;      // dim / n_heads unless the checkpoint says otherwise
  int vocab_size = 0;
  int max_seq_len = 0;   // context length
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::kHalves;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;
  int bos_id = 1;                  // -1 when the model has none
  std::vector<int> eos_ids = {2};  // generation stops at any of these
  std::string name;                // for logs and descriptors, e.g. "stories260K"

  // Checks ranges and divisibility (heads divide dim, kv heads divide heads, ids in vocab).
  // Errors name the field.
  absl::Status Validate() const;
};

}  // namespace estuary
