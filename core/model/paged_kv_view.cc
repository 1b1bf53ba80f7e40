#include "core/model/paged_kv_view.h"

#include "core/kvcache/paged_attention.h"

namespace estuary {

void PagedKvView::Attend(int layer, const float* q, int n_queries, int start_pos, int n_heads,
                         float* out, WorkerPool* workers) const {
  PagedAttention(q, n_queries, start_pos, *sequence_->pool(), sequence_->pages(), layer, n_heads,
                 out, shard_, workers);
}

}  // namespace estuary
