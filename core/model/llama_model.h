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

class LlamaModel {
 public:
  // Checks every weight's shape and dtype against `config`; errors name the tensor.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaConfig config,
                                                            LlamaWeights weights);

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }

  // Backbone offloading (design §5): drops the dense weights of layers >= `resident_layers`, so
  // they are never read again (their memory is freed, or for a memory-mapped checkpoint never
  // paged in by decode). Tokens must leave the backbone by then: ForwardBatch forces the exit
  // at that layer and needs a river for the rest. Returns the bytes no longer kept.
  absl::StatusOr<int64_t> ReleaseBackboneLayersFrom(int resident_layers);
  // Backbone layers still held (n_layers unless released).
  int resident_layers() const { return resident_layers_; }

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
  LlamaModel(LlamaConfig config, LlamaWeights weights);

  LlamaConfig config_;
  LlamaWeights weights_;
  int resident_layers_ = 0;
  std::vector<float> rope_inv_freq_;  // per pair of a head's dimensions
};

}  // namespace estuary
