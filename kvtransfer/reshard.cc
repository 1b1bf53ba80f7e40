#include "kvtransfer/reshard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace estuary::kvtransfer {

int64_t PageLayerBytes(const ReshardShape& shape, int tp_size) {
  return 2 * int64_t{shape.n_kv_heads / tp_size} * shape.block_size * shape.head_dim *
         shape.dtype_bytes;
}

absl::StatusOr<std::vector<RankPairPlan>> PlanReshard(const ReshardShape& shape, int src_tp,
                                                      int dst_tp) {
  if (shape.n_kv_heads <= 0 || shape.head_dim <= 0 || shape.block_size <= 0 ||
      shape.dtype_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reshard shape must be positive: n_kv_heads=", shape.n_kv_heads, " head_dim=",
        shape.head_dim, " block_size=", shape.block_size, " dtype_bytes=", shape.dtype_bytes));
  }
  if (src_tp <= 0 || dst_tp <= 0 || shape.n_kv_heads % src_tp != 0 ||
      shape.n_kv_heads % dst_tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshard ", shape.n_kv_heads, " KV heads from TP ", src_tp, " to TP ",
                     dst_tp, ": the head count must divide by both TP sizes"));
  }
  const int src_heads = shape.n_kv_heads / src_tp;
  const int dst_heads = shape.n_kv_heads / dst_tp;
  const int64_t head_bytes = int64_t{shape.block_size} * shape.head_dim * shape.dtype_bytes;
  std::vector<RankPairPlan> plan;
  for (int s = 0; s < src_tp; ++s) {
    const int s_lo = s * src_heads;
    const int s_hi = s_lo + src_heads;
    for (int d = 0; d < dst_tp; ++d) {
      const int d_lo = d * dst_heads;
      const int d_hi = d_lo + dst_heads;
      const int lo = std::max(s_lo, d_lo);
      const int hi = std::min(s_hi, d_hi);
      if (lo >= hi) continue;
      RankPairPlan pair{s, d, {}};
      const int64_t bytes = (hi - lo) * head_bytes;
      for (int kv = 0; kv < 2; ++kv) {
        CopyChunk c{(int64_t{kv} * src_heads + (lo - s_lo)) * head_bytes,
                    (int64_t{kv} * dst_heads + (lo - d_lo)) * head_bytes, bytes};
        if (!pair.chunks.empty()) {
          CopyChunk& last = pair.chunks.back();
          if (last.src_offset + last.bytes == c.src_offset &&
              last.dst_offset + last.bytes == c.dst_offset) {
            last.bytes += c.bytes;
            continue;
          }
        }
        pair.chunks.push_back(c);
      }
      plan.push_back(std::move(pair));
    }
  }
  return plan;
}

}  // namespace estuary::kvtransfer
