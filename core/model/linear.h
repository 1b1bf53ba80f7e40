#pragma once
// Linear: one projection's weights as the forward pass sees them: a dense Tensor ([out][in],
// f32/bf16/f16) on the backbone, or an Int4Matrix on the exit river. Non-owning: the model or the
// river owns the weights and outlives every Linear that points at them.

#include <cstdint>

#include "absl/status/status.h"
#include "core/quant/int4_matrix.h"
#include "core/tensor/tensor.h"

namespace estuary {

class Linear {
 public:
  Linear() = default;
  static Linear Dense(const Tensor& weight) { return Linear(&weight, nullptr); }
  static Linear Int4(const Int4Matrix& weight) { return Linear(nullptr, &weight); }

  // y[t] = W x[t] for t < n_tokens; x is [n_tokens][in], y is [n_tokens][out].
  [[nodiscard]] absl::Status Apply(const float* x, int64_t n_tokens, float* y) const;
  // Bytes of weights one application reads.
  int64_t bytes() const;
  bool is_int4() const { return int4_ != nullptr; }

 private:
  Linear(const Tensor* dense, const Int4Matrix* int4) : dense_(dense), int4_(int4) {}
  const Tensor* dense_ = nullptr;
  const Int4Matrix* int4_ = nullptr;
};

// The seven projections of one decoder layer, on one path (backbone or river).
struct LayerProjections {
  Linear wq, wk, wv, wo, w_gate, w_up, w_down;
  int64_t bytes() const;
};

}  // namespace estuary
