#pragma once
// Linear: one projection's weights as the forward pass sees them: a dense Tensor ([out][in],
// f32/bf16/f16) on the backbone, or an Int4Matrix on the exit river. Non-owning: the model or the
// river owns the weights and outlives every Linear that points at them.
//
// Column blocks: a row-parallel projection (o, down) may be held as B consecutive column blocks
// [out][in / B]; Apply then sums the blocks' products in block order, y = W_0 x_0 + W_1 x_1 + ...
// That is the arithmetic of B tensor-parallel ranks followed by an all-reduce, which is how a
// TP 1 model reproduces a TP 2 model bit for bit (sharded_model.h).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/kernels/cpu/kernels.h"
#include "core/quant/int4_matrix.h"
#include "core/tensor/tensor.h"

namespace estuary {

class Linear {
 public:
  Linear() = default;
  static Linear Dense(const Tensor& weight) { return Linear(&weight, nullptr, 1); }
  static Linear Int4(const Int4Matrix& weight) { return Linear(nullptr, &weight, 1); }
  // Column blocks of equal width, stored consecutively (a std::vector's elements).
  static Linear DenseBlocks(absl::Span<const Tensor> blocks) {
    return Linear(blocks.data(), nullptr, static_cast<int>(blocks.size()));
  }
  static Linear Int4Blocks(absl::Span<const Int4Matrix> blocks) {
    return Linear(nullptr, blocks.data(), static_cast<int>(blocks.size()));
  }

  // y[t] = W x[t] for t < n_tokens; x is [n_tokens][in], y is [n_tokens][out]. `matmul` picks
  // the dense kernel path (the int4 kernel is batch-invariant already).
  [[nodiscard]] absl::Status Apply(const float* x, int64_t n_tokens, float* y,
                                   const kernels::cpu::MatMulOptions& matmul = {}) const;
  // Bytes of weights one application reads.
  int64_t bytes() const;
  bool is_int4() const { return int4_ != nullptr; }

 private:
  Linear(const Tensor* dense, const Int4Matrix* int4, int blocks)
      : dense_(dense), int4_(int4), blocks_(blocks) {}
  // One block's product; x is [n_tokens][that block's columns].
  absl::Status ApplyBlock(int block, const float* x, int64_t n_tokens, float* y,
                          const kernels::cpu::MatMulOptions& matmul) const;
  int64_t block_cols(int block) const;

  const Tensor* dense_ = nullptr;
  const Int4Matrix* int4_ = nullptr;
  int blocks_ = 1;
};

// The seven projections of one decoder layer, on one path (backbone or river).
struct LayerProjections {
  Linear wq, wk, wv, wo, w_gate, w_up, w_down;
  int64_t bytes() const;
};

}  // namespace estuary
