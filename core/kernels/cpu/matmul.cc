// MatMul: the GEMV for one token, the batched GEMV for a decode step of several sequences,
// OpenBLAS sgemm for a prefill-sized batch (see kernels.h).

#include <cblas.h>

#include <algorithm>
#include <atomic>
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
// weight for all tokens); above it OpenBLAS sgemm. Measured on Zen 4 (2 cores shared with other
// jobs), bf16 at the four Llama-3.2-1B shapes against sgemm over widened panels
// on one and on two BLAS threads, median wall time per call: the batched GEMV is 2-16x faster at
// 2-16 tokens, 2.2-2.9x at 32 and 1.6-2.1x at 64 (1.1-2x in a noisier run); at 96-128 it was
// still ahead of one-thread sgemm (1.3-1.6x) but two-thread sgemm won on two shapes in one run
// (0.84-0.92x). f32 and f16 at 2048x2048: 1.2-1.6x at 64. That measurement ran the batched GEMV
// on one thread; it now splits rows over the rank's pool (RowSplitGemv), which can only help it
// against two-thread sgemm. 64 keeps decode batches (2-32 sequences) on the batched GEMV and
// leaves prefill chunks to sgemm.
constexpr int64_t kGemvBatchMaxTokens = 64;

// One token: the decode GEMV over `rows` rows starting at `w` (raw rows of `dtype`).
void Gemv(DType dtype, const void* w, const float* x, int64_t rows, int64_t n_in, float* y) {
  switch (dtype) {
    case DType::kF32:
      GemvF32(static_cast<const float*>(w), x, rows, n_in, y);
      break;
    case DType::kBF16:
      GemvBf16(static_cast<const uint16_t*>(w), x, rows, n_in, y);
      break;
    case DType::kF16:
      GemvF16(static_cast<const uint16_t*>(w), x, rows, n_in, y);
      break;
    case DType::kInt4:
      break;
  }
}

// A few tokens: the batched GEMV, x [n_tokens][n_in], y [n_tokens][rows].
void GemvBatch(DType dtype, const void* w, const float* x, int64_t n_tokens, int64_t rows,
               int64_t n_in, float* y) {
  switch (dtype) {
    case DType::kF32:
      GemvBatchF32(static_cast<const float*>(w), x, n_tokens, rows, n_in, y);
      break;
    case DType::kBF16:
      GemvBatchBf16(static_cast<const uint16_t*>(w), x, n_tokens, rows, n_in, y);
      break;
    case DType::kF16:
      GemvBatchF16(static_cast<const uint16_t*>(w), x, n_tokens, rows, n_in, y);
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

// Below this many multiply-adds a row block is not worth a thread of the pool. The pool's
// helpers spin between the kernels of a decode step, so handing them a block costs about a
// microsecond; 2^18 FMAs are ~0.5 MiB of bf16 weight, ~25 us of one core's streaming read. With
// it, every projection of a 1B-class decode step (the 512-row K/V ones included) is split.
constexpr int64_t kMinFmasPerThread = int64_t{1} << 18;

// Row blocks start at multiples of this many rows, so that every row sits at the same place of
// the kernels' register tiles as in the unsplit call (gemv.cc: kBf16Rows <= 8 and kRows = 4;
// gemv_batch.cc: kTileRows <= 4; all divide 16). A bf16 row past the last full tile runs a
// different accumulator layout (gemv.cc's Bf16RowDot), so an unaligned split would change bits.
constexpr int64_t kRowAlign = 16;

// Row blocks per thread of a split call of up to kFewTokens tokens (decode). Threads claim
// blocks in order from a shared counter, so a thread that starts late or runs slow (a core shared
// with other processes) does fewer of them instead of holding the whole call up; which thread
// runs a block changes none of its bits. Larger calls (prefill chunks on kBatchInvariant) take
// one block per thread: each kernel call prepares its x once (bf16 rounding or even/odd
// reordering), which is nothing for a few tokens but megabytes for a 512-token chunk, and with
// four blocks per thread it cost 40% on the 512-row K/V projections (bench-prefill, 1B shapes).
constexpr int64_t kBlocksPerThread = 4;
constexpr int64_t kFewTokens = 16;

// The row-split GEMV behind both paths: rows [0, n_out) on `pool` (one thread per
// kMinFmasPerThread multiply-adds at most, blocks as above, boundaries multiples of kRowAlign),
// each block's kernel on its rows alone. `single_gemv` (one token, kFastest) runs the GEMV
// straight into y; otherwise each block's batched GEMV writes [n_tokens][rows] into per-thread
// scratch, then copied into its columns of y (y directly when one block covers every row).
// Splitting rows changes no element's accumulation order: the output is bitwise the serial one
// (kernels_test).
void RowSplitGemv(const Tensor& weight, const float* x, int64_t n_tokens, bool single_gemv,
                  WorkerPool& pool, float* y) {
  const int64_t n_out = weight.dim(0), n_in = weight.dim(1);
  const DType dtype = weight.dtype();
  const auto* base = static_cast<const uint8_t*>(weight.raw());
  const size_t row_bytes = DTypeBytes(dtype, static_cast<size_t>(n_in));
  auto run_rows = [&](int64_t begin, int64_t end) {
    const void* w = base + static_cast<size_t>(begin) * row_bytes;
    const int64_t rows = end - begin;
    if (single_gemv) {
      Gemv(dtype, w, x, rows, n_in, y + begin);
      return;
    }
    if (rows == n_out) {
      GemvBatch(dtype, w, x, n_tokens, rows, n_in, y);
      return;
    }
    thread_local std::vector<float> out;
    out.resize(static_cast<size_t>(n_tokens * rows));
    GemvBatch(dtype, w, x, n_tokens, rows, n_in, out.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::memcpy(y + t * n_out + begin, out.data() + t * rows,
                  static_cast<size_t>(rows) * sizeof(float));
    }
  };
  const int64_t units = (n_out + kRowAlign - 1) / kRowAlign;
  const int64_t by_work = std::max<int64_t>(1, n_tokens * n_out * n_in / kMinFmasPerThread);
  const int64_t threads = std::min<int64_t>({pool.size(), by_work, units});
  if (threads <= 1) {
    run_rows(0, n_out);
    return;
  }
  const int64_t blocks =
      std::min(units, n_tokens <= kFewTokens ? threads * kBlocksPerThread : threads);
  std::atomic<int64_t> next{0};
  pool.ParallelFor(
      threads,
      [&](int64_t, int64_t) {
        for (int64_t b; (b = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) {
          run_rows(std::min(n_out, units * b / blocks * kRowAlign),
                   std::min(n_out, units * (b + 1) / blocks * kRowAlign));
        }
      },
      static_cast<int>(threads));
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

  // The GEMV paths: kBatchInvariant at every size (the batched GEMV, even for one token),
  // kFastest up to kGemvBatchMaxTokens.
  const bool invariant = options.path == MatMulPath::kBatchInvariant;
  if (invariant || n_tokens <= kGemvBatchMaxTokens) {
    RowSplitGemv(weight, x, n_tokens, /*single_gemv=*/!invariant && n_tokens == 1,
                 options.pool != nullptr ? *options.pool : WorkerPool::Serial(), y);
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
