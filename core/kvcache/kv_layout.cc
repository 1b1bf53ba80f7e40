#include "core/kvcache/kv_layout.h"

#include "absl/strings/str_cat.h"
#include "core/common/range_check.h"

namespace estuary {
KvLayout KvLayout::FromShape(int n_layers, int n_kv_heads, int head_dim, int block_size,
                            int tp_size) {
  KvLayout layout;
  layout.n_layers = n_layers;
  layout.n_kv_heads = tp_size > 0 ? n_kv_heads / tp_size : 0;
  layout.head_dim = head_dim;
  layout.block_size = block_size;
  return layout;
}

absl::Status KvLayout::Validate() const {
  // n_layers <= 255: provenance stores a layer index in a byte, 255 meaning "full depth", and the
  // last layer index is n_layers - 1 <= 254. The other bounds keep page_bytes() below 2^47.
  for (const absl::Status& s : {
           CheckRange("KV layout", "n_layers", n_layers, 1, 255),
           CheckRange("KV layout", "n_kv_heads", n_kv_heads, 1, 1024),
           CheckRange("KV layout", "head_dim", head_dim, 1, 1024),
           CheckRange("KV layout", "block_size", block_size, 1, 1024),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace estuary
