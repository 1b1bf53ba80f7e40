#pragma once
// PagedKvView: a KvView over one sequence's pages in the shared KvPool (core/kvcache). Borrows
// the SequenceKv, which must outlive the view; positions must lie inside its reserved capacity.

#include "core/kvcache/sequence_kv.h"
#include "core/model/kv_view.h"

namespace estuary {

class PagedKvView final : public KvView {
 public:
  explicit PagedKvView(SequenceKv* sequence) : sequence_(sequence) {}

  int capacity() const override { return sequence_->capacity(); }
  void Write(int layer, int pos, const float* k, const float* v) override {
    sequence_->WriteKv(layer, pos, k, v);
  }
  void Attend(int layer, const float* q, int n_queries, int start_pos, int n_heads,
              float* out) const override;
  void SetProvenance(int pos, uint8_t last_backbone_layer) override {
    sequence_->SetProvenance(pos, last_backbone_layer);
  }

 private:
  SequenceKv* sequence_;
};

}  // namespace estuary
