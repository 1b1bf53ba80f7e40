// Int4MatMul's AVX512-VNNI path (see int4_matmul_vnni.h for the numerics and the layout).
//
// Arithmetic, per row r, group g and token t (as in the Highway path, int4_matmul.cc):
//   y_rt = Σ_g s_rg e_tg Σ_{i∈g} q_ri x8_ti + Σ_g m_rg X_tg,   X_tg = Σ_{i∈g} x_ti (f32).
// Block b of a row is 32 u16 words; word j holds columns 32k + j in bits [4k, 4k+4). As bytes,
// byte 2j holds columns j (low nibble) and 32 + j (high), byte 2j+1 columns 64 + j and 96 + j.
// So AND 0x0F gives the 64 codes of columns {0..31, 64..95} ("lo"), shift-by-4 + AND those of
// {32..63, 96..127} ("hi"); a vpshufb per 16-byte lane then moves columns < 64 into int32 lanes
// 0-1 and columns >= 64 into lanes 2-3 of each 128-bit lane, so every int32 lane's 4 products
// belong to one group for every group size >= 32. The activations are permuted the same way
// (int4_int8_path.h, PermutedIndex, shared with the AVX2 path).
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

#include "core/quant/int4_int8_path.h"
#include "core/quant/int4_kernel_common.h"

#define ESTUARY_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace estuary::int4_vnni {
namespace {

using int4_kernel_common::kBlockCols;
using int4_kernel_common::kMaxChunkTokens;
using int4_kernel_common::kParamStride;
using int4_kernel_common::kTileRows;
using int4_int8::KernelArgs;
using int4_int8::RowsFn;

// Σ and max |x| over the first n - n % 16 of x; returns how many it covered (Int8Path).
ESTUARY_VNNI_TARGET int64_t SumMaxAbs(const float* x, int64_t n, float* sum, float* max_abs) {
  __m512 s = _mm512_setzero_ps(), m = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    s = _mm512_add_ps(s, v);
    m = _mm512_max_ps(m, _mm512_abs_ps(v));
  }
  *sum = _mm512_reduce_add_ps(s);
  *max_abs = _mm512_reduce_max_ps(m);
  return i;
}

// x · inv rounded to nearest even (the default rounding mode) into int8 with saturation, over
// the first n - n % 16 of x; returns how many it covered (Int8Path).
ESTUARY_VNNI_TARGET int64_t RoundToInt8(const float* x, int64_t n, float inv, int8_t* out) {
  const __m512 vinv = _mm512_set1_ps(inv);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtsepi32_epi8(q));
  }
  return i;
}

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

template <int kR, int kT>
RowsFn PickRows(const Int4Matrix& w) {
  if (w.layout() == Int4Layout::kGroupLanes) return &LaneRows<kR, kT>;
  if (w.group_size() == 32) return &Rows<kR, kT, 0>;
  if (w.group_size() == 64) return &Rows<kR, kT, 1>;
  return &Rows<kR, kT, 2>;
}

// Rows × tokens per kernel call: the GEMV 4 rows × 1 token; kBlocks batches 2 rows × up to 4
// tokens; kGroupLanes batches the tile's 4 rows × 2 tokens, so that the weights stream front to
// back (a 2-row pass touches every other 128 bytes and stalls on memory); the chunk is re-read
// from L1 for each further pair of tokens.
void PickKernels(const Int4Matrix& w, bool gemv, RowsFn* fns, int* row_step, int* token_step,
                 bool* f16_params) {
  *f16_params = false;  // the kernels read the walk's f32 copies
  const bool lanes = w.layout() == Int4Layout::kGroupLanes;
  *row_step = gemv || lanes ? 4 : 2;
  *token_step = gemv ? 1 : lanes ? 2 : kMaxChunkTokens;
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
}

constexpr int4_int8::Int8Path kPath = {&SumMaxAbs, &RoundToInt8, &PickKernels};

}  // namespace

bool Available() {
  static const bool available = __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512vnni");
  return available;
}

void MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, WorkerPool& pool) {
  int4_int8::MatMul(kPath, w, x, n_tokens, y, pool);
}

}  // namespace estuary::int4_vnni
