#pragma once
// What the two int4 kernels share (int4_matmul.cc: Highway, int16 activations;
// int4_matmul_vnni.cc: AVX512-VNNI, int8 activations): their tile geometry, per-thread scratch,
// and the loop that walks one column panel's row tiles and token chunks and folds each kernel
// call's dot products into y. Internal to core/quant.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/quant/int4_matrix.h"
#include "hwy/aligned_allocator.h"

namespace estuary::int4_kernel_common {

constexpr int64_t kTileRows = Int4Matrix::kTileRows;
constexpr int64_t kBlockCols = Int4Matrix::kBlockCols;
constexpr int kMaxChunkTokens = 4;  // most tokens per kernel call
// Row stride of the f32 parameter buffers: the most groups a panel can have (g32), so that
// every (row, token) offset in a kernel is a compile-time constant.
constexpr int64_t kParamStride = Int4Matrix::kPanelCols / 32;

// Thread-local growable scratch, one per `slot` (0: a panel's parameters, 1: the prepared
// activations), 64-byte aligned; owned by the calling thread, reused by its next call.
inline void* Scratch(int slot, size_t bytes) {
  thread_local hwy::AlignedFreeUniquePtr<uint8_t[]> buffers[2];
  thread_local size_t capacity[2] = {0, 0};
  if (bytes > capacity[slot]) {
    buffers[slot] = hwy::AllocateAligned<uint8_t>(bytes);
    capacity[slot] = bytes;
  }
  return buffers[slot].get();
}

// A chunk's f16 scales then offsets (2 * kTileRows rows of n_groups) to f32
// [2 * kTileRows][kParamStride], zero from n_groups to n_groups16 (a multiple of 16), once per
// tile. Plain loads throughout (it reads up to 15 f16 past the last row, still inside the chunk:
// its nibbles follow). These reads lead each chunk's part of the weight stream, and masked loads
// seem not to train the hardware prefetcher: with them the VNNI GEMV read 10-14 GB/s on one
// thread, with plain loads 15-21 (int4_benchmark, 1B shapes, Zen 5 VM; a standalone loop over
// the same layout: 10-14 when the parameter lines are skipped, 20-25 when they are read with
// plain loads). Every path's; defined in int4_matmul.cc (Highway dispatch).
void LoadChunkParams(const uint16_t* src, int64_t n_groups, int64_t n_groups16, float* out);

// out[(t * kTileRows + r) * kParamStride + g] = scales[r * kParamStride + g] ·
// xstep[t * x_stride + g] for t < chunk, g < n_groups16 (a multiple of 16): each (row, token)'s
// s_rg · e_tg, once per tile and token chunk. Every path's; defined in int4_matmul.cc (Highway
// dispatch).
void CombineScales(const float* scales, int64_t n_groups16, const float* xstep, int64_t x_stride,
                   int chunk, float* out);

// Tiles [tile_begin, tile_end) of panel `pi` of y = W x over `n_tokens` tokens: per tile
// load_params(tile); per chunk of up to `token_step` tokens from t0, combine(t0, chunk); per
// `row_step` rows from r0, run(tile, r0, chunk, dots) fills dots[(r - r0) * chunk + t]. y[t][row]
// gets param_multiplier() * dot: stored by the first panel, added by later ones, so each output
// sums its panels in panel order whatever the thread split.
template <typename LoadParams, typename Combine, typename Run>
void RunPanelTiles(const Int4Matrix& w, int pi, int64_t n_tokens, int64_t tile_begin,
                   int64_t tile_end, int row_step, int token_step, float* y,
                   const LoadParams& load_params, const Combine& combine, const Run& run) {
  const bool first = pi == 0;
  const int64_t rows = w.rows();
  const float mult = w.param_multiplier();
  float dots[kTileRows * kMaxChunkTokens];
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    load_params(tile);
    const int64_t row0 = tile * kTileRows;
    const int64_t live = std::min<int64_t>(kTileRows, rows - row0);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += token_step) {
      const int chunk = static_cast<int>(std::min<int64_t>(token_step, n_tokens - t0));
      combine(t0, chunk);
      for (int64_t r0 = 0; r0 < live; r0 += row_step) {
        run(tile, r0, chunk, dots);
        for (int64_t r = r0; r < std::min<int64_t>(live, r0 + row_step); ++r) {
          for (int t = 0; t < chunk; ++t) {
            float& out = y[(t0 + t) * rows + row0 + r];
            const float value = mult * dots[(r - r0) * chunk + t];
            out = first ? value : out + value;
          }
        }
      }
    }
  }
}

}  // namespace estuary::int4_kernel_common
