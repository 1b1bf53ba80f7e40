#include "core/model/linear.h"

#include <algorithm>
#include <vector>

#include "core/common/status_macros.h"

#include "core/kernels/cpu/kernels.h"
#include "core/quant/int4_matmul.h"

namespace estuary {
namespace {
constexpr int64_t kInt4ThreadedBytes = int64_t{2} << 20;
}  // namespace

absl::Status Linear::ApplyBlock(int block, const float* x, int64_t n_tokens, float* y,
                               const kernels::cpu::MatMulOptions& matmul) const {
  if (int4_ != nullptr) {
    // More threads only pay off on matrices that do not fit the caches (int4_matmul.h).
    const bool large = int4_[block].bytes() >= kInt4ThreadedBytes;
    Int4MatMul(int4_[block], x, n_tokens, y,
               large && matmul.pool != nullptr ? *matmul.pool : WorkerPool::Serial());
    return absl::OkStatus();
  }
  if (dense_ == nullptr || !dense_[block].defined()) {
    return absl::FailedPreconditionError("Linear has no weights (backbone layer released?)");
  }
  return kernels::cpu::MatMul(dense_[block], x, n_tokens, y, matmul);
}

int64_t Linear::block_cols(int block) const {
  return int4_ != nullptr ? int4_[block].cols() : dense_[block].dim(1);
}

absl::Status Linear::Apply(const float* x, int64_t n_tokens, float* y,
                           const kernels::cpu::MatMulOptions& matmul) const {
  if (blocks_ == 1) return ApplyBlock(0, x, n_tokens, y, matmul);
  if (dense_ != nullptr && !dense_[0].defined()) return ApplyBlock(0, x, n_tokens, y, matmul);
  int64_t in = 0;
  for (int b = 0; b < blocks_; ++b) in += block_cols(b);
  const int64_t out = int4_ != nullptr ? int4_[0].rows() : dense_[0].dim(0);
  std::vector<float> x_block, partial(static_cast<size_t>(n_tokens * out));
  int64_t col = 0;
  for (int b = 0; b < blocks_; ++b) {
    const int64_t cols = block_cols(b);
    x_block.resize(static_cast<size_t>(n_tokens * cols));
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::copy_n(x + t * in + col, cols, x_block.data() + t * cols);
    }
    float* dst = b == 0 ? y : partial.data();
    ESTUARY_RETURN_IF_ERROR(ApplyBlock(b, x_block.data(), n_tokens, dst, matmul));
    if (b > 0) {
      for (size_t i = 0; i < partial.size(); ++i) y[i] += partial[i];
    }
    col += cols;
  }
  return absl::OkStatus();
}

int64_t Linear::bytes() const {
  int64_t total = 0;
  for (int b = 0; b < blocks_; ++b) {
    if (int4_ != nullptr) {
      total += int4_[b].bytes();
    } else if (dense_ != nullptr) {
      total += static_cast<int64_t>(dense_[b].nbytes());
    }
  }
  return total;
}

int64_t LayerProjections::bytes() const {
  return wq.bytes() + wk.bytes() + wv.bytes() + wo.bytes() + w_gate.bytes() + w_up.bytes() +
         w_down.bytes();
}

}  // namespace estuary
