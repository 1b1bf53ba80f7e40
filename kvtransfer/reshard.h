#pragma once
// Re-sharding plan between a prefill TP size and a decode TP size (design §6, §7).
//
// TP rank r of size t holds KV heads [r * H / t, (r + 1) * H / t) of the H total. One layer of one
// page on a rank is laid out [K|V][local kv_head][slot][head_dim], so a run of consecutive heads is
// one contiguous chunk of K and one of V. For every (src rank, dst rank) pair whose heads overlap,
// the plan lists the byte copies that move the overlap, as offsets within ONE layer of ONE page
// (the same for every layer and page: add page * page_bytes_per_layer on each side).
//
// Pure functions; no I/O.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace estuary::kvtransfer {

struct ReshardShape {
  int n_kv_heads = 0;  // H: KV heads of the whole model
  int head_dim = 0;
  int block_size = 0;  // token slots per page
  int dtype_bytes = 4;  // f32
};

struct CopyChunk {
  int64_t src_offset = 0;  // bytes, within one layer of one page on the src rank
  int64_t dst_offset = 0;  // bytes, within one layer of one page on the dst rank
  int64_t bytes = 0;
  bool operator==(const CopyChunk&) const = default;
};

struct RankPairPlan {
  int src_rank = 0;
  int dst_rank = 0;
  // K chunk then V chunk; merged into one chunk when both are contiguous on both sides (when the
  // two ranks hold exactly the same heads, the whole page layer is one copy).
  std::vector<CopyChunk> chunks;
};

// Bytes of one layer of one page on a rank of a TP group of `tp_size`.
int64_t PageLayerBytes(const ReshardShape& shape, int tp_size);

// The copies from a TP group of `src_tp` to one of `dst_tp`, ordered by (src rank, dst rank).
// INVALID_ARGUMENT unless every dimension is positive and H divides by both TP sizes.
absl::StatusOr<std::vector<RankPairPlan>> PlanReshard(const ReshardShape& shape, int src_tp,
                                                      int dst_tp);

}  // namespace estuary::kvtransfer
