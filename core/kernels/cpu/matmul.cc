// MatMul: the GEMV for one token, the batched GEMV for a decode step of several sequences,
// OpenBLAS sgemm for a prefill-sized batch (see kernels.h).

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cpu/widen.h"

namespace estuary::kernels::cpu {
namespace {

// Elements of one widened f32 panel (1 MiB): fits in L2 next to the activations.
constexpr int64_t kPanelElements = int64_t{1} << 18;

// From 2 up to this many tokens MatMul runs the batched GEMV (GemvBatch*: one pass over the
// weight for all tokens, single thread); above it OpenBLAS sgemm. Measured on Zen 4 (2 cores
// shared with other jobs), bf16 at the four Llama-3.2-1B shapes against sgemm over widened panels
// on one and on two BLAS threads, median wall time per call: the batched GEMV is 2-16x faster at
// 2-16 tokens, 2.2-2.9x at 32 and 1.6-2.1x at 64 (1.1-2x in a noisier run); at 96-128 it was
// still ahead of one-thread sgemm (1.3-1.6x) but two-thread sgemm won on two shapes in one run
// (0.84-0.92x). f32 and f16 at 2048x2048: 1.2-1.6x at 64. The batched GEMV does not use more
// threads, so with many free cores for BLAS the crossover moves lower; 64 keeps decode batches
// (2-32 sequences) on the batched GEMV and leaves prefill chunks to sgemm.
constexpr int64_t kGemvBatchMaxTokens = 64;

// One token: the decode GEMV.
void Gemv(const Tensor& weight, const float* x, int64_t n_out, int64_t n_in, float* y) {
  switch (weight.dtype()) {
    case DType::kF32:
      GemvF32(weight.data<float>(), x, n_out, n_in, y);
      break;
    case DType::kBF16:
      GemvBf16(weight.data<uint16_t>(), x, n_out, n_in, y);
      break;
    case DType::kF16:
      GemvF16(weight.data<uint16_t>(), x, n_out, n_in, y);
      break;
    case DType::kInt4:
      break;
  }
}

// A few tokens: the batched GEMV, x [n_tokens][n_in], y [n_tokens][n_out].
void GemvBatch(const Tensor& weight, const float* x, int64_t n_tokens, int64_t n_out, int64_t n_in,
               float* y) {
  switch (weight.dtype()) {
    case DType::kF32:
      GemvBatchF32(weight.data<float>(), x, n_tokens, n_out, n_in, y);
      break;
    case DType::kBF16:
      GemvBatchBf16(weight.data<uint16_t>(), x, n_tokens, n_out, n_in, y);
      break;
    case DType::kF16:
      GemvBatchF16(weight.data<uint16_t>(), x, n_tokens, n_out, n_in, y);
      break;
    case DType::kInt4:
      break;
  }
}

// y[t][o] = sum_i x[t][i] * w[o][i]: sgemm with W transposed, writing `n_out` columns of a
// row-major y whose row stride is `ldy`.
void SgemmXWt(const float* x, const float* w, int64_t n_tokens, int64_t n_out, int64_t n_in,
              float* y, int64_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n_tokens),
              static_cast<blasint>(n_out), static_cast<blasint>(n_in), 1.0f, x,
              static_cast<blasint>(n_in), w, static_cast<blasint>(n_in), 0.0f, y,
              static_cast<blasint>(ldy));
}

// Below this many multiply-adds a call is not worth a second thread.
constexpr int64_t kMinFmasPerThread = int64_t{1} << 20;

