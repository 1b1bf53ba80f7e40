#pragma once
// PagedKvView: a KvView over one sequence's pages in the shared KvPool (core/kvcache), for TP
// rank `shard` of the pool. Borrows the SequenceKv, which must outlive the view; positions must
// lie inside its reserved capacity. Provenance is one record for all shards: only the shard-0
// view writes it (every rank takes the same exit decisions, design §6).

#include "core/kvcache/sequence_kv.h"
#include "core/model/kv_view.h"

namespace estuary {

class PagedKvView final : public KvView {
 public:
  explicit PagedKvView(SequenceKv* sequence, int shard = 0)
      : sequence_(sequence), shard_(shard) {}

  int capacity() const override { return sequence_->capacity(); }
  void Write(int layer, int pos, const float* k, const float* v) override {
    sequence_->WriteKv(layer, pos, k, v, shard_);
  }
  // PagedAttention on `workers` (its (query, KV head) pairs split over the pool).
  void Attend(int layer, const float* q, int n_queries, int start_pos, int n_heads, float* out,
              WorkerPool* workers) const override;
  void SetProvenance(int pos, uint8_t last_backbone_layer) override {
    if (shard_ == 0) sequence_->SetProvenance(pos, last_backbone_layer);
  }

 private:
  SequenceKv* sequence_;
  int shard_ = 0;
};

}  // namespace estuary
