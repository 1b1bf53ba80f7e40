#pragma once
// RunDecoderLayer: one Llama decoder layer over a group of sequences that share a path (backbone
// or river) in this layer. Internal to the forward pass (forward_batch.cc).

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/model/forward_batch.h"
#include "core/model/linear.h"
#include "core/model/llama_model.h"

namespace estuary {

// Called per sequence after K/V of the layer were computed: the attention-normalized input,
// RoPE'd K and V rows of the sequence's tokens ([n][dim], [n][kv_dim], [n][kv_dim]).
using KvTap = std::function<void(int group_index, const float* normed_input, const float* k,
                                 const float* v)>;

// The activations of RunDecoderLayer's calls in one forward pass, owned by the pass
// (ForwardBatch) and reused by each of its layers: a 512-token prefill chunk of a 1B model needs
// 50 MiB of them, which allocated afresh per layer cost a page fault and a zero-fill per 4 KiB,
// every layer (about a fifth of bench-prefill's time). Every buffer is written whole by its
// kernel before it is read, so none is zeroed; a buffer grows to the largest call of the pass and
// is freed with it, so a long-running worker holds none between steps.
class LayerActivations {
 public:
  static constexpr size_t kBuffers = 8;
  // Buffer `slot` (< kBuffers), at least n floats, its contents undefined.
  float* Get(size_t slot, size_t n);

 private:
  struct Buffer {
    std::unique_ptr<float[]> data;
    size_t capacity = 0;
  };
  std::array<Buffer, kBuffers> buffers_;
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
