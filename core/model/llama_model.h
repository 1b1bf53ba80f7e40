#pragma once
// LlamaModel: the Llama forward pass on the CPU kernels (design §3). Owns its weights (which may
// share storage with a memory-mapped checkpoint). Forward is const and keeps its scratch on the
// stack of the call, so one model can serve several threads, each with its own KV cache.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/kv_view.h"
#include "core/model/linear.h"
#include "core/model/llama_config.h"
#include "core/model/llama_weights.h"

namespace estuary {

// Which tensor-parallel rank a model holds (design §6). {0, 1}: the whole model.
struct TensorParallelRank {
  int rank = 0;
  int size = 1;
};

class LlamaModel {
 public:
  // Checks every weight's shape and dtype against `config`; errors name the tensor. `config`
  // always describes the whole model; with tp.size > 1, `weights` are rank tp.rank's Megatron
  // shard (ShardWeights in tensor_parallel.h): n_heads / size query heads, n_kv_heads / size KV
  // heads and hidden_dim / size MLP columns, with embedding, norms and LM head whole.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaConfig config,
                                                            LlamaWeights weights,
                                                            TensorParallelRank tp = {});

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  const TensorParallelRank& tensor_parallel() const { return tp_; }
  // This rank's share of the heads and of the MLP width (the whole model's when not sharded).
  int local_heads() const { return config_.n_heads / tp_.size; }
  int local_kv_heads() const { return config_.n_kv_heads / tp_.size; }
  int64_t local_hidden_dim() const { return config_.hidden_dim / tp_.size; }

  // Backbone offloading (design §5): drops the dense weights of layers >= `resident_layers`, so
  // they are never read again (their memory is freed, or for a memory-mapped checkpoint never
  // paged in by decode). Tokens must leave the backbone by then: ForwardBatch forces the exit
  // at that layer and needs a river for the rest. Returns the bytes no longer kept.
  absl::StatusOr<int64_t> ReleaseBackboneLayersFrom(int resident_layers);
  // Backbone layers still held (n_layers unless released).
  int resident_layers() const { return resident_layers_; }

  // Holds the row-parallel projections (o, down) of every layer as `blocks` column blocks
  // (copies; the whole tensors stay in weights() for the river to quantize), so that Forward
  // sums their products in block order, as `blocks` TP ranks would (linear.h). 1 undoes it.
  // INVALID_ARGUMENT when `blocks` does not divide this rank's heads and MLP columns.
  absl::Status SplitRowParallel(int blocks);
  int row_parallel_blocks() const { return row_parallel_blocks_; }

  // Bytes of the dense weights of one decoder layer.
  int64_t layer_bytes(int layer) const { return backbone_projections(layer).bytes(); }
  // The dense (backbone) projections of `layer`, pointing into weights().
  LayerProjections backbone_projections(int layer) const;
  absl::Span<const float> rope_inv_freq() const { return rope_inv_freq_; }

  // Runs `tokens` at positions [start_pos, start_pos + tokens.size()) on the full backbone,
  // writing their K and V into `cache`, and writes the logits of the last token to `logits`
  // (vocab_size floats). INVALID_ARGUMENT for ids outside the vocabulary or positions beyond
  // the cache. (One-sequence shorthand for ForwardBatch.)
  absl::Status Forward(absl::Span<const int32_t> tokens, int start_pos, KvView& cache,
                       absl::Span<float> logits) const;

 private:
  LlamaModel(LlamaConfig config, LlamaWeights weights, TensorParallelRank tp);

  LlamaConfig config_;
  LlamaWeights weights_;
  TensorParallelRank tp_;
  int resident_layers_ = 0;
  int row_parallel_blocks_ = 1;
  // [layer][block] when row_parallel_blocks_ > 1.
  std::vector<std::vector<Tensor>> wo_blocks_, down_blocks_;
  std::vector<float> rope_inv_freq_;  // per pair of a head's dimensions
};

}  // namespace estuary
