// The int8 paths' shared walk (int4_int8_path.h): activations prepared once per call in the
// calling thread's scratch, then row tiles split over the pool, panel by panel.

#include "core/quant/int4_int8_path.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/quant/int4_kernel_common.h"

namespace estuary::int4_int8 {
namespace {

using int4_kernel_common::CombineScales;
using int4_kernel_common::kBlockCols;
using int4_kernel_common::kMaxChunkTokens;
using int4_kernel_common::kParamStride;
using int4_kernel_common::kTileRows;
using int4_kernel_common::LoadChunkParams;
using int4_kernel_common::Scratch;

struct Prepared {
  int64_t n_tokens = 0;
  int64_t padded_groups = 0;   // token stride of xstep / xsum
  const int8_t* x8 = nullptr;  // [n_blocks][n_tokens][128], in the matrix's order
  const float* xstep = nullptr;
  const float* xsum = nullptr;
};

// One token per group of `group` columns over padded_groups groups: xsum, xstep = max |x| / 127
// (both 0 past cols), and the int8 values in column order into natural[0, cols).
void QuantizeToken(const Int8Path& path, const float* x, int64_t cols, int64_t group,
                   int64_t padded_groups, float* xstep, float* xsum, int8_t* natural) {
  for (int64_t g = 0; g < padded_groups; ++g) {
    const int64_t begin = g * group, end = std::min(cols, begin + group);
    if (begin >= cols) {
      xstep[g] = 0.0f;
      xsum[g] = 0.0f;
      continue;
    }
    float sum = 0.0f, max_abs = 0.0f;
    for (int64_t i = begin + path.sum_max_abs(x + begin, end - begin, &sum, &max_abs); i < end;
         ++i) {
      sum += x[i];
      max_abs = std::max(max_abs, std::fabs(x[i]));
    }
    xsum[g] = sum;
    xstep[g] = max_abs / 127.0f;
    const float inv = max_abs > 0.0f ? 127.0f / max_abs : 0.0f;
    for (int64_t i = begin + path.round_to_int8(x + begin, end - begin, inv, natural + begin);
         i < end; ++i) {
      natural[i] =
          static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(x[i] * inv))));
    }
  }
}

// natural (padded_cols int8 in column order) into x8 in the order of the matrix's layout:
// PermutedIndex per block for kBlocks, lanes per group for kGroupLanes.
void PermuteToken(const int8_t* natural, int64_t padded_cols, int64_t group, bool group_lanes,
                  int8_t* x8, int64_t block_stride) {
  if (group_lanes) {
    // Block b = (superblock, step k) of a panel; per group, columns 8k..8k+3 go to lane L of the
    // block's first 64 bytes, 8k+4..8k+7 to lane L of the second (int4_matrix.h).
    const int64_t steps = group / 8;
    for (int64_t col0 = 0; col0 < padded_cols; col0 += Int4Matrix::kPanelCols) {
      const int64_t block0 = col0 / kBlockCols;
      const int64_t panel_groups =
          std::min<int64_t>(Int4Matrix::kPanelCols, padded_cols - col0) / group;
      for (int64_t g = 0; g < panel_groups; ++g) {
        const int8_t* src = natural + col0 + g * group;
        for (int64_t k = 0; k < steps; ++k) {
          int8_t* dst = x8 + (block0 + (g / 16) * steps + k) * block_stride + 4 * (g % 16);
          std::memcpy(dst, src + 8 * k, 4);
          std::memcpy(dst + 64, src + 8 * k + 4, 4);
        }
      }
    }
    return;
  }
  for (int64_t b = 0; b * kBlockCols < padded_cols; ++b) {
    int8_t* dst = x8 + b * block_stride;
    const int8_t* src = natural + b * kBlockCols;
    for (int64_t c = 0; c < kBlockCols; c += 8) std::memcpy(dst + PermutedIndex(c), src + c, 8);
  }
}

// Scratch slot 1 of the caller: [xsum][xstep][x8][natural].
Prepared Prepare(const Int8Path& path, const Int4Matrix& w, const float* x, int64_t n_tokens) {
  Prepared p;
  const int64_t cols = w.cols();
  const int64_t padded_cols = w.n_blocks() * kBlockCols;
  p.n_tokens = n_tokens;
  p.padded_groups = (w.n_groups() + 15) / 16 * 16 + 16;
  auto* base = static_cast<uint8_t*>(Scratch(
      1, static_cast<size_t>(n_tokens * (8 * p.padded_groups + padded_cols) + padded_cols)));
  float* xsum = reinterpret_cast<float*>(base);
  float* xstep = xsum + n_tokens * p.padded_groups;
  auto* x8 = reinterpret_cast<int8_t*>(xstep + n_tokens * p.padded_groups);
  int8_t* natural = x8 + n_tokens * padded_cols;
  const bool group_lanes = w.layout() == Int4Layout::kGroupLanes;
  for (int64_t t = 0; t < n_tokens; ++t) {
    QuantizeToken(path, x + t * cols, cols, w.group_size(), p.padded_groups,
                  xstep + t * p.padded_groups, xsum + t * p.padded_groups, natural);
    std::memset(natural + cols, 0, static_cast<size_t>(padded_cols - cols));
    PermuteToken(natural, padded_cols, w.group_size(), group_lanes, x8 + t * kBlockCols,
                 n_tokens * kBlockCols);
  }
  p.x8 = x8;
  p.xstep = xstep;
  p.xsum = xsum;
  return p;
}

