#pragma once
// Int4 weights × 16-bit (or f32) activations on the GPU: the exit river's W4A16 product
//
//   y[t][o] = Σ_i x[t][i] · Ŵ[o][i],   Ŵ[o][i] = q[o][i] · s[o][g] + m[o][g],  g = i / group_size,
//
// with the same (q, s, m) as an Int4Matrix (core/quant/int4_matrix.h) but in a GPU layout:
//
//   nibbles  [rows][cols / 32] chunks of 16 bytes (one uint4 load). Chunk k of row r holds
//            columns 32k .. 32k+31: its little-endian u32 word w (0..3) holds column 32k + 8w + j
//            in bits [4j, 4j+4), j = 0..7.
//   scales   f16 bits [rows][n_groups], offsets f16 bits [rows][n_groups];
//            s = f16(scale) · multiplier, m = f16(offset) · multiplier (one power of two per
//            matrix, as Int4Matrix::param_multiplier()).
//
// That is 4 + 32 / group_size bits per weight (4.5 at g64, 4.25 at g128), as on the CPU.
// Requirements: cols % 32 == 0 (every Llama shape), group_size a multiple of 32 (the river uses
// 64 or 128; a chunk never straddles two groups; the last group of a row may be shorter), rows and
// cols below 2^31, x 16-byte aligned (cudaMalloc memory is).
//
// Kernel (int4_matmul_kernel.cu): a warp takes 4 rows and walks their 16-byte chunks with
// consecutive lanes on consecutive chunks (coalesced 512-byte rows), unpacks the nibbles in
// registers and adds s · Σ q·x + m · Σ x per chunk, all in f32; lanes are reduced with shuffles.
// Tokens run in tiles of up to 8 per block (grid.y over tiles), so any n_tokens works; it is
// meant for decode batches of 1..64. Not tuned: it has never run on a GPU. The same kernel body
// also serves the fused launches of decode_step_kernels.h (up to three matrices with the same
// columns in one launch, and silu(gate) * up computed on load).
//
// Numerics: f32 accumulation throughout (activations are not rounded to 16 bits, unlike the CPU
// Int4MatMul). Tolerance (int4_matmul_test): |y - y_ref| <= 2e-5 · Σ_i |x_i| (|s| q_i + |m|) +
// 1e-6 with y_ref = Σ_i x_i · Int4Matrix::Dequantize(o, i) in double.
//
// Thread-safety: the packers are pure functions; Int4GpuMatrix is immutable after Upload.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/kernels/cuda/int4_matmul_kernel.h"
#include "core/quant/int4_matrix.h"
#include "core/tensor/tensor.h"

namespace estuary::cuda {

// The GPU layout above, on the host.
struct Int4GpuHost {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;
  int64_t n_groups = 0;
  float multiplier = 1.0f;
  std::vector<uint8_t> nibbles;    // rows * cols / 2 bytes
  std::vector<uint16_t> scales;    // rows * n_groups
  std::vector<uint16_t> offsets;   // rows * n_groups
};

// Repacks an Int4Matrix (RTN or HQQ-refined, any group size that is a multiple of 32) without
// changing any q, s or m: the f32 s and m the kernel computes are Int4Matrix::Scale / Offset bit
// for bit (only the kernel's summation order differs from the CPU's, see Numerics).
// INVALID_ARGUMENT for an empty matrix, cols % 32 != 0, or a (s, m) that is not exactly
// f16 · param_multiplier() (cannot happen for a matrix from Int4Matrix::Quantize unless the
// product underflows f32, i.e. for weights below ~2^-110).
absl::StatusOr<Int4GpuHost> PackInt4ForGpu(const Int4Matrix& matrix);

// Quantizes a dense host weight [rows][cols] (f32, bf16 or f16) with round-to-nearest and packs
// it: exactly Int4Matrix::Quantize with {group_size, refine = false} followed by PackInt4ForGpu,
// so the RTN rule (offset rounded down, scale up to f16; codes round-half-up) is the CPU's with no
// difference. `threads` as Int4QuantOptions::threads (0: all cores).
absl::StatusOr<Int4GpuHost> QuantizeInt4ForGpu(const Tensor& weight, int group_size,
                                               int threads = 0);

// Device copy of an Int4GpuHost (owned; freed with the object). Movable, not copyable.
class Int4GpuMatrix {
 public:
  // Synchronous upload (cudaMalloc + cudaMemcpy) to the current device. RESOURCE_EXHAUSTED when
  // device memory runs out; INTERNAL for other CUDA errors; INVALID_ARGUMENT for an inconsistent
  // host struct.
  static absl::StatusOr<Int4GpuMatrix> Upload(const Int4GpuHost& host);