// The batch-invariant path: rows [0, n_out) in `threads` contiguous blocks, each block's batched
// GEMV on its own thread into its own scratch, then copied into its columns of y. Splitting rows
// changes nothing in any element's accumulation order.
void BatchInvariantMatMul(const Tensor& weight, const float* x, int64_t n_tokens, int64_t n_out,
                          int64_t n_in, WorkerPool& pool, float* y) {
  const int64_t by_work = std::max<int64_t>(1, n_tokens * n_out * n_in / kMinFmasPerThread);
  const int64_t blocks = std::min<int64_t>({pool.size(), by_work, n_out});
  if (blocks <= 1) {
    GemvBatch(weight, x, n_tokens, n_out, n_in, y);
    return;
  }
  auto run_block = [&](int64_t b) {
    const int64_t begin = n_out * b / blocks, end = n_out * (b + 1) / blocks;
    const int64_t rows = end - begin;
    const absl::StatusOr<Tensor> slice = weight.Rows(begin, end);  // in range by construction
    std::vector<float> out(static_cast<size_t>(n_tokens * rows));
    GemvBatch(*slice, x, n_tokens, rows, n_in, out.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::memcpy(y + t * n_out + begin, out.data() + t * rows,
                  static_cast<size_t>(rows) * sizeof(float));
    }
  };
  pool.ParallelFor(blocks, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) run_block(b);
  });
}

std::vector<float>& PanelScratch() {
  thread_local std::vector<float> panel;
  return panel;
}

}  // namespace

void SetCpuThreads(int threads) {
  // The count OpenBLAS picked at start-up (OPENBLAS_NUM_THREADS or the core count), captured
  // before we first change it, so that 0 can restore it.
  static const int library_default = openblas_get_num_threads();
  openblas_set_num_threads(threads > 0 ? threads : library_default);
}

absl::Status MatMul(const Tensor& weight, const float* x, int64_t n_tokens, float* y,
                    const MatMulOptions& options) {
  if (!weight.defined() || weight.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul needs a rank-2 weight, got ",
                     weight.defined() ? weight.DebugString() : std::string("an empty tensor")));
  }
  if (!internal::IsFloatWeight(weight.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul supports f32/bf16/f16 weights, got ", weight.DebugString()));
  }
  if (!weight.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul needs a host weight, got ", weight.DebugString()));
  }
  if (n_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: negative n_tokens ", n_tokens));
  }
  const int64_t n_out = weight.dim(0), n_in = weight.dim(1);
  if (n_tokens == 0 || n_out == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("MatMul: null activation pointer");
  }
  if (n_in == 0) {
    std::fill_n(y, n_tokens * n_out, 0.0f);
    return absl::OkStatus();
  }

  if (options.path == MatMulPath::kBatchInvariant) {
    BatchInvariantMatMul(weight, x, n_tokens, n_out, n_in,
                         options.pool != nullptr ? *options.pool : WorkerPool::Serial(), y);
    return absl::OkStatus();
  }
  if (n_tokens == 1) {
    Gemv(weight, x, n_out, n_in, y);
    return absl::OkStatus();
  }
  if (n_tokens <= kGemvBatchMaxTokens) {
    GemvBatch(weight, x, n_tokens, n_out, n_in, y);
    return absl::OkStatus();
  }

  if (weight.dtype() == DType::kF32) {
    SgemmXWt(x, weight.data<float>(), n_tokens, n_out, n_in, y, n_out);
    return absl::OkStatus();
  }
  // bf16/f16: widen `panel_rows` rows of W at a time, then one sgemm per panel writes the
  // matching columns of y.
  const int64_t panel_rows = std::min(n_out, std::max<int64_t>(16, kPanelElements / n_in));
  std::vector<float>& panel = PanelScratch();
  panel.resize(static_cast<size_t>(panel_rows * n_in));
  const auto* base = static_cast<const uint8_t*>(weight.raw());
  const size_t row_bytes = DTypeBytes(weight.dtype(), static_cast<size_t>(n_in));
  for (int64_t begin = 0; begin < n_out; begin += panel_rows) {
    const int64_t rows = std::min(panel_rows, n_out - begin);
    internal::WidenToF32(weight.dtype(), base + static_cast<size_t>(begin) * row_bytes, rows * n_in,
                         panel.data());
    SgemmXWt(x, panel.data(), n_tokens, rows, n_in, y + begin, n_out);
  }
  return absl::OkStatus();
}

}  // namespace estuary::kernels::cpu
