// Int4MatMul's AVX2 int8 path (see int4_matmul_avx2.h), for CPUs with AVX2 but no AVX512-VNNI
// (AMD Zen 2/3, Intel before Ice Lake). Same block order, activation permutation and numerics as
// the VNNI path (int4_matmul_vnni.cc, int4_int8_path.h), on 256-bit vectors: a 64-byte block
// row is two 32-byte halves, each giving 32 "lo" codes (AND 0x0F) and 32 "hi" codes (shift by 4
// + AND) put in group order by the same in-lane vpshufb. Where VNNI has one vpdpbusd per 64
// codes, this path has vpmaddubsw (u8 codes × s8 activations, adjacent pairs summed into int16:
// at most 2 · 15 · 127 = 3810, no saturation) and vpmaddwd by ones (pairs of int16 into int32).
// The same int32 lane of the two halves holds columns of the same group, and for groups of 64
// columns and more so do a lo and a hi lane, so the int16 pairs of a block are added first (at
// most 4 · 3810 = 15240 < 2^15) and one vpmaddwd serves a block (two at g32). That is for
// kBlocks matrices; kGroupLanes ones (written at Quantize where this path runs and the shape
// fits) need no shuffle and take their scales once per 16 groups (LaneGemv, LaneBatch below):
// batches of 4 and 16 run 6% and 16% faster that way on a Zen 3 VM, the GEMV the same.
//
// Kernels: for kBlocks, kR rows × kT tokens of accumulators (the GEMV 4 rows × 1 token, batches
// 4 rows × 2 tokens; one row's codes live at a time, x re-read from L1 per row); for kGroupLanes,
// LaneGemv and LaneBatch, which read the tile's f16 scales and offsets themselves (FoldLanes)
// instead of f32 copies the walk would make per tile: the GEMV on a Zen 3 VM, one thread, a
// 512 x 2048 matrix in L2, 19.6-22.7 GB/s against 12.2-17.0 with the copies (five alternating
// runs); the 1B shapes from DRAM, 7.9-10.4 against 6.7-9.0 (three). In every kernel each
// (row, token) runs the same operations in the same order whatever the rows and tokens of the
// call, so results are bitwise independent of the batch.

#include "core/quant/int4_matmul_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/quant/int4_int8_path.h"
#include "core/quant/int4_kernel_common.h"

#define ESTUARY_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

namespace estuary::int4_avx2 {
namespace {

using int4_int8::KernelArgs;
using int4_int8::RowsFn;
using int4_kernel_common::kBlockCols;
using int4_kernel_common::kParamStride;
using int4_kernel_common::kTileRows;

ESTUARY_AVX2_TARGET inline float SumOfLanes(__m256 v) {
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

ESTUARY_AVX2_TARGET inline float MaxOfLanes(__m256 v) {
  const __m128 four = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_max_ss(two, _mm_movehdup_ps(two)));
}

// Σ and max |x| over the first n - n % 8 of x; returns how many it covered (Int8Path).
ESTUARY_AVX2_TARGET int64_t SumMaxAbs(const float* x, int64_t n, float* sum, float* max_abs) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 s = _mm256_setzero_ps(), m = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    s = _mm256_add_ps(s, v);
    m = _mm256_max_ps(m, _mm256_and_ps(v, abs_mask));
  }
  *sum = SumOfLanes(s);
  *max_abs = MaxOfLanes(m);
  return i;
}

// x · inv rounded to nearest even (the default rounding mode) into int8, over the first
// n - n % 32 of x; returns how many it covered (Int8Path).
ESTUARY_AVX2_TARGET int64_t RoundToInt8(const float* x, int64_t n, float inv, int8_t* out) {
  // packs_epi32 then packs_epi16 leave 4-value runs interleaved across the two 128-bit lanes.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256 vinv = _mm256_set1_ps(inv);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), vinv));
    }
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permutevar8x32_epi32(bytes, order));
  }
  return i;
}

// The scale vectors of a block for the codes' lane order: int32 lanes 0-1 of each 128-bit lane
// hold columns < 64 of the block, lanes 2-3 columns >= 64. g64: groups 2b, 2b + 1 as
// (s0 s0 s1 s1) per 128-bit lane from one 8-byte broadcast; g32: lo codes groups 4b, 4b + 2 and
// hi codes 4b + 1, 4b + 3 from one 16-byte broadcast.
ESTUARY_AVX2_TARGET inline __m256 PairScales(const float* s) {
  const __m256 pair = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(s)));
  return _mm256_permute_ps(pair, _MM_SHUFFLE(1, 1, 0, 0));
}

