#pragma once
// Int4Matrix: a weight matrix W[rows][cols] quantized to 4 bits per group of `group_size`
// consecutive columns of a row (the exit river's W4A16 weights, river-llm.md §1.2):
//
//   W[r][c] ≈ Ŵ[r][c] = q[r][c] * s[r][g] + m[r][g],   q in 0..15,  g = c / group_size.
//
// (s, m) is the asymmetric scale / zero-point pair in "scale + offset" form: m = -zero * s. The
// last group of a row is shorter when group_size does not divide cols (cols 172, g64: 64, 64, 44).
//
// Storage (one allocation, owned; 64-byte aligned, 2 MiB aligned with transparent huge pages
// requested from 1 MiB up; a GEMV streams it front to back):
//   Columns are cut into panels of kPanelCols = 4096 (the last one shorter), so that a kernel's
//   working copy of x for one panel stays in L1 next to the weight stream. Rows are cut into
//   tiles of kTileRows = 4 (the last tile padded with zero rows). The storage is panel-major:
//   panel 0 of every tile, then panel 1 of every tile, ... One panel of one tile (a "chunk") is
//     params:  f16 scale  [kTileRows][panel groups], then f16 offset [kTileRows][panel groups],
//              zero-padded to a multiple of 64 bytes;
//     nibbles: [panel blocks][kTileRows][32 x u16]: per row, blocks of kBlockCols = 128
//              columns, 64 bytes each (the last block zero-padded). In block b, u16 word j
//              (0..31) holds column 128 b + 32 k + j of the panel in bits [4k, 4k+4), k = 0..3.
//              A "slice" is the 32 columns of one k: one vector of 32 u16 lanes on AVX-512 (two
//              on AVX2), which the kernel unpacks with one or two integer ops.
//   Groups never straddle panels (group_size divides kPanelCols).
//   Layout kGroupLanes (the int8 kernels' order, VNNI and AVX2, chosen at Quantize; see Int4Layout)
//   keeps every size and offset above and permutes the nibbles of each (block, row) 64 bytes:
//   block b of a panel is step k = b % (G / 8) of superblock sb = b / (G / 8), the panel's groups
//   16 sb .. 16 sb + 15 (G = group_size); byte 4 L + j (lane L = 0..15, j = 0..3) holds column
//   (16 sb + L) G + 8 k + j of the panel in its low nibble and column (16 sb + L) G + 8 k + 4 + j
//   in its high nibble. So one 64-byte load, one AND and one shift + AND give 4 codes of each
//   of 16 groups per int32 lane, and a group's codes x int8 activations sum in one lane with
//   vpdpbusd; the scales then apply once per 16 groups. It needs whole superblocks of whole
//   groups: every panel has cols_p == n_groups_p * G and 16 | n_groups_p (GroupLanesFit).
//   A stored f16 value v means v * param_multiplier(), a power of two chosen per matrix so that
//   the largest |s| or |m| is about 2^12 (no f16 overflow, and the full 11-bit precision for
//   every group down to 2^-26 of the largest).
//
// bytes() = n_tiles * Σ_panels (round_up(kTileRows * groups_p * 4, 64) + blocks_p * 256), with
//   n_tiles = ceil(rows / 4), groups_p = ceil(cols_p / group_size), blocks_p = ceil(cols_p / 128)
//   for a panel of cols_p columns. When 4 | rows, 128 | cols and 16 | groups_p (every Llama
//   shape), that is exactly 4 + 32 / group_size bits per weight: 4.5 at g64, 4.25 at g128,
//   5 at g32.
//
// Thread-safety: immutable after Quantize(); any number of threads may read it concurrently.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor/tensor.h"

