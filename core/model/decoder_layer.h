#pragma once
// RunDecoderLayer: one Llama decoder layer over a group of sequences that share a path (backbone
// or river) in this layer. Internal to the forward pass (forward_batch.cc).

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/forward_batch.h"
#include "core/model/linear.h"
#include "core/model/llama_model.h"

namespace estuary {

// Called per sequence after K/V of the layer were computed: the attention-normalized input,
// RoPE'd K and V rows of the sequence's tokens ([n][dim], [n][kv_dim], [n][kv_dim]).
using KvTap = std::function<void(int group_index, const float* normed_input, const float* k,
                                 const float* v)>;

// The widths of one decoder layer on this rank (its local shard of heads and MLP columns), read
// once from the model by RunDecoderLayer and by LayerActivations, which sizes its buffers by them.
struct LayerWidths {
  int n_heads, n_kv_heads;
  int64_t head_dim, dim, q_dim, kv_dim, hidden;

  static LayerWidths Of(const LlamaModel& model);
};

// The activations of RunDecoderLayer's calls in one forward pass, owned by the pass
// (ForwardBatch), allocated once as one block for its largest group and reused by each of its
// layers: a 512-token prefill chunk of a 1B model needs 50 MiB of them, which allocated afresh
// per layer cost a page fault and a zero-fill per 4 KiB, every layer (about a fifth of
// bench-prefill's time). Every buffer is written whole by its kernel before it is read, so a
// large block is not zeroed. A large block is mapped from the kernel and unmapped at the pass's
// end, so it never settles in a malloc arena (eight buffers grown one by one on the heap raised
// a decode worker's RSS under load by 4-7% in the soak test); a decode step's few rows stay on
// the heap.
class LayerActivations {
 public:
  // Room for groups of up to max_rows rows of `model`'s layers (its local shard's widths).
  // RESOURCE_EXHAUSTED when the kernel refuses the mapping.
  static absl::StatusOr<LayerActivations> Allocate(const LlamaModel& model, int64_t max_rows);
  ~LayerActivations();
  LayerActivations(LayerActivations&& other) noexcept;
  LayerActivations(const LayerActivations&) = delete;
  LayerActivations& operator=(const LayerActivations&) = delete;
  LayerActivations& operator=(LayerActivations&&) = delete;

  int64_t max_rows() const { return max_rows_; }
  // [max_rows][width] each: the normed input (dim), q, k, v, the attention output, the
  // projection output (dim), gate and up (hidden).
  float* xb() const { return at(0); }
  float* q() const { return at(1); }
  float* k() const { return at(2); }
  float* v() const { return at(3); }
  float* att() const { return at(4); }
  float* proj_out() const { return at(5); }
  float* gate() const { return at(6); }
  float* up() const { return at(7); }

 private:
  static constexpr size_t kBuffers = 8;
  explicit LayerActivations(int64_t max_rows) : max_rows_(max_rows) {}
  float* at(size_t i) const { return block_ + offsets_[i]; }

  int64_t max_rows_;
  std::array<size_t, kBuffers> offsets_{};
  float* block_ = nullptr;
  size_t mapped_bytes_ = 0;   // > 0: block_ is a private mapping of this many bytes
  std::vector<float> small_;  // else block_ is this (a decode step's few rows)
};

// x holds the group's rows ([rows][dim], the tokens of `group` in order) and is updated in place:
// x += attention(norm(x)); x += mlp(norm(x)). K/V are written through each entry's KvView.
// `options` supplies the matmul path and, under tensor parallelism, the communicator that
// completes the o and down projections' partial sums.
absl::Status RunDecoderLayer(const LlamaModel& model, int layer, const LayerProjections& proj,
                             const ForwardOptions& options,
                             absl::Span<const BatchEntry* const> group, float* x, int64_t rows,
                             LayerActivations& scratch, const KvTap& tap = nullptr);

}  // namespace estuary
