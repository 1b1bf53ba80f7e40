// Int4MatMul's AVX512-VNNI path (see int4_matmul_vnni.h for the numerics and the layout).
//
// Arithmetic, per row r, group g and token t (as in the Highway path, int4_matmul.cc):
//   y_rt = Σ_g s_rg e_tg Σ_{i∈g} q_ri x8_ti + Σ_g m_rg X_tg,   X_tg = Σ_{i∈g} x_ti (f32).
// Block b of a row is 32 u16 words; word j holds columns 32k + j in bits [4k, 4k+4). As bytes,
// byte 2j holds columns j (low nibble) and 32 + j (high), byte 2j+1 columns 64 + j and 96 + j.
// So AND 0x0F gives the 64 codes of columns {0..31, 64..95} ("lo"), shift-by-4 + AND those of
// {32..63, 96..127} ("hi"); a vpshufb per 16-byte lane then moves columns < 64 into int32 lanes
// 0-1 and columns >= 64 into lanes 2-3 of each 128-bit lane, so every int32 lane's 4 products
// belong to one group for every group size >= 32. The activations are permuted the same way.
// At a group end the int32 sums are converted and folded into f32 with one FMA by a vector of
// s_rg · e_tg (two groups blended with mask 0xCCCC at g32/g64).
//
// Kernels: kR rows × kT tokens of accumulators; the weights of a block are unpacked once per kR
// rows and serve kT tokens (gemv: 4 rows × 1 token; batches: kBlocks 2 rows × up to 4 tokens,
// kGroupLanes 4 rows × 2 tokens; the tile's chunk re-read from L1 per token chunk). The
// kGroupLanes kernel is LaneRows (below Rows). Every (row, token) runs the same operations in the
// same order whatever kT is, so results are bitwise independent of the batch.

#include "core/quant/int4_matmul_vnni.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/quant/int4_kernel_common.h"

#define ESTUARY_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace estuary::int4_vnni {
namespace {

using int4_kernel_common::kBlockCols;
using int4_kernel_common::kMaxChunkTokens;
using int4_kernel_common::kParamStride;
using int4_kernel_common::kTileRows;
using int4_kernel_common::Scratch;

struct Prepared {
  int64_t n_tokens = 0;
  int64_t padded_groups = 0;  // token stride of xstep / xsum
  const int8_t* x8 = nullptr;  // [n_blocks][n_tokens][128], permuted (PermutedIndex)
  const float* xstep = nullptr;
  const float* xsum = nullptr;
};

// Byte position of column c (0..127) of a block in the kernel's order: [lo 64 bytes][hi 64].
constexpr int64_t PermutedIndex(int64_t c) {
  const int64_t half = c / 64, within = c % 64;
  const int64_t v = within / 32, jj = within % 32;
  return v * 64 + 16 * (jj / 8) + jj % 8 + 8 * half;
}

// x8 in the order of the matrix's layout: PermutedIndex per block for kBlocks, lanes per
// group for kGroupLanes (`group_lanes`).
ESTUARY_VNNI_TARGET void PrepareToken(const float* x, int64_t cols, int64_t group,
                                      int64_t padded_cols, int64_t padded_groups, int8_t* x8,
                                      int64_t block_stride, float* xstep, float* xsum,
                                      int8_t* natural, bool group_lanes) {
  for (int64_t g = 0; g < padded_groups; ++g) {
    const int64_t begin = g * group, end = std::min(cols, begin + group);
    if (begin >= cols) {
      xstep[g] = 0.0f;
      xsum[g] = 0.0f;
      continue;
    }
    __m512 s = _mm512_setzero_ps(), m = _mm512_setzero_ps();
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      s = _mm512_add_ps(s, v);
      m = _mm512_max_ps(m, _mm512_abs_ps(v));
    }
    float ss = _mm512_reduce_add_ps(s), mm = _mm512_reduce_max_ps(m);
    for (int64_t j = i; j < end; ++j) {
      ss += x[j];
      mm = std::max(mm, std::fabs(x[j]));
    }
    xsum[g] = ss;
    xstep[g] = mm / 127.0f;
    const float inv = mm > 0.0f ? 127.0f / mm : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    for (i = begin; i + 16 <= end; i += 16) {
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(natural + i), _mm512_cvtsepi32_epi8(q));
    }
    for (; i < end; ++i) {
      const float v = std::min(127.0f, std::max(-127.0f, std::nearbyint(x[i] * inv)));
      natural[i] = static_cast<int8_t>(v);
    }
  }
  for (int64_t i = cols; i < padded_cols; ++i) natural[i] = 0;
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

