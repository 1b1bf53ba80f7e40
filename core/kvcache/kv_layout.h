#pragma once
// KvLayout: the shape of one KV-cache page (design §4). A page holds `block_size` token slots of
// K and V for every layer and for the KV heads local to one TP rank, stored as f32 on the CPU.
//
// Memory of one layer of one page (one contiguous chunk of page_floats_per_layer() floats):
//   [K|V][kv_head][slot][head_dim]
// so one head of one page is a contiguous [block_size][head_dim] slice.

#include <cstdint>

#include "absl/status/status.h"

namespace estuary {

struct KvLayout {
  int n_layers = 0;     // backbone layers; at most 255 so that a layer index fits a provenance byte
  int n_kv_heads = 0;   // KV heads held by this pool (those local to one TP rank)
  int head_dim = 0;     // floats per head
  int block_size = 16;  // token slots per page

  // The layout of one TP rank's share of a model (tp_size 1: the whole model): n_kv_heads /
  // tp_size heads. Does not validate; Validate() or KvPool::Create do (the caller checked that
  // tp_size divides n_kv_heads, see CheckTensorParallelSize).
  static KvLayout FromShape(int n_layers, int n_kv_heads, int head_dim, int block_size,
                            int tp_size = 1);
  // FromShape of any config with n_layers, n_kv_heads and head_dim (LlamaConfig): a template so
  // that the KV cache depends on those three numbers, not on core/model.
  template <typename Config>
  static KvLayout FromConfig(const Config& config, int block_size, int tp_size = 1) {
    return FromShape(config.n_layers, config.n_kv_heads, config.head_dim, block_size, tp_size);
  }

  // Bounds every field so that the products below cannot overflow. Errors name the field.
  absl::Status Validate() const;

  // Floats of K (or of V) for one token: n_kv_heads * head_dim.
  int64_t token_floats() const { return int64_t{n_kv_heads} * head_dim; }
  // Floats of one head's K (or V) slice in one page: block_size * head_dim.
  int64_t head_floats() const { return int64_t{block_size} * head_dim; }
  // Floats of K (or of V) for all heads of one layer of one page.
  int64_t half_page_floats() const { return int64_t{n_kv_heads} * head_floats(); }
  // Floats of K and V of one layer of one page.
  int64_t page_floats_per_layer() const { return 2 * half_page_floats(); }
  // Bytes of K and V of one layer of one page.
  int64_t page_bytes_per_layer() const {
    return page_floats_per_layer() * static_cast<int64_t>(sizeof(float));
  }
  // Bytes of K and V of one page over all layers (provenance bytes not included).
  int64_t page_bytes() const { return int64_t{n_layers} * page_bytes_per_layer(); }
};

}  // namespace estuary
