#pragma once
// River: the exit river of a model (design §5): every decoder layer's seven projections
// quantized to int4 per group, and optionally (RiverLmHead::kInt4) the LM head, which a token
// that left the backbone then reads instead of the backbone's. Norms, RoPE and the embedding are
// shared with the backbone, not copied. Built once at load; immutable afterwards and safe to
// read from many threads. Owns its int4 matrices; the LlamaModel it was built from must outlive
// it only for the duration of Build().

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/linear.h"
#include "core/model/llama_weights.h"
#include "core/quant/int4_matrix.h"

namespace estuary {

enum class RiverProjection : uint8_t { kQ, kK, kV, kO, kGate, kUp, kDown };

// The LM head of the tokens on the river. With a real vocabulary the head is a large share of a
// decode step's bytes (Llama-3.2-1B: 525 MB of bf16 in 2.47 GB), and a shared head caps what the
// river can save; an int4 copy (the layers' group size and refinement) reads about a quarter of
// it, at the cost of a quantized head's error in the exited tokens' logits. Tokens that stay on
// the backbone to the last layer read the backbone's head either way, so full-depth output and
// the lossless mode's verified tokens are unchanged.
enum class RiverLmHead : uint8_t { kShared, kInt4 };

class River {
 public:
  // Quantizes layers [first_layer, n_layers) of `weights`. Layers below `first_layer` have no
  // river copy (a token cannot exit before them). With row_parallel_blocks B > 1 the o and down
  // projections are quantized as B column blocks each (groups never straddle a block) and
  // applied blockwise (linear.h), matching the rivers that B tensor-parallel ranks build from
  // their shards. `lm_head` kInt4 also quantizes weights.lm_head (whole: the backbone's head is
  // not sharded either), unless `quantized_lm_head` is given: the head another rank's river
  // quantized from the same weights (shared_lm_head()), which this river then shares, so that
  // tensor-parallel ranks hold and build one copy. Logs the time taken and the bytes.
  static absl::StatusOr<std::unique_ptr<River>> Build(
      const LlamaWeights& weights, const Int4QuantOptions& options, int first_layer = 0,
      int row_parallel_blocks = 1, RiverLmHead lm_head = RiverLmHead::kShared,
      std::shared_ptr<const Int4Matrix> quantized_lm_head = nullptr);

  int first_layer() const { return first_layer_; }
  int n_layers() const { return static_cast<int>(layers_.size()) + first_layer_; }
  bool has_layer(int layer) const { return layer >= first_layer_ && layer < n_layers(); }
  // The river projections of `layer` (has_layer(layer) must hold).
  LayerProjections projections(int layer) const;
  // Bytes of the int4 weights (with their scales and offsets) of one layer / of all layers.
  int64_t layer_bytes(int layer) const { return projections(layer).bytes(); }
  // One int4 matrix of `layer` (for evaluation and tests); block 0 of a blocked o / down.
  const Int4Matrix& matrix(int layer, RiverProjection which) const;
  // The river's own LM head (RiverLmHead::kInt4), or null when the river shares the backbone's.
  const Int4Matrix* lm_head() const { return lm_head_.get(); }
  // The same head, to hand to another rank's Build.
  const std::shared_ptr<const Int4Matrix>& shared_lm_head() const { return lm_head_; }
  // Bytes of the layers' int4 weights and of the head when the river has one.
  int64_t bytes() const;
  const Int4QuantOptions& options() const { return options_; }

 private:
  struct Layer {
    Int4Matrix wq, wk, wv, w_gate, w_up;
    std::vector<Int4Matrix> wo, w_down;  // column blocks (one unless row-parallel blocked)
  };
  River(Int4QuantOptions options, int first_layer) : options_(options), first_layer_(first_layer) {}

  Int4QuantOptions options_;
  int first_layer_ = 0;
  std::vector<Layer> layers_;
  std::shared_ptr<const Int4Matrix> lm_head_;  // RiverLmHead::kInt4 only
};

}  // namespace estuary