struct KernelArgs {
  const float* scales;   // s_rg · e_tg at scales[(t * kTileRows + r) * kParamStride + g]
  const float* offsets;  // m_rg at offsets[r * kParamStride + g]
  int64_t n_groups16;
  const int8_t* x8;      // block b, token t at x8 + b * x8_block_stride + t * 128
  int64_t x8_block_stride;
  const float* xsum;     // token t at xsum + t * x_stride
  int64_t x_stride;
  int64_t n_blocks;
  int64_t blocks_per_group;  // kMode == 2
  int64_t blocks_per_superblock;  // kGroupLanes: G / 8 blocks per 16 groups
};

ESTUARY_VNNI_TARGET inline __m512 Blend(const float* s, int64_t g_low, int64_t g_high) {
  return _mm512_mask_mov_ps(_mm512_set1_ps(s[g_low]), 0xCCCC, _mm512_set1_ps(s[g_high]));
}

// kMode: 0 = g32 (lo/hi sums apart, 4 groups a block), 1 = g64 (2 groups a block), 2 = groups
// of >= 128 columns spanning blocks_per_group blocks.
template <int kR, int kT, int kMode>
ESTUARY_VNNI_TARGET __attribute__((noinline)) void Rows(const uint8_t* words,
                                                         const KernelArgs& a, float* dots) {
  constexpr int kN = kR * kT;
  constexpr int kSums = kMode == 0 ? 2 : 1;
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i pattern = _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  __m512i isum[kSums][kN];
  __m512 acc[kN];
  for (int i = 0; i < kN; ++i) {
    for (int s = 0; s < kSums; ++s) isum[s][i] = _mm512_setzero_si512();
    acc[i] = _mm512_setzero_ps();
  }
  for (int64_t blk = 0; blk < a.n_blocks; ++blk) {
    const int8_t* xb = a.x8 + blk * a.x8_block_stride;
    const uint8_t* wb = words + blk * kTileRows * Int4Matrix::kBlockBytes;
    __m512i lo[kR], hi[kR];
    for (int r = 0; r < kR; ++r) {
      const __m512i w = _mm512_load_si512(wb + r * Int4Matrix::kBlockBytes);
      lo[r] = _mm512_shuffle_epi8(_mm512_and_si512(w, mask), pattern);
      hi[r] = _mm512_shuffle_epi8(_mm512_and_si512(_mm512_srli_epi16(w, 4), mask), pattern);
    }
    for (int t = 0; t < kT; ++t) {
      const __m512i xlo = _mm512_load_si512(xb + t * kBlockCols);
      const __m512i xhi = _mm512_load_si512(xb + t * kBlockCols + 64);
      for (int r = 0; r < kR; ++r) {
        const int i = r * kT + t;
        isum[0][i] = _mm512_dpbusd_epi32(isum[0][i], lo[r], xlo);
        isum[kSums - 1][i] = _mm512_dpbusd_epi32(isum[kSums - 1][i], hi[r], xhi);
      }
    }
    const bool flush = kMode < 2 || (blk + 1) % a.blocks_per_group == 0 || blk + 1 == a.n_blocks;
    if (flush) {
      for (int r = 0; r < kR; ++r) {
        for (int t = 0; t < kT; ++t) {
          const int i = r * kT + t;
          const float* s = a.scales + (t * kTileRows + r) * kParamStride;
          if constexpr (kMode == 0) {
            const int64_t g = 4 * blk;
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[0][i]), Blend(s, g, g + 2), acc[i]);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[1][i]), Blend(s, g + 1, g + 3),
                                     acc[i]);
          } else if constexpr (kMode == 1) {
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[0][i]),
                                     Blend(s, 2 * blk, 2 * blk + 1), acc[i]);
          } else {
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[0][i]),
                                     _mm512_set1_ps(s[blk / a.blocks_per_group]), acc[i]);
          }
          for (int s2 = 0; s2 < kSums; ++s2) isum[s2][i] = _mm512_setzero_si512();
        }
      }
    }
  }
  for (int r = 0; r < kR; ++r) {
    const float* off = a.offsets + r * kParamStride;
    for (int t = 0; t < kT; ++t) {
      __m512 total = acc[r * kT + t];
      const float* xsum = a.xsum + t * a.x_stride;
      for (int64_t g = 0; g < a.n_groups16; g += 16) {
        total = _mm512_fmadd_ps(_mm512_load_ps(off + g), _mm512_loadu_ps(xsum + g), total);
      }
      dots[r * kT + t] = _mm512_reduce_add_ps(total);
    }
  }
}

// Software prefetch distance of LaneRows' weight stream (8 blocks of a 4-row tile ahead). On a
// Zen 5 VM (int4_benchmark, 1B shapes, one thread) it took the GEMV from 6.5-8.2 to 10-14 GB/s
// while LoadChunkParams used masked loads; with plain loads there it is worth less: 14-24
// without, 15-21 with, and b4 8-12.5 without, 9-12.6 with (two runs each, noisy).
constexpr int64_t kPrefetchBytes = 2048;

