#pragma once
// Row permutations of wq / wk between the two RoPE conventions (design §3): llama2.c (and Meta's
// original checkpoints) rotate interleaved pairs (2i, 2i+1) of each head, Hugging Face rotates
// halves (i, i + head_dim/2). Converting a checkpoint permutes the rows within each head so that
// the same rotation applies to the same numbers.

#include "absl/status/statusor.h"
#include "core/tensor/tensor.h"

namespace estuary {

// Interleaved -> halves: within each head of `head_dim` rows, new row j < head_dim/2 is old row
// 2j and new row head_dim/2 + j is old row 2j + 1 (the inverse of transformers'
// convert_llama_weights_to_hf permute). `w` is a host [n_heads * head_dim][in] matrix of any
// dtype but int4; returns a permuted copy.
absl::StatusOr<Tensor> InterleavedToHalvesRows(const Tensor& w, int head_dim);

// Halves -> interleaved: the inverse of InterleavedToHalvesRows.
absl::StatusOr<Tensor> HalvesToInterleavedRows(const Tensor& w, int head_dim);

}  // namespace estuary