// Software prefetch distance of the weight stream: 8 blocks of a 4-row tile ahead (into the next
// tile's chunk near a chunk's end), as on the VNNI path. The hardware prefetcher alone does not
// keep far enough ahead of a kernel this busy: on a Zen 3 VM a standalone loop of this kernel
// over a linear stream read 10.0 GB/s on one thread against a 13.2 GB/s plain read, and 12.9
// with this prefetch (2 threads: 14.7 -> 16.3 against 16.9). In the whole matmul
// (int4_benchmark's shapes, 15 interleaved rounds, median / best) it is worth less: one thread
// 9.7-9.8 -> 10.0-10.6 / 10.8-11.3 -> 11.6-12.1 GB/s at 1 token, 5.0-5.2 -> 5.2-5.4 / 5.4-5.5
// -> 5.8-5.9 at 4; 1, 4 and the T1 hint were no better than 2 KiB.
constexpr int64_t kPrefetchBytes = 2048;

// Prefetches the tile's 4 block rows kPrefetchBytes past `block` (the tile's block at hand).
ESTUARY_AVX2_TARGET inline void PrefetchTileBlock(const uint8_t* block) {
  for (int r = 0; r < kTileRows; ++r) {
    const uint8_t* ahead = block + kPrefetchBytes + r * Int4Matrix::kBlockBytes;
    _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
  }
}

// kMode: 0 = g32 (lo/hi sums apart, 4 groups a block), 1 = g64 (2 groups a block), 2 = groups
// of >= 128 columns spanning blocks_per_group blocks. At g32 and g64 a block's int32 sums are
// folded into f32 as they are made; wider groups sum blocks in int32 first.
template <int kR, int kT, int kMode>
ESTUARY_AVX2_TARGET __attribute__((noinline)) void Rows(const uint8_t* words,
                                                         const KernelArgs& a, float* dots) {
  constexpr int kN = kR * kT;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i pattern = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256i isum[kN];  // kMode 2: the group's int32 sums so far
  __m256 acc[kN];
  for (int i = 0; i < kN; ++i) {
    isum[i] = _mm256_setzero_si256();
    acc[i] = _mm256_setzero_ps();
  }
  for (int64_t blk = 0; blk < a.n_blocks; ++blk) {
    const int8_t* xb = a.x8 + blk * a.x8_block_stride;
    const uint8_t* wb = words + blk * kTileRows * Int4Matrix::kBlockBytes;
    const bool flush = kMode < 2 || (blk + 1) % a.blocks_per_group == 0 || blk + 1 == a.n_blocks;
    PrefetchTileBlock(wb);
    // Row by row, so that one row's codes are live at a time (16 registers); x is re-read from
    // L1 per row.
    for (int r = 0; r < kR; ++r) {
      // codes[2h] / codes[2h + 1]: the lo / hi codes of half h (bytes [32h, 32h + 32) of the
      // row's block), paired with x8 bytes [32h, 32h + 32) / [64 + 32h, 96 + 32h)
      // (PermutedIndex).
      __m256i codes[4];
      for (int h = 0; h < 2; ++h) {
        const __m256i w = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(wb + r * Int4Matrix::kBlockBytes + 32 * h));
        codes[2 * h] = _mm256_shuffle_epi8(_mm256_and_si256(w, mask), pattern);
        codes[2 * h + 1] =
            _mm256_shuffle_epi8(_mm256_and_si256(_mm256_srli_epi16(w, 4), mask), pattern);
      }
      for (int t = 0; t < kT; ++t) {
        const int i = r * kT + t;
        const int8_t* xt = xb + t * kBlockCols;
        __m256i p[4];
        for (int h = 0; h < 2; ++h) {
          p[2 * h] = _mm256_maddubs_epi16(
              codes[2 * h], _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + 32 * h)));
          p[2 * h + 1] = _mm256_maddubs_epi16(
              codes[2 * h + 1],
              _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + 64 + 32 * h)));
        }
        const float* s = a.scales + (t * kTileRows + r) * kParamStride;
        // The two halves' int32 lanes hold the same groups: their int16 pairs add first.
        if constexpr (kMode == 0) {
          const __m256i lo = _mm256_madd_epi16(_mm256_add_epi16(p[0], p[2]), ones);
          const __m256i hi = _mm256_madd_epi16(_mm256_add_epi16(p[1], p[3]), ones);
          const __m256 four = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(s + 4 * blk));
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo),
                                   _mm256_permute_ps(four, _MM_SHUFFLE(2, 2, 0, 0)), acc[i]);
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi),
                                   _mm256_permute_ps(four, _MM_SHUFFLE(3, 3, 1, 1)), acc[i]);
        } else {
          const __m256i sum = _mm256_madd_epi16(
              _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])), ones);
          if constexpr (kMode == 1) {
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), PairScales(s + 2 * blk), acc[i]);
          } else {
            isum[i] = _mm256_add_epi32(isum[i], sum);
            if (flush) {
              acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]),
                                       _mm256_set1_ps(s[blk / a.blocks_per_group]), acc[i]);
              isum[i] = _mm256_setzero_si256();
            }
          }
        }
      }
    }
  }
  for (int r = 0; r < kR; ++r) {
    const float* off = a.offsets + r * kParamStride;
    for (int t = 0; t < kT; ++t) {
      __m256 total = acc[r * kT + t];
      const float* xsum = a.xsum + t * a.x_stride;
      for (int64_t g = 0; g < a.n_groups16; g += 8) {
        total = _mm256_fmadd_ps(_mm256_load_ps(off + g), _mm256_loadu_ps(xsum + g), total);
      }
      dots[r * kT + t] = SumOfLanes(total);
    }
  }
}

