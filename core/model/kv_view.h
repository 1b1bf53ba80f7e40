#pragma once
// KvView: how the forward pass reaches one sequence's KV cache, whatever its layout: the
// contiguous per-sequence cache of `estuary generate` (kv_cache.h) or pages of the shared paged
// pool (paged_kv_view.h). The forward pass writes K/V rows and attends through this interface,
// so one implementation of the decoder layer serves both.
//
// A view belongs to one sequence and is used by one thread at a time.

#include <cstdint>

#include "absl/status/status.h"
#include "core/common/worker_pool.h"
#include "core/kvcache/kv_pool.h"  // kProvenanceFullDepth

namespace estuary {
// Provenance of a slot whose every layer ran on the river (the "full int4" evaluation mode).
inline constexpr uint8_t kProvenanceNoBackbone = 254;

class KvView {
 public:
  virtual ~KvView() = default;

  // Positions [0, capacity()) can be written.
  virtual int capacity() const = 0;
  // Stores K and V ([n_kv_heads][head_dim] each, RoPE already applied to K) of `layer` at `pos`.
  virtual void Write(int layer, int pos, const float* k, const float* v) = 0;
  // Causal attention of `n_queries` queries ([n_queries][n_heads][head_dim]) at positions
  // start_pos.. against positions [0, start_pos + t] of `layer`; writes [n_queries][n_heads][hd].
  // `workers`: the rank's pool (null: the caller's thread), over which an implementation may
  // spread the work; the output does not depend on it. Not called from inside its ParallelFor.
  virtual void Attend(int layer, const float* q, int n_queries, int start_pos, int n_heads,
                      float* out, WorkerPool* workers) const = 0;
  // Records the last backbone layer whose KV this position holds (kProvenanceFullDepth: all).
  virtual void SetProvenance(int pos, uint8_t last_backbone_layer) = 0;
};

}  // namespace estuary
