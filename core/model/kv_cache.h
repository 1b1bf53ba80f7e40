#pragma once
// ContiguousKvCache: the KV cache of one sequence as plain f32 arrays, for `estuary generate` and
// as the reference the paged pool is tested against. Layout per layer:
// [position][kv_head][head_dim], K and V in separate regions. Owns its memory; move-only.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/llama_config.h"

namespace estuary {

class ContiguousKvCache {
 public:
  // Room for `capacity` positions (at most the model's context). RESOURCE_EXHAUSTED when the
  // allocation fails.
  static absl::StatusOr<ContiguousKvCache> Create(const LlamaConfig& config, int capacity);

  int capacity() const { return capacity_; }
  int64_t position_stride() const { return position_stride_; }
  float* k(int layer, int pos) { return Slot(keys_, layer, pos); }
  float* v(int layer, int pos) { return Slot(values_, layer, pos); }

 private:
  float* Slot(std::vector<float>& region, int layer, int pos) {
    return region.data() + (static_cast<int64_t>(layer) * capacity_ + pos) * position_stride_;
  }
  int capacity_ = 0;
  int64_t position_stride_ = 0;  // n_kv_heads * head_dim
  std::vector<float> keys_;
  std::vector<float> values_;
};

}  // namespace estuary
