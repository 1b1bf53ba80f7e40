#pragma once
// Megatron sharding of a Llama model over tensor-parallel ranks (design §6).
//
// Rank r of p holds:
//   - wq, wk, wv, w_gate, w_up split by output: query heads [r*H/p, (r+1)*H/p), KV heads
//     [r*KV/p, (r+1)*KV/p), MLP columns [r*F/p, (r+1)*F/p). Contiguous rows of [out][in], so
//     these share storage with the whole model's tensors (no copy).
//   - wo and w_down split by input (the matching columns), copied into the rank's own tensors;
//     each rank's product is a partial sum that an all-reduce completes.
//   - embedding, norms and LM head whole (replicated): the residual stream is whole on every
//     rank after each all-reduce, so every rank computes the same exit similarity and takes the
//     same exit decision without any message, and the first token is sampled from logits that
//     rank 0 computes on its own (no vocabulary-parallel gather).
// The exit river of a rank is built from that rank's shard (River::Build on its weights), so its
// int4 KV lands in the rank's own pages.
//
// Contiguous head blocks keep grouped-query attention local: query head h reads KV head
// h / (H / KV), and rank r's query heads map exactly onto its KV heads.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/llama_config.h"
#include "core/model/llama_model.h"
#include "core/model/llama_weights.h"

namespace estuary {

// Columns [begin, end) of a rank-2 dense tensor, copied (columns are not contiguous in
// [out][in]).
absl::StatusOr<Tensor> CopyColumns(const Tensor& tensor, int64_t begin, int64_t end);

// OK when `config` can be split `tp_size` ways: tp_size >= 1 and it divides n_heads, n_kv_heads
// and hidden_dim. INVALID_ARGUMENT names the dimension otherwise (KV heads are never
// replicated: a rank holds a whole number of them).
absl::Status CheckTensorParallelSize(const LlamaConfig& config, int tp_size);

// Rank tp.rank's share of `weights` (a whole model matching `config`).
absl::StatusOr<LlamaWeights> ShardWeights(const LlamaConfig& config, const LlamaWeights& weights,
                                          TensorParallelRank tp);

}  // namespace estuary