  Int4GpuMatrix() = default;
  Int4GpuMatrix(Int4GpuMatrix&& other) noexcept { *this = static_cast<Int4GpuMatrix&&>(other); }
  Int4GpuMatrix& operator=(Int4GpuMatrix&& other) noexcept;
  Int4GpuMatrix(const Int4GpuMatrix&) = delete;
  Int4GpuMatrix& operator=(const Int4GpuMatrix&) = delete;
  ~Int4GpuMatrix();

  const Int4GpuView& view() const { return view_; }
  int64_t device_bytes() const { return bytes_; }

 private:
  void* memory_ = nullptr;  // one allocation: nibbles, scales, offsets
  int64_t bytes_ = 0;
  Int4GpuView view_;
};

// y[t][o] = Σ_i x[t][i] Ŵ[o][i] for t < n_tokens; x f32 [n_tokens][cols], y f32
// [n_tokens][rows], device pointers, asynchronous on `stream`. n_tokens == 0 is a no-op.
// INVALID_ARGUMENT for shapes the kernel does not take (see above), null or misaligned pointers,
// n_tokens < 0 or > 524280; INTERNAL with the CUDA error name when the launch fails.
[[nodiscard]] absl::Status Int4MatMul(const Int4GpuView& w, const float* x, int64_t n_tokens,
                                      float* y, cudaStream_t stream);
// Same with bf16 activations (raw bits).
[[nodiscard]] absl::Status Int4MatMul(const Int4GpuView& w, const uint16_t* x_bf16,
                                      int64_t n_tokens, float* y, cudaStream_t stream);

// Row-masked forms (a decode step's river / backbone split, decode_step_kernels.h): only rows t
// with row_path[t] == want_path are computed (row_path: device int32 [n_tokens], read by the
// kernel, so it may be written by earlier work on `stream`; nullptr = every row); the other rows
// of y are left untouched. Token tiles are formed from the wanted rows only, and a block whose
// tile is empty returns before reading any weight, so a path no row takes costs one launch.
// A wanted row's y is bitwise the same as the unmasked product's. Same checks as above.
[[nodiscard]] absl::Status Int4MatMul(const Int4GpuView& w, const float* x, int64_t n_tokens,
                                      const int32_t* row_path, int32_t want_path, float* y,
                                      cudaStream_t stream);
[[nodiscard]] absl::Status Int4MatMul(const Int4GpuView& w, const uint16_t* x_bf16,
                                      int64_t n_tokens, const int32_t* row_path,
                                      int32_t want_path, float* y, cudaStream_t stream);

// Int4MatMul's checks of one weight view, shared with the launchers that take views
// (decode_step_kernels.h): INVALID_ARGUMENT, the message starting with `what`, for a shape the
// kernel does not take (see Requirements above: cols % 32, group_size % 32, n_groups, rows and
// cols below 2^31) and, when `check_pointers`, for null nibbles / scales / offsets or nibbles not
// 16-byte aligned.
[[nodiscard]] absl::Status CheckInt4GpuView(const Int4GpuView& w, absl::string_view what,
                                            bool check_pointers);

}  // namespace estuary::cuda
