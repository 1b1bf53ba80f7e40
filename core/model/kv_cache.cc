#include "core/model/kv_cache.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/kernels/cpu/kernels.h"

namespace estuary {

absl::StatusOr<ContiguousKvCache> ContiguousKvCache::Create(const LlamaConfig& config,
                                                            int capacity, int tp_size) {
  if (tp_size < 1 || config.n_kv_heads % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: tensor-parallel size ", tp_size,
                                                   " does not divide ", config.n_kv_heads,
                                                   " KV heads"));
  }
  if (capacity <= 0 || capacity > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache capacity ", capacity,
                                                   " outside [1, ", config.max_seq_len, "]"));
  }
  ContiguousKvCache cache;
  cache.capacity_ = capacity;
  cache.n_kv_heads_ = config.n_kv_heads / tp_size;
  cache.head_dim_ = config.head_dim;
  cache.position_stride_ = static_cast<int64_t>(cache.n_kv_heads_) * config.head_dim;
  const size_t elements =
      static_cast<size_t>(config.n_layers) * static_cast<size_t>(capacity) *
      static_cast<size_t>(cache.position_stride_);
  try {
    cache.keys_.assign(elements, 0.0f);
    cache.values_.assign(elements, 0.0f);
    cache.provenance_.assign(static_cast<size_t>(capacity), kProvenanceFullDepth);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache of ", 2 * elements * sizeof(float), " bytes"));
  }
  return cache;
}

void ContiguousKvCache::Write(int layer, int pos, const float* k, const float* v) {
  const int64_t offset = Offset(layer, pos);
  std::copy_n(k, position_stride_, keys_.data() + offset);
  std::copy_n(v, position_stride_, values_.data() + offset);
}

void ContiguousKvCache::Attend(int layer, const float* q, int n_queries, int start_pos,
                               int n_heads, float* out, WorkerPool* /*workers*/) const {
  const int64_t base = Offset(layer, 0);
  kernels::cpu::CausalAttention(q, n_queries, start_pos, keys_.data() + base,
                                values_.data() + base, n_heads, n_kv_heads_, head_dim_, out);
}

}  // namespace estuary
