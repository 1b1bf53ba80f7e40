#include "core/model/kv_cache.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace estuary {

absl::StatusOr<ContiguousKvCache> ContiguousKvCache::Create(const LlamaConfig& config,
                                                            int capacity) {
  if (capacity <= 0 || capacity > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache capacity ", capacity,
                                                   " outside [1, ", config.max_seq_len, "]"));
  }
  ContiguousKvCache cache;
  cache.capacity_ = capacity;
  cache.position_stride_ = static_cast<int64_t>(config.n_kv_heads) * config.head_dim;
  const size_t elements =
      static_cast<size_t>(config.n_layers) * static_cast<size_t>(capacity) *
      static_cast<size_t>(cache.position_stride_);
  try {
    cache.keys_.assign(elements, 0.0f);
    cache.values_.assign(elements, 0.0f);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache of ", 2 * elements * sizeof(float), " bytes"));
  }
  return cache;
}

}  // namespace estuary