void PanelTiles(const Int8Path& path, const Int4Matrix& w, int pi, const Prepared& p,
                int64_t tile_begin, int64_t tile_end, float* y) {
  const Int4Matrix::Panel& pn = w.panel(pi);
  const int64_t n_groups16 = (pn.n_groups + 15) / 16 * 16;
  RowsFn fns[kMaxChunkTokens + 1] = {nullptr};
  int row_step = 0, token_step = 0;
  bool f16_params = false;
  path.pick_kernels(w, p.n_tokens == 1, fns, &row_step, &token_step, &f16_params);
  KernelArgs a{};
  a.n_groups16 = n_groups16;
  a.x8_block_stride = p.n_tokens * kBlockCols;
  a.x_stride = p.padded_groups;
  a.n_blocks = pn.n_blocks;
  a.blocks_per_group = std::max<int64_t>(1, w.group_size() / kBlockCols);
  a.blocks_per_superblock = w.group_size() / 8;
  a.param_groups = pn.n_groups;
  // Kernels that read the f16 parameters read 16 groups at a time: only kGroupLanes ones, whose
  // panels GroupLanesFit makes whole superblocks (past a panel's last group the chunk holds other
  // bytes, which the f32 copy below zeroes).
  assert(!f16_params || pn.n_groups % 16 == 0);
  // Per token chunk: the chunk's activations; per kernel call: the tile's nibbles.
  const auto point_at_tokens = [&](int64_t t0) {
    a.x8 = p.x8 + (pn.col0 / kBlockCols) * a.x8_block_stride + t0 * kBlockCols;
    a.xsum = p.xsum + t0 * p.padded_groups + pn.group0;
    return p.xstep + t0 * p.padded_groups + pn.group0;  // its steps e_tg
  };
  const auto run = [&](int64_t tile, int64_t r0, int chunk, float* dots) {
    const auto* nibbles = reinterpret_cast<const uint8_t*>(w.chunk_nibbles(pi, tile));
    fns[chunk](nibbles + r0 * Int4Matrix::kBlockBytes, a, dots);
  };
  // Two walks rather than one with a branch per tile: the branches cost an L2-resident GEMV
  // about 7% on a Zen 3 VM (the walk's share of a profile 6% -> 13%).
  if (f16_params) {
    int4_kernel_common::RunPanelTiles(
        w, pi, p.n_tokens, tile_begin, tile_end, row_step, token_step, y,
        [&](int64_t tile) { a.params16 = w.chunk_params(pi, tile); },
        [&](int64_t t0, int) { a.xstep = point_at_tokens(t0); }, run);
    return;
  }
  float* params = static_cast<float*>(
      Scratch(0, static_cast<size_t>((2 + kMaxChunkTokens) * kTileRows * kParamStride) * 4));
  float* combined = params + 2 * kTileRows * kParamStride;
  int4_kernel_common::RunPanelTiles(
      w, pi, p.n_tokens, tile_begin, tile_end, row_step, token_step, y,
      [&](int64_t tile) {
        LoadChunkParams(w.chunk_params(pi, tile), pn.n_groups, n_groups16, params);
      },
      [&](int64_t t0, int chunk) {
        CombineScales(params, n_groups16, point_at_tokens(t0), p.padded_groups, chunk, combined);
      },
      [&](int64_t tile, int64_t r0, int chunk, float* dots) {
        a.scales = combined + r0 * kParamStride;
        a.offsets = params + (kTileRows + r0) * kParamStride;
        run(tile, r0, chunk, dots);
      });
}

}  // namespace

void MatMul(const Int8Path& path, const Int4Matrix& w, const float* x, int64_t n_tokens,
            float* y, WorkerPool& pool) {
  if (w.empty() || n_tokens <= 0) return;
  const Prepared p = Prepare(path, w, x, n_tokens);
  pool.ParallelFor(w.n_tiles(), [&](int64_t begin, int64_t end) {
    for (int pi = 0; pi < w.n_panels(); ++pi) PanelTiles(path, w, pi, p, begin, end, y);
  });
}

}  // namespace estuary::int4_int8