// The kGroupLanes kernel: each int32 lane of isum is one group's exact Σ q x8 over the
// superblock's G / 8 blocks, so the scales apply once per 16 groups (one convert and one FMA by
// s_rg · e_tg, one FMA of m_rg · X_tg), against once per block and row-token pair above.
template <int kR, int kT>
ESTUARY_VNNI_TARGET __attribute__((noinline)) void LaneRows(const uint8_t* words,
                                                             const KernelArgs& a, float* dots) {
  constexpr int kN = kR * kT;
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512i isum[kN];
  __m512 acc[kN];
  for (int i = 0; i < kN; ++i) {
    isum[i] = _mm512_setzero_si512();
    acc[i] = _mm512_setzero_ps();
  }
  const int64_t steps = a.blocks_per_superblock;
  for (int64_t blk0 = 0, g = 0; blk0 < a.n_blocks; blk0 += steps, g += 16) {
    for (int64_t blk = blk0; blk < blk0 + steps; ++blk) {
      const int8_t* xb = a.x8 + blk * a.x8_block_stride;
      const uint8_t* wb = words + blk * kTileRows * Int4Matrix::kBlockBytes;
      __m512i lo[kR], hi[kR];
      for (int r = 0; r < kR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + kPrefetchBytes + r * 64), _MM_HINT_T0);
      }
      for (int r = 0; r < kR; ++r) {
        const __m512i w = _mm512_load_si512(wb + r * Int4Matrix::kBlockBytes);
        lo[r] = _mm512_and_si512(w, mask);
        hi[r] = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
      }
      for (int t = 0; t < kT; ++t) {
        const __m512i xlo = _mm512_load_si512(xb + t * kBlockCols);
        const __m512i xhi = _mm512_load_si512(xb + t * kBlockCols + 64);
        for (int r = 0; r < kR; ++r) {
          const int i = r * kT + t;
          isum[i] = _mm512_dpbusd_epi32(isum[i], lo[r], xlo);
          isum[i] = _mm512_dpbusd_epi32(isum[i], hi[r], xhi);
        }
      }
    }
    for (int r = 0; r < kR; ++r) {
      const __m512 offsets = _mm512_load_ps(a.offsets + r * kParamStride + g);
      for (int t = 0; t < kT; ++t) {
        const int i = r * kT + t;
        const float* s = a.scales + (t * kTileRows + r) * kParamStride + g;
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), _mm512_load_ps(s), acc[i]);
        acc[i] = _mm512_fmadd_ps(offsets, _mm512_loadu_ps(a.xsum + t * a.x_stride + g), acc[i]);
        isum[i] = _mm512_setzero_si512();
      }
    }
  }
  for (int i = 0; i < kN; ++i) dots[i] = _mm512_reduce_add_ps(acc[i]);
}

using RowsFn = void (*)(const uint8_t*, const KernelArgs&, float*);

template <int kR, int kT>
RowsFn PickRows(const Int4Matrix& w) {
  if (w.layout() == Int4Layout::kGroupLanes) return &LaneRows<kR, kT>;
  if (w.group_size() == 32) return &Rows<kR, kT, 0>;
  if (w.group_size() == 64) return &Rows<kR, kT, 1>;
  return &Rows<kR, kT, 2>;
}

// f16 params of a chunk to f32 [8][kParamStride], zero from n_groups to n_groups16.
ESTUARY_VNNI_TARGET void LoadChunkParams(const uint16_t* src, int64_t n_groups,
                                         int64_t n_groups16, float* out) {
  for (int64_t row = 0; row < 2 * kTileRows; ++row) {
    const uint16_t* in = src + row * n_groups;
    float* dst = out + row * kParamStride;
    for (int64_t g = 0; g < n_groups16; g += 16) {
      const int64_t n = std::clamp<int64_t>(n_groups - g, 0, 16);
      // A plain load where all 16 are there. These reads lead each chunk's part of the weight
      // stream, and masked loads seem not to train the hardware prefetcher: with them the
      // single-thread GEMV read 10-14 GB/s, with plain loads 15-21 (int4_benchmark, 1B shapes,
      // Zen 5 VM; a standalone loop over the same layout: 10-14 when the parameter lines are
      // skipped, 20-25 when they are read with plain loads).
      const __m256i h = n == 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + g))
                                : _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1u),
                                                           in + g);
      _mm512_store_ps(dst + g, _mm512_cvtph_ps(h));
    }
  }
}