// The kGroupLanes kernels (int4_matrix.h): int32 lane L of a block row's half h (bytes
// [32h, 32h + 32)) holds 4 codes of group 8h + L of the superblock in its low nibbles and 4 more
// in its high ones, so a half's lo and hi vpmaddubsw pairs add (≤ 2 · 3810) and one vpmaddwd
// per half puts each group's sum in its own int32 lane: no byte shuffle, and the scales apply once
// per superblock (16 groups, G / 8 blocks) instead of once per block and row-token pair as in
// Rows. isum[h] holds the exact Σ q x8 of groups 8h..8h + 7 over the superblock so far.
struct LaneCodes {
  __m256i lo[2], hi[2];
};

ESTUARY_AVX2_TARGET inline LaneCodes UnpackLanes(const uint8_t* block_row, __m256i mask) {
  LaneCodes c;
  for (int h = 0; h < 2; ++h) {
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(block_row + 32 * h));
    c.lo[h] = _mm256_and_si256(w, mask);
    c.hi[h] = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
  }
  return c;
}

// isum[h] += each group's Σ q x8 of one block row and one token's block xt.
ESTUARY_AVX2_TARGET inline void AddLaneSums(const LaneCodes& c, const int8_t* xt, __m256i ones,
                                            __m256i* isum) {
  for (int h = 0; h < 2; ++h) {
    const __m256i pairs = _mm256_add_epi16(
        _mm256_maddubs_epi16(c.lo[h],
                             _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + 32 * h))),
        _mm256_maddubs_epi16(
            c.hi[h], _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + 64 + 32 * h))));
    isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(pairs, ones));
  }
}

// acc + row r's and token t's Σ_g s_rg e_tg isum_g + m_rg X_tg over the superblock's 16 groups
// from g: s_rg · e_tg and m_rg formed here from the tile's f16 parameters (a.params16) and the
// token's steps (a.xstep), the same products and sums in the same order as the f32 copies the
// walk makes for other kernels (LoadChunkParams, CombineScales), so the same bits.
ESTUARY_AVX2_TARGET inline __m256 FoldLanes(const __m256i* isum, const KernelArgs& a, int r,
                                            int t, int64_t g, __m256 acc) {
  const uint16_t* s16 = a.params16 + r * a.param_groups + g;
  const uint16_t* m16 = s16 + kTileRows * a.param_groups;
  const float* xstep = a.xstep + t * a.x_stride + g;
  const float* xsum = a.xsum + t * a.x_stride + g;
  for (int h = 0; h < 2; ++h) {
    const __m256 scale = _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s16 + 8 * h))),
        _mm256_loadu_ps(xstep + 8 * h));
    const __m256 offset =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m16 + 8 * h)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h]), scale, acc);
    acc = _mm256_fmadd_ps(offset, _mm256_loadu_ps(xsum + 8 * h), acc);
  }
  return acc;
}

// The GEMV: the tile's 4 rows block by block (the weights stream front to back; 8 sums live).
ESTUARY_AVX2_TARGET __attribute__((noinline)) void LaneGemv(const uint8_t* words,
                                                             const KernelArgs& a, float* dots) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[kTileRows];
  for (__m256& v : acc) v = _mm256_setzero_ps();
  const int64_t steps = a.blocks_per_superblock;
  for (int64_t blk0 = 0, g = 0; blk0 < a.n_blocks; blk0 += steps, g += 16) {
    __m256i isum[kTileRows][2];
    for (auto& sums : isum) sums[0] = sums[1] = _mm256_setzero_si256();
    for (int64_t blk = blk0; blk < blk0 + steps; ++blk) {
      const int8_t* xb = a.x8 + blk * a.x8_block_stride;
      const uint8_t* wb = words + blk * kTileRows * Int4Matrix::kBlockBytes;
      PrefetchTileBlock(wb);
      for (int r = 0; r < kTileRows; ++r) {
        AddLaneSums(UnpackLanes(wb + r * Int4Matrix::kBlockBytes, mask), xb, ones, isum[r]);
      }
    }
    for (int r = 0; r < kTileRows; ++r) {
      acc[r] = FoldLanes(isum[r], a, r, /*t=*/0, g, acc[r]);
    }
  }
  for (int r = 0; r < kTileRows; ++r) dots[r] = SumOfLanes(acc[r]);
}