namespace estuary {

// The nibble order of a matrix (see "Layout kGroupLanes" above).
enum class Int4Layout : uint8_t {
  kAuto,        // kGroupLanes where Int4MatMul runs an int8 kernel and the shape fits, else kBlocks
  kBlocks,      // every kernel reads it (Highway, VNNI, the GPU packer through Code())
  kGroupLanes,  // the int8 kernels only (Int4MatMul always takes one for such a matrix)
};

// How to quantize. Validate() accepts group_size 32, 64, 128, 256, 512 or 1024 (a power of two,
// so that a group is a whole number of 32-column slices and either divides or is a whole number
// of 128-column blocks) and refine_iterations in [0, 1000].
struct Int4QuantOptions {
  int group_size = 64;
  // false: round to nearest from the group's min/max (RTN; the f16 offset is rounded down and
  // the scale up, so every weight stays within s/2 of its code). true: start from RTN, refine
  // (s, m) per group with HQQ-style half-quadratic iterations (lp shrinkage, p = 0.7) followed by
  // a small least-squares search; per group, whichever of RTN and refined has the lower squared
  // error (with the stored f16 values) is kept, so refinement never makes a group worse.
  bool refine = true;
  int refine_iterations = 20;  // HQQ iterations per group (each also tracks the best so far)
  int threads = 0;             // quantization threads; 0: std::thread::hardware_concurrency()
  // kGroupLanes explicitly: FAILED_PRECONDITION without AVX512-VNNI or AVX2, INVALID_ARGUMENT
  // when the shape does not fit (GroupLanesFit).
  Int4Layout layout = Int4Layout::kAuto;

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
  static constexpr int kSliceCols = 32;
  static constexpr int kBlockBytes = 64;  // one row of one block
  static constexpr int kPanelCols = 4096;

  // One column panel (see the layout above).
  struct Panel {
    int64_t col0 = 0;         // first column
    int64_t cols = 0;         // columns in this panel
    int64_t group0 = 0;       // index of its first group in the row
    int64_t n_groups = 0;     // groups in this panel
    int64_t n_blocks = 0;     // 128-column blocks in this panel
    int64_t param_bytes = 0;  // params of one chunk (multiple of 64)
    int64_t chunk_bytes = 0;  // one tile's chunk: param_bytes + n_blocks * kTileRows * 64
    int64_t offset = 0;       // byte offset of (this panel, tile 0) in data()
  };

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
  int64_t bytes() const { return bytes_; }
  Int4Layout layout() const { return layout_; }  // kBlocks or kGroupLanes
  // True when a [.][cols] matrix of `group_size` can take Int4Layout::kGroupLanes.
  static bool GroupLanesFit(int64_t cols, int64_t group_size);

  // Element access (reference code and tests; slow).
  int Code(int64_t r, int64_t c) const;            // q in 0..15
  float Scale(int64_t r, int64_t g) const;         // s in weight units
  float Offset(int64_t r, int64_t g) const;        // m in weight units
  float Dequantize(int64_t r, int64_t c) const;    // q * s + m, in f32
  absl::StatusOr<Tensor> DequantizeToF32() const;  // [rows][cols] f32

  // Layout, for kernels (see the comment at the top of this file).
  int64_t n_tiles() const { return n_tiles_; }
  int64_t n_blocks() const { return n_blocks_; }  // per row, all panels
  int n_panels() const { return static_cast<int>(panels_.size()); }
  const Panel& panel(int p) const { return panels_[static_cast<size_t>(p)]; }
  float param_multiplier() const { return param_multiplier_; }
  const uint8_t* data() const { return data_.get(); }
  const uint8_t* chunk(int p, int64_t tile) const {
    const Panel& pn = panel(p);
    return data_.get() + pn.offset + tile * pn.chunk_bytes;
  }
  // f16 scales [kTileRows][panel groups], then f16 offsets [kTileRows][panel groups].
  const uint16_t* chunk_params(int p, int64_t tile) const {
    return reinterpret_cast<const uint16_t*>(chunk(p, tile));
  }
  // [panel blocks][kTileRows][32] u16.
  const uint16_t* chunk_nibbles(int p, int64_t tile) const {
    return reinterpret_cast<const uint16_t*>(chunk(p, tile) + panel(p).param_bytes);
  }

 private:
  class Builder;  // int4_matrix.cc
  // Permutes tile `tile`'s nibbles from kBlocks into kGroupLanes order (int4_matrix.cc).
  void PermuteTileToGroupLanes(int64_t tile);

  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t group_size_ = 0;
  int64_t n_groups_ = 0;
  int64_t n_blocks_ = 0;
  int64_t n_tiles_ = 0;
  int64_t bytes_ = 0;
  float param_multiplier_ = 1.0f;
  Int4Layout layout_ = Int4Layout::kBlocks;
  struct Free {
    void operator()(uint8_t* p) const;
  };

  std::vector<Panel> panels_;
  std::unique_ptr<uint8_t[], Free> data_;
};

}  // namespace estuary