ESTUARY_VNNI_TARGET void CombineScales(const float* scales, int64_t n_groups16,
                                       const float* xstep, int64_t x_stride, int chunk,
                                       float* out) {
  for (int t = 0; t < chunk; ++t) {
    for (int64_t r = 0; r < kTileRows; ++r) {
      const float* s = scales + r * kParamStride;
      float* o = out + (t * kTileRows + r) * kParamStride;
      for (int64_t g = 0; g < n_groups16; g += 16) {
        _mm512_store_ps(o + g, _mm512_mul_ps(_mm512_load_ps(s + g),
                                             _mm512_loadu_ps(xstep + t * x_stride + g)));
      }
    }
  }
}

void PanelTiles(const Int4Matrix& w, int pi, const Prepared& p, int64_t tile_begin,
                int64_t tile_end, float* y) {
  const Int4Matrix::Panel& pn = w.panel(pi);
  const bool gemv = p.n_tokens == 1;
  const int64_t n_groups16 = (pn.n_groups + 15) / 16 * 16;
  float* params = static_cast<float*>(
      Scratch(0, static_cast<size_t>((2 + kMaxChunkTokens) * kTileRows * kParamStride) * 4));
  float* combined = params + 2 * kTileRows * kParamStride;
  // kGroupLanes batches: the tile's 4 rows x 2 tokens, so that the weights stream front to back
  // (a 2-row pass touches every other 128 bytes and stalls on memory); the chunk is re-read from
  // L1 for each further pair of tokens.
  const bool lanes = w.layout() == Int4Layout::kGroupLanes;
  const int row_step = gemv || lanes ? 4 : 2;
  const int token_step = gemv ? 1 : lanes ? 2 : kMaxChunkTokens;
  RowsFn fns[kMaxChunkTokens + 1] = {nullptr};
  if (gemv) {
    fns[1] = PickRows<4, 1>(w);
  } else if (lanes) {
    fns[1] = PickRows<4, 1>(w);
    fns[2] = PickRows<4, 2>(w);
  } else {
    fns[1] = PickRows<2, 1>(w);
    fns[2] = PickRows<2, 2>(w);
    fns[3] = PickRows<2, 3>(w);
    fns[4] = PickRows<2, 4>(w);
  }
  KernelArgs a;
  a.n_groups16 = n_groups16;
  a.x8_block_stride = p.n_tokens * kBlockCols;
  a.x_stride = p.padded_groups;
  a.n_blocks = pn.n_blocks;
  a.blocks_per_group = std::max<int64_t>(1, w.group_size() / kBlockCols);
  a.blocks_per_superblock = w.group_size() / 8;
  int4_kernel_common::RunPanelTiles(
      w, pi, p.n_tokens, tile_begin, tile_end, row_step, token_step, y,
      [&](int64_t tile) {
        LoadChunkParams(w.chunk_params(pi, tile), pn.n_groups, n_groups16, params);
      },
      [&](int64_t t0, int chunk) {
        CombineScales(params, n_groups16, p.xstep + t0 * p.padded_groups + pn.group0,
                      p.padded_groups, chunk, combined);
        a.x8 = p.x8 + (pn.col0 / kBlockCols) * a.x8_block_stride + t0 * kBlockCols;
        a.xsum = p.xsum + t0 * p.padded_groups + pn.group0;
      },
      [&](int64_t tile, int64_t r0, int chunk, float* dots) {
        a.scales = combined + r0 * kParamStride;
        a.offsets = params + (kTileRows + r0) * kParamStride;
        const auto* nibbles = reinterpret_cast<const uint8_t*>(w.chunk_nibbles(pi, tile));
        fns[chunk](nibbles + r0 * Int4Matrix::kBlockBytes, a, dots);
      });
}

// Scratch slot 1 of the caller: [xsum][xstep][x8][natural].
Prepared Prepare(const Int4Matrix& w, const float* x, int64_t n_tokens) {
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
  for (int64_t t = 0; t < n_tokens; ++t) {
    PrepareToken(x + t * cols, cols, w.group_size(), padded_cols, p.padded_groups,
                 x8 + t * kBlockCols, n_tokens * kBlockCols, xstep + t * p.padded_groups,
                 xsum + t * p.padded_groups, natural,
                 w.layout() == Int4Layout::kGroupLanes);
  }
  p.x8 = x8;
  p.xstep = xstep;
  p.xsum = xsum;
  return p;
}

}  // namespace

bool Available() {
  static const bool available = __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512vnni");
  return available;
}

void MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, WorkerPool& pool) {
  if (w.empty() || n_tokens <= 0) return;
  const Prepared p = Prepare(w, x, n_tokens);
  pool.ParallelFor(w.n_tiles(), [&](int64_t begin, int64_t end) {
    for (int pi = 0; pi < w.n_panels(); ++pi) PanelTiles(w, pi, p, begin, end, y);
  });
}

}  // namespace estuary::int4_vnni
