#pragma once
// RunDecoderLayer: one Llama decoder layer over a group of sequences that share a path (backbone
// or river) in this layer. Internal to the forward pass (forward_batch.cc).

#include <cstdint>
#include <functional>

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

// x holds the group's rows ([rows][dim], the tokens of `group` in order) and is updated in place:
// x += attention(norm(x)); x += mlp(norm(x)). K/V are written through each entry's KvView.
// `options` supplies the matmul path and, under tensor parallelism, the communicator that
// completes the o and down projections' partial sums.
absl::Status RunDecoderLayer(const LlamaModel& model, int layer, const LayerProjections& proj,
                             const ForwardOptions& options,
                             absl::Span<const BatchEntry* const> group, float* x, int64_t rows,
                             const KvTap& tap = nullptr);

}  // namespace estuary
