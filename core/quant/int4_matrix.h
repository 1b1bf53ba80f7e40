#pragma once
// Int4Matrix: a weight matrix W[rows][cols] quantized to 4 bits per group of `group_size`
// consecutive columns of a row (the exit river's W4A16 weights, river-llm.md §1.2):
//
//   W[r][c] ≈ Ŵ[r][c] = q[r][c] * s[r][g] + m[r][g],   q in 0..15,  g = c / group_size.
//
// (s, m) is the asymmetric scale / zero-point pair in "scale + offset" form: m = -zero * s. The
// last group of a row is shorter when group_size does not divide cols (cols 172, g64: 64, 64, 44).
//
// Storage (one 64-byte aligned allocation, owned; the kernel streams it front to back):
//   Rows are cut into tiles of kTileRows = 4 consecutive rows (the last tile padded with zero
//   rows). Tile t occupies tile_bytes() bytes at data() + t * tile_bytes():
//     params:  f16 scale  [kTileRows][n_groups], then f16 offset [kTileRows][n_groups],
//              zero-padded to a multiple of 64 bytes (tile_param_bytes());
//     nibbles: [n_blocks][kTileRows][16 x u32]: per row, blocks of kBlockCols = 128 columns,
//              64 bytes each (the last block zero-padded). In block b, u32 word j (0..15) holds
//              column 128 b + 16 k + j in bits [4k, 4k+4), k = 0..7. A "slice" is the 16 columns
//              of one k: one vector of 16 f32 lanes on AVX-512, two on AVX2.
//   A stored f16 value v means v * param_multiplier(), a power of two chosen per matrix so that
//   the largest |s| or |m| is about 2^12 (no f16 overflow, and the full 11-bit precision for
//   every group down to 2^-26 of the largest).
//
// bytes() = n_tiles * tile_bytes(), with
//   tile_bytes = round_up(kTileRows * n_groups * 4, 64) + n_blocks * kTileRows * 64,
//   n_tiles = ceil(rows / 4), n_groups = ceil(cols / group_size), n_blocks = ceil(cols / 128).
// When 4 | rows, 128 | cols and (16 * n_groups) % 64 == 0 (every Llama shape), that is exactly
// 4 + 32 / group_size bits per weight: 4.5 at g64, 4.25 at g128, 5 at g32.
//
// Thread-safety: immutable after Quantize(); any number of threads may read it concurrently.

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor/tensor.h"
#include "hwy/aligned_allocator.h"

namespace estuary {

// How to quantize. Validate() accepts group_size 16, 32, 64, 128, 256, 512 or 1024 (a power of
// two, so that a group is a whole number of 16-column slices and either divides or is a whole
// number of 128-column blocks) and refine_iterations in [0, 1000].
struct Int4QuantOptions {
  int group_size = 64;
  // false: round to nearest from the group's min/max (RTN). true: start from RTN, then refine
  // (s, m) per group with HQQ-style half-quadratic iterations (lp shrinkage, p = 0.7) followed by
  // a small least-squares search; per group, whichever of RTN and refined has the lower squared
  // error (with the stored f16 values) is kept, so refinement never makes a group worse.
  bool refine = true;
  int refine_iterations = 20;  // HQQ iterations per group (each also tracks the best so far)
  int threads = 0;             // quantization threads; 0: std::thread::hardware_concurrency()

  absl::Status Validate() const;
};

// Totals over one Quantize() call, for logs and tests (squared errors in weight units).
struct Int4QuantStats {
  double sq_error = 0;      // Σ (W - Ŵ)² of the result
  double rtn_sq_error = 0;  // Σ (W - Ŵ_RTN)²: what plain RTN would have given
  int64_t groups = 0;
  int64_t refined_groups = 0;  // groups where the refined (s, m) won over RTN
  double seconds = 0;
};

class Int4Matrix {
 public:
  static constexpr int kTileRows = 4;
  static constexpr int kBlockCols = 128;
  static constexpr int kSliceCols = 16;
  static constexpr int kBlockBytes = 64;  // one row of one block

  Int4Matrix() = default;  // empty (rows() == 0)
  Int4Matrix(Int4Matrix&& other) noexcept { *this = std::move(other); }
  Int4Matrix& operator=(Int4Matrix&& other) noexcept;  // leaves `other` empty
  Int4Matrix(const Int4Matrix&) = delete;
  Int4Matrix& operator=(const Int4Matrix&) = delete;

  // Quantizes `weight`, a host tensor [rows][cols] in f32, bf16 or f16 (rows, cols >= 1).
  // INVALID_ARGUMENT for other shapes or dtypes, bad options, or a non-finite weight;
  // RESOURCE_EXHAUSTED when memory cannot be had. Runs on options.threads threads (split by tile);
  // the result does not depend on the thread count. `stats` (optional) receives totals.
  static absl::StatusOr<Int4Matrix> Quantize(const Tensor& weight,
                                             const Int4QuantOptions& options,
                                             Int4QuantStats* stats = nullptr);

  bool empty() const { return rows_ == 0; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t group_size() const { return group_size_; }
  int64_t n_groups() const { return n_groups_; }  // per row
  int64_t bytes() const { return n_tiles_ * tile_bytes_; }

  // Element access (reference code and tests; slow).
  int Code(int64_t r, int64_t c) const;               // q in 0..15
  float Scale(int64_t r, int64_t g) const;            // s in weight units
  float Offset(int64_t r, int64_t g) const;           // m in weight units
  float Dequantize(int64_t r, int64_t c) const;       // q * s + m, in f32
  absl::StatusOr<Tensor> DequantizeToF32() const;     // [rows][cols] f32

  // Layout, for kernels (see the comment at the top of this file).
  int64_t n_tiles() const { return n_tiles_; }
  int64_t n_blocks() const { return n_blocks_; }  // per row
  int64_t tile_bytes() const { return tile_bytes_; }
  int64_t tile_param_bytes() const { return tile_param_bytes_; }
  float param_multiplier() const { return param_multiplier_; }
  const uint8_t* data() const { return data_.get(); }
  const uint8_t* tile(int64_t t) const { return data_.get() + t * tile_bytes_; }
  const uint16_t* tile_scales(int64_t t) const {  // [kTileRows][n_groups] f16
    return reinterpret_cast<const uint16_t*>(tile(t));
  }
  const uint16_t* tile_offsets(int64_t t) const {  // [kTileRows][n_groups] f16
    return tile_scales(t) + kTileRows * n_groups_;
  }
  const uint32_t* tile_nibbles(int64_t t) const {  // [n_blocks][kTileRows][16]
    return reinterpret_cast<const uint32_t*>(tile(t) + tile_param_bytes_);
  }

 private:
  class Builder;  // int4_matrix.cc

  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t group_size_ = 0;
  int64_t n_groups_ = 0;
  int64_t n_blocks_ = 0;
  int64_t n_tiles_ = 0;
  int64_t tile_param_bytes_ = 0;
  int64_t tile_bytes_ = 0;
  float param_multiplier_ = 1.0f;
  hwy::AlignedFreeUniquePtr<uint8_t[]> data_;
};

}  // namespace estuary
