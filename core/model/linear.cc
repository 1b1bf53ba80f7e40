#include "core/model/linear.h"

#include "core/kernels/cpu/kernels.h"
#include "core/quant/int4_matmul.h"

namespace estuary {

absl::Status Linear::Apply(const float* x, int64_t n_tokens, float* y) const {
  if (int4_ != nullptr) {
    Int4MatMul(*int4_, x, n_tokens, y);
    return absl::OkStatus();
  }
  if (dense_ == nullptr || !dense_->defined()) {
    return absl::FailedPreconditionError("Linear has no weights (backbone layer released?)");
  }
  return kernels::cpu::MatMul(*dense_, x, n_tokens, y);
}

int64_t Linear::bytes() const {
  if (int4_ != nullptr) return int4_->bytes();
  return dense_ != nullptr ? static_cast<int64_t>(dense_->nbytes()) : 0;
}

int64_t LayerProjections::bytes() const {
  return wq.bytes() + wk.bytes() + wv.bytes() + wo.bytes() + w_gate.bytes() + w_up.bytes() +
         w_down.bytes();
}

}  // namespace estuary
