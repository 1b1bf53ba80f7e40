#pragma once
// ContiguousKvCache: the KV cache of one sequence as plain f32 arrays, for `estuary generate` and
// as the reference the paged pool is tested against. Layout per layer:
// [position][kv_head][head_dim], K and V in separate regions. Owns its memory; move-only.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/kv_view.h"
#include "core/model/llama_config.h"

namespace estuary {

class ContiguousKvCache final : public KvView {
 public:
  // Room for `capacity` positions (at most the model's context) of the KV heads of one of
  // `tp_size` tensor-parallel ranks (all heads for 1). RESOURCE_EXHAUSTED when the allocation
  // fails; INVALID_ARGUMENT when tp_size does not divide the KV heads.
  static absl::StatusOr<ContiguousKvCache> Create(const LlamaConfig& config, int capacity,
                                                  int tp_size = 1);

  int capacity() const override { return capacity_; }
  void Write(int layer, int pos, const float* k, const float* v) override;
  // kernels::cpu::CausalAttention on the caller's thread (`estuary generate`'s path, and the
  // reference the paged pool is tested against); `workers` is not used.
  void Attend(int layer, const float* q, int n_queries, int start_pos, int n_heads, float* out,
              WorkerPool* workers) const override;
  void SetProvenance(int pos, uint8_t last_backbone_layer) override {
    provenance_[static_cast<size_t>(pos)] = last_backbone_layer;
  }
  uint8_t provenance(int pos) const { return provenance_[static_cast<size_t>(pos)]; }

 private:
  int64_t Offset(int layer, int pos) const {
    return (static_cast<int64_t>(layer) * capacity_ + pos) * position_stride_;
  }
  int capacity_ = 0;
  int n_kv_heads_ = 0;
  int head_dim_ = 0;
  int64_t position_stride_ = 0;  // n_kv_heads * head_dim
  std::vector<float> keys_;
  std::vector<float> values_;
  std::vector<uint8_t> provenance_;
};

}  // namespace estuary