// Batches of 2 to 4 tokens: the tile's rows one at a time through each superblock, so that
// only one row's 2 kT sums are live (no spills at kT = 4) and each block row is unpacked once
// for kT tokens; the superblock's other rows wait in L1. Against kBlocks on a Zen 3 VM
// (int4_benchmark's shapes, 1 and 2 threads, 11 interleaved rounds, three runs): 4 tokens
// 0.91-1.26x (median 1.06), 16 tokens 1.04-1.28x (median 1.16). Block by block, as the GEMV,
// 4 rows x 2 tokens (16 sums, which spill) measured 1.05-1.12x and 1.06-1.17x in one run: the
// same within this VM's noise. The GEMV row by row lost 22-38% (the weights no longer stream
// front to back).
template <int kT>
ESTUARY_AVX2_TARGET __attribute__((noinline)) void LaneBatch(const uint8_t* words,
                                                              const KernelArgs& a, float* dots) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[kTileRows * kT];
  for (__m256& v : acc) v = _mm256_setzero_ps();
  const int64_t steps = a.blocks_per_superblock;
  for (int64_t blk0 = 0, g = 0; blk0 < a.n_blocks; blk0 += steps, g += 16) {
    for (int r = 0; r < kTileRows; ++r) {
      __m256i isum[kT][2];
      for (auto& sums : isum) sums[0] = sums[1] = _mm256_setzero_si256();
      for (int64_t blk = blk0; blk < blk0 + steps; ++blk) {
        const uint8_t* wb = words + blk * kTileRows * Int4Matrix::kBlockBytes;
        if (r == 0) PrefetchTileBlock(wb);
        const LaneCodes codes = UnpackLanes(wb + r * Int4Matrix::kBlockBytes, mask);
        const int8_t* xb = a.x8 + blk * a.x8_block_stride;
        for (int t = 0; t < kT; ++t) AddLaneSums(codes, xb + t * kBlockCols, ones, isum[t]);
      }
      for (int t = 0; t < kT; ++t) {
        acc[r * kT + t] = FoldLanes(isum[t], a, r, t, g, acc[r * kT + t]);
      }
    }
  }
  for (int i = 0; i < kTileRows * kT; ++i) dots[i] = SumOfLanes(acc[i]);
}

template <int kR, int kT>
RowsFn PickRows(const Int4Matrix& w) {
  if (w.group_size() == 32) return &Rows<kR, kT, 0>;
  if (w.group_size() == 64) return &Rows<kR, kT, 1>;
  return &Rows<kR, kT, 2>;
}

// Rows × tokens per kernel call: the tile's 4 rows, so that the weights stream front to back;
// 1 token for the GEMV, 2 for batches (the tile's chunk re-read from L1 per further pair). On a
// Zen 3 VM (int4_benchmark, 1B shapes, one thread, best of two rounds) batches of 4 ran at
// 4.9-5.3 GB/s this way against 3.7-3.9 at 1 row × 4 tokens; 2 × 2 and 2 × 4 lay between.
// kGroupLanes matrices: the tile's 4 rows × 1 token for the GEMV, × up to 4 tokens for batches
// (LaneBatch goes row by row, so 4 tokens cost no spills).
void PickKernels(const Int4Matrix& w, bool gemv, RowsFn* fns, int* row_step, int* token_step,
                 bool* f16_params) {
  *row_step = 4;
  // The kGroupLanes kernels read the tile's f16 parameters themselves (FoldLanes), the kBlocks
  // ones the walk's f32 copies.
  *f16_params = w.layout() == Int4Layout::kGroupLanes;
  if (*f16_params) {
    *token_step = gemv ? 1 : 4;
    fns[1] = &LaneGemv;  // a batch's lone last token too: the same operations as LaneBatch<1>
    fns[2] = &LaneBatch<2>;
    fns[3] = &LaneBatch<3>;
    fns[4] = &LaneBatch<4>;
    return;
  }
  *token_step = gemv ? 1 : 2;
  fns[1] = PickRows<4, 1>(w);
  fns[2] = PickRows<4, 2>(w);
}

constexpr int4_int8::Int8Path kPath = {&SumMaxAbs, &RoundToInt8, &PickKernels};

}  // namespace

bool Available() {
  static const bool available = __builtin_cpu_supports("avx2") &&
                                __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return available;
}

void MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, WorkerPool& pool) {
  int4_int8::MatMul(kPath, w, x, n_tokens, y, pool);
}

}  // namespace estuary::int4_avx2
