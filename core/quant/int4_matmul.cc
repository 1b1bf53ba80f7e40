// Int4MatMul: int4 weights (Int4Matrix layout, see int4_matrix.h) × f32 activations, Highway
// runtime dispatch. Memory order: one 4-row tile at a time (its f16 parameters, then its
// nibbles: one linear stream over the whole matrix); within a tile, block by block, the rows of a
// block side by side.
//
// GEMV (one token): the weights are streamed once, so the kernel must unpack at memory speed.
// Per group g of row r:  y_r = Σ_g s_rg Σ_{i∈g} q_i x_i + Σ_g m_rg X_g,  X_g = Σ_{i∈g} x_i.
// x is converted once per call to int16 per group: x_i ≈ x16_i · e_g with e_g = max_g |x| / 32767
// (relative error <= 2^-16 of the group's largest |x|: a 16-bit activation, as W4A16). Then
// Σ q_i x16_i is an exact integer: u16 lanes hold 4 nibbles, one shift and/or one AND give
// 32 codes, and one multiply-add of int16 pairs (vpmaddwd) plus one add accumulate them in int32
// — about half the work of widening codes to f32, which cannot keep up with memory on one core
// (and + cvt + fma per 16 weights runs at 1.5 cycles on Zen 4). At the end of each group the
// int32 sums are converted and folded into f32 accumulators with one FMA by s_rg · e_g.
// Products of a group stay below 2^31 (1024 · 15 · 32767 < 2^29).
//
// Panels (int4_matrix.h) run one after the other, each over all tiles, so that the panel's x
// (8 KiB as int16) stays in L1 next to the weight stream; outputs add up over panels.
//
// GEMM (2..32 tokens): f32, because there the FMA per weight and token dominates. The same bytes
// are read as u32 lanes: nibble p (bits [4p, 4p+4)) of u32 lane i is column 32 (p % 4) + 2 i +
// p / 4 of the block. Masking bits [4p, 4p+4) and converting gives q · 2^(4p) exactly; x is copied
// once per call in that column order and pre-multiplied by 2^(-4p) (exact), the top nibble is
// taken by one shift. Each unpacked vector is multiplied by its group scale once and serves up to
// 4 tokens; each load of x serves 4 rows (2 on AVX2). Token chunks of 4 reuse the tile from L1,
// so the weights are read from memory once per call.
//
// All accumulation is f32 (int32 within a GEMV group); the matrix's param_multiplier is applied
// to each output.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/quant/int4_matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must follow foreach_target.h.
#include "hwy/highway.h"

#ifndef ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE
#define ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/quant/int4_matmul.h"
#include "core/quant/int4_matrix.h"
#include "core/tensor/half_float.h"
#include "hwy/aligned_allocator.h"

namespace estuary::int4_kernel {

constexpr int64_t kTileRows = Int4Matrix::kTileRows;
constexpr int64_t kBlockCols = Int4Matrix::kBlockCols;
constexpr int64_t kSliceCols = Int4Matrix::kSliceCols;  // 32: one u16 nibble position
constexpr int kGemmTokens = 4;  // tokens per GEMM chunk (accumulator registers)

// Per-call inputs shared, read-only, by every tile.
struct Prepared {
  int64_t n_tokens = 0;
  int64_t padded_cols = 0;    // n_blocks * 128
  int64_t padded_groups = 0;  // round_up(n_groups, 16) + 16: room for every panel's padding
  // GEMV (n_tokens == 1): x as int16 per group, and the per-group step e_g.
  const int16_t* x16 = nullptr;  // [padded_cols]
  const float* xstep = nullptr;  // [padded_groups]
  // GEMM: x in the u32-nibble column order, scaled by 2^(-4p). [n_tokens][padded_cols]
  const float* xs = nullptr;
  // Both: Σ of x over each group. [n_tokens][padded_groups]
  const float* xsum = nullptr;
};

// Thread-local growable scratch, one per `slot`, 64-byte aligned.
inline void* Scratch(int slot, size_t bytes) {
  thread_local hwy::AlignedFreeUniquePtr<uint8_t[]> buffers[2];
  thread_local size_t capacity[2] = {0, 0};
  if (bytes > capacity[slot]) {
    buffers[slot] = hwy::AllocateAligned<uint8_t>(bytes);
    capacity[slot] = bytes;
  }
  return buffers[slot].get();
}

inline int Log2(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

}  // namespace estuary::int4_kernel
#endif  // ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE

HWY_BEFORE_NAMESPACE();
namespace estuary::int4_kernel {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// GEMV tags: a slice is 32 u16 lanes (one vector on AVX-512, two on AVX2).
using D16 = hn::CappedTag<int16_t, 32>;
using DU16 = hn::RebindToUnsigned<D16>;
using D32 = hn::RepartitionToWide<D16>;
using DF = hn::Rebind<float, D32>;
using DU32 = hn::RebindToUnsigned<DF>;
using V16 = hn::Vec<D16>;
using VU16 = hn::Vec<DU16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;
using VU32 = hn::Vec<DU32>;
constexpr size_t kN16 = hn::MaxLanes(D16());
constexpr size_t kNF = hn::MaxLanes(DF());
constexpr size_t kVecs16 = kSliceCols / kN16;  // u16 vectors per 32-column slice
constexpr size_t kVecsF = 16 / kNF;            // f32 vectors per 16-lane u32 slice (GEMM)

// ---- Per-call preparation ------------------------------------------------------------------

// Σ over [begin, end) and max |x| (vector part and scalar tail).
HWY_INLINE void SumAndMaxAbs(const float* HWY_RESTRICT x, int64_t begin, int64_t end,
                             float* sum, float* max_abs) {
  const DF df;
  VF s = hn::Zero(df), m = hn::Zero(df);
  int64_t i = begin;
  for (; i + static_cast<int64_t>(kNF) <= end; i += kNF) {
    const VF v = hn::LoadU(df, x + i);
    s = hn::Add(s, v);
    m = hn::Max(m, hn::Abs(v));
  }
  float ss = hn::GetLane(hn::SumOfLanes(df, s));
  float mm = hn::GetLane(hn::MaxOfLanes(df, m));
  for (; i < end; ++i) {
    ss += x[i];
    mm = std::max(mm, std::fabs(x[i]));
  }
  *sum = ss;
  *max_abs = mm;
}

void PrepareGemvImpl(const float* HWY_RESTRICT x, int64_t cols, int64_t group,
                     int64_t padded_cols, int64_t padded_groups, int16_t* HWY_RESTRICT x16,
                     float* HWY_RESTRICT xstep, float* HWY_RESTRICT xsum) {
  const DF df;
  const hn::Rebind<int16_t, DF> d16h;  // half-width int16 for DemoteTo
  for (int64_t g = 0; g < padded_groups; ++g) {
    const int64_t begin = g * group;
    const int64_t end = std::min(cols, begin + group);
    if (begin >= cols) {
      xstep[g] = 0.0f;
      xsum[g] = 0.0f;
      continue;
    }
    float sum, max_abs;
    SumAndMaxAbs(x, begin, end, &sum, &max_abs);
    xsum[g] = sum;
    xstep[g] = max_abs / 32767.0f;
    const float inv = max_abs > 0.0f ? 32767.0f / max_abs : 0.0f;
    const VF vinv = hn::Set(df, inv);
    int64_t i = begin;
    for (; i + static_cast<int64_t>(kNF) <= end; i += kNF) {
      const auto q = hn::NearestInt(hn::Mul(hn::LoadU(df, x + i), vinv));
      hn::StoreU(hn::DemoteTo(d16h, q), d16h, x16 + i);
    }
    for (; i < end; ++i) {
      const float v = std::min(32767.0f, std::max(-32767.0f, std::nearbyint(x[i] * inv)));
      x16[i] = static_cast<int16_t>(v);
    }
  }
  for (int64_t i = cols; i < padded_cols; ++i) x16[i] = 0;
}

// ---- GEMV ----------------------------------------------------------------------------------
// kR rows side by side: 4 on AVX-512, 2 where a slice takes two vectors (AVX2), so that the
// nibbles and accumulators stay in registers. Every load of x serves the kR rows.
constexpr int kGemvRows = kVecs16 == 1 ? 4 : 2;

// Codes of nibble k of each u16 lane, as int16.
template <int k>
HWY_INLINE V16 Unpack16(VU16 w) {
  const D16 d16;
  const DU16 du16;
  const auto mask = hn::Set(du16, uint16_t{0xF});
  if constexpr (k == 0) return hn::BitCast(d16, hn::And(w, mask));
  if constexpr (k == 3) return hn::BitCast(d16, hn::ShiftRight<12>(w));
  return hn::BitCast(d16, hn::And(hn::ShiftRight<4 * k>(w), mask));
}

struct GemvState {
  const int16_t* x16;     // this block's int16 x
  const float* scales;    // combined scales s_rg · e_g, [row][padded_groups]
  int64_t stride;         // padded_groups
  int64_t group;          // group index of this block's first slice (kS < 4), or the group
  bool flush;             // kS == 4: the group ends with this block
};

// Slice k of one block for kR rows, then the group end if there is one.
template <int kR, int kS, int k>
HWY_INLINE void GemvSlice(const VU16 (&w)[kR][kVecs16], const GemvState& st, V32 (&isum0)[kR],
                          V32 (&isum1)[kR], VF (&acc)[kR]) {
  const D16 d16;
  const D32 d32;
  const DF df;
  HWY_UNROLL(2)
  for (size_t v = 0; v < kVecs16; ++v) {
    const V16 xv = hn::Load(d16, st.x16 + k * kSliceCols + v * kN16);
    HWY_UNROLL(4)
    for (int r = 0; r < kR; ++r) {
      isum0[r] = hn::ReorderWidenMulAccumulate(d32, Unpack16<k>(w[r][v]), xv, isum0[r], isum1[r]);
    }
  }
  if constexpr ((k + 1) % kS == 0) {
    if (kS < 4 || st.flush) {
      const int64_t g = kS < 4 ? st.group + k / kS : st.group;
      HWY_UNROLL(4)
      for (int r = 0; r < kR; ++r) {
        const VF sum = hn::ConvertTo(df, hn::Add(isum0[r], isum1[r]));
        acc[r] = hn::MulAdd(sum, hn::Set(df, st.scales[r * st.stride + g]), acc[r]);
        isum0[r] = hn::Zero(d32);
        isum1[r] = hn::Zero(d32);
      }
    }
  }
}

template <int kR, int kS, size_t... K>
HWY_INLINE void GemvBlock(std::index_sequence<K...>, const uint16_t* HWY_RESTRICT words,
                          const GemvState& st, V32 (&isum0)[kR], V32 (&isum1)[kR],
                          VF (&acc)[kR]) {
  const DU16 du16;
  VU16 w[kR][kVecs16];
  HWY_UNROLL(4)
  for (int r = 0; r < kR; ++r) {
    HWY_UNROLL(2)
    for (size_t v = 0; v < kVecs16; ++v) {
      w[r][v] = hn::Load(du16, words + r * kSliceCols + v * kN16);
    }
  }
  (GemvSlice<kR, kS, static_cast<int>(K)>(w, st, isum0, isum1, acc), ...);
}

// kR rows starting at `words` (row 0's words of block 0), one token. kS = slices per group
// (1 for g32, 2 for g64, 4 for groups of >= 128 columns, which span blocks_per_group blocks).
// dots[r] = Σ_g s_rg e_g Σ q x16 + Σ_g m_rg X_g (without the matrix multiplier).
// x16 and xsum start at the panel's first column and group; `stride` is the row stride of
// scales and offsets (a multiple of 16, with zeros past the panel's groups).
template <int kR, int kS>
HWY_NOINLINE void GemvRows(const uint16_t* HWY_RESTRICT words, const float* HWY_RESTRICT scales,
                           const float* HWY_RESTRICT offsets, int64_t stride,
                           const int16_t* HWY_RESTRICT x16, const float* HWY_RESTRICT xsum,
                           int64_t n_blocks, int64_t blocks_per_group, float* dots) {
  const D32 d32;
  const DF df;
  const std::make_index_sequence<4> slices;
  V32 isum0[kR], isum1[kR];
  VF acc[kR];
  for (int r = 0; r < kR; ++r) {
    isum0[r] = hn::Zero(d32);
    isum1[r] = hn::Zero(d32);
    acc[r] = hn::Zero(df);
  }
  GemvState st{x16, scales, stride, 0, true};
  for (int64_t b = 0; b < n_blocks; ++b) {
    st.x16 = x16 + b * kBlockCols;
    if constexpr (kS < 4) {
      st.group = b * (4 / kS);
    } else {
      st.group = b / blocks_per_group;
      st.flush = (b + 1) % blocks_per_group == 0 || b + 1 == n_blocks;
    }
    GemvBlock<kR, kS>(slices, words + b * kTileRows * kSliceCols, st, isum0, isum1, acc);
  }
  for (int r = 0; r < kR; ++r) {
    VF total = acc[r];
    const float* off = offsets + r * stride;
    for (int64_t g = 0; g < stride; g += kNF) {
      total = hn::MulAdd(hn::Load(df, off + g), hn::LoadU(df, xsum + g), total);
    }
    dots[r] = hn::GetLane(hn::SumOfLanes(df, total));
  }
}

// ---- GEMM ----------------------------------------------------------------------------------
constexpr int kGemmRows = kVecsF == 1 ? 4 : 2;

// Nibble p of each u32 lane as f32: q · 2^(4p) (p < 7) or q (p == 7).
template <int p>
HWY_INLINE VF Unpack32(VU32 w) {
  const DF df;
  const DU32 du;
  const hn::RebindToSigned<DU32> di;
  if constexpr (p == 7) {
    return hn::ConvertTo(df, hn::BitCast(di, hn::ShiftRight<28>(w)));
  } else {
    return hn::ConvertTo(df, hn::BitCast(di, hn::And(w, hn::Set(du, 0xFu << (4 * p)))));
  }
}

struct GemmState {
  const float* xs;      // this block's x (GEMM order) of token 0
  int64_t x_stride;     // padded_cols: token stride
  const float* scales;  // s_rg, [row][padded_groups]
  int64_t stride;       // padded_groups
  int64_t col0;         // first column of the block
  int group_shift;      // log2(group size)
};

template <int kR, int kT, int p>
HWY_INLINE void GemmSlice(const VU32 (&w)[kR][kVecsF], const GemmState& st,
                          VF (&acc)[kR][kT]) {
  const DF df;
  const int64_t g = (st.col0 + (p % 4) * kSliceCols) >> st.group_shift;
  HWY_UNROLL(2)
  for (size_t v = 0; v < kVecsF; ++v) {
    VF d[kR];
    HWY_UNROLL(4)
    for (int r = 0; r < kR; ++r) {
      d[r] = hn::Mul(Unpack32<p>(w[r][v]), hn::Set(df, st.scales[r * st.stride + g]));
    }
    const float* xk = st.xs + p * 16 + v * kNF;
    // One load of x per token, shared by the kR rows.
    HWY_UNROLL(4)
    for (int t = 0; t < kT; ++t) {
      const VF xv = hn::Load(df, xk + t * st.x_stride);
      HWY_UNROLL(4)
      for (int r = 0; r < kR; ++r) acc[r][t] = hn::MulAdd(d[r], xv, acc[r][t]);
    }
  }
}

template <int kR, int kT, size_t... P>
HWY_INLINE void GemmBlock(std::index_sequence<P...>, const uint32_t* HWY_RESTRICT words,
                          const GemmState& st, VF (&acc)[kR][kT]) {
  const DU32 du;
  VU32 w[kR][kVecsF];
  HWY_UNROLL(4)
  for (int r = 0; r < kR; ++r) {
    HWY_UNROLL(2)
    for (size_t v = 0; v < kVecsF; ++v) w[r][v] = hn::Load(du, words + r * 16 + v * kNF);
  }
  (GemmSlice<kR, kT, static_cast<int>(P)>(w, st, acc), ...);
}

// kR rows × kT tokens: dots[r * kGemmTokens + t] = Σ_g s_rg Σ q x (without offsets/multiplier).
template <int kR, int kT>
HWY_NOINLINE void GemmRows(const uint32_t* HWY_RESTRICT words, const float* HWY_RESTRICT scales,
                           int64_t stride, const float* HWY_RESTRICT xs, int64_t x_stride,
                           int64_t n_blocks, int group_shift, float* dots) {
  const DF df;
  const std::make_index_sequence<8> slices;
  VF acc[kR][kT];
  for (int r = 0; r < kR; ++r) {
    for (int t = 0; t < kT; ++t) acc[r][t] = hn::Zero(df);
  }
  GemmState st{xs, x_stride, scales, stride, 0, group_shift};
  for (int64_t b = 0; b < n_blocks; ++b) {
    st.xs = xs + b * kBlockCols;
    st.col0 = b * kBlockCols;
    GemmBlock<kR, kT>(slices, words + b * kTileRows * 16, st, acc);
  }
  for (int r = 0; r < kR; ++r) {
    for (int t = 0; t < kT; ++t) {
      dots[r * kGemmTokens + t] = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
    }
  }
}

using GemmRowsFn = void (*)(const uint32_t*, const float*, int64_t, const float*, int64_t,
                            int64_t, int, float*);
constexpr GemmRowsFn kGemmRowsFns[kGemmTokens + 1] = {
    nullptr, &GemmRows<kGemmRows, 1>, &GemmRows<kGemmRows, 2>, &GemmRows<kGemmRows, 3>,
    &GemmRows<kGemmRows, 4>};

// ---- Tiles ---------------------------------------------------------------------------------

// f16 parameters of one chunk (n_groups per row) to f32 [8][stride] (scales of rows 0..3, then
// offsets), zero beyond n_groups. With `xstep` (GEMV), the scales are multiplied by e_g.
// Reads up to 15 f16 past the last row: still inside the chunk (its nibbles follow).
void LoadChunkParams(const uint16_t* HWY_RESTRICT src, int64_t n_groups, int64_t stride,
                     const float* HWY_RESTRICT xstep, float* HWY_RESTRICT out) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  for (int64_t row = 0; row < 2 * kTileRows; ++row) {
    const auto* in = reinterpret_cast<const hwy::float16_t*>(src + row * n_groups);
    float* dst = out + row * stride;
    const bool scale_row = xstep != nullptr && row < kTileRows;
    for (int64_t g = 0; g < stride; g += kNF) {
      VF v = hn::Zero(df);
      if (g < n_groups) {
        v = hn::PromoteTo(df, hn::LoadU(dh, in + g));
        if (g + static_cast<int64_t>(kNF) > n_groups) {
          v = hn::IfThenElseZero(hn::FirstN(df, static_cast<size_t>(n_groups - g)), v);
        }
        if (scale_row) v = hn::Mul(v, hn::LoadU(df, xstep + g));
      }
      hn::Store(v, df, dst + g);
    }
  }
}

// Output of row `row`, token `t`: the first panel stores, later panels add.
HWY_INLINE void Emit(float* y, int64_t index, float value, bool first) {
  y[index] = first ? value : y[index] + value;
}

// Tiles [tile_begin, tile_end) of one panel of y = W x, all tokens.
void PanelTiles(const Int4Matrix& w, int pi, const Prepared& p, int64_t tile_begin,
                int64_t tile_end, float* y) {
  const Int4Matrix::Panel& pn = w.panel(pi);
  const bool first = pi == 0;
  const int64_t rows = w.rows();
  const int64_t group = w.group_size();
  const int64_t pg = (pn.n_groups + 15) / 16 * 16;
  const float mult = w.param_multiplier();
  float* params = static_cast<float*>(Scratch(0, static_cast<size_t>(2 * kTileRows * pg) * 4));
  const float* offsets = params + kTileRows * pg;
  float dots[kTileRows * kGemmTokens];
  const bool gemv = p.n_tokens == 1;
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    LoadChunkParams(w.chunk_params(pi, tile), pn.n_groups, pg,
                    gemv ? p.xstep + pn.group0 : nullptr, params);
    const uint16_t* nibbles = w.chunk_nibbles(pi, tile);
    const int64_t row0 = tile * kTileRows;
    const int64_t live = std::min<int64_t>(kTileRows, rows - row0);
    if (gemv) {
      const int16_t* x16 = p.x16 + pn.col0;
      const float* xsum = p.xsum + pn.group0;
      for (int64_t r0 = 0; r0 < kTileRows; r0 += kGemvRows) {
        const uint16_t* words = nibbles + r0 * kSliceCols;
        const float* sc = params + r0 * pg;
        const float* off = offsets + r0 * pg;
        switch (group) {
          case 32:
            GemvRows<kGemvRows, 1>(words, sc, off, pg, x16, xsum, pn.n_blocks, 1, dots + r0);
            break;
          case 64:
            GemvRows<kGemvRows, 2>(words, sc, off, pg, x16, xsum, pn.n_blocks, 1, dots + r0);
            break;
          default:
            GemvRows<kGemvRows, 4>(words, sc, off, pg, x16, xsum, pn.n_blocks,
                                   group / kBlockCols, dots + r0);
            break;
        }
      }
      for (int64_t r = 0; r < live; ++r) Emit(y, row0 + r, mult * dots[r], first);
      continue;
    }
    const int shift = Log2(group);
    const uint32_t* words = reinterpret_cast<const uint32_t*>(nibbles);
    for (int64_t t0 = 0; t0 < p.n_tokens; t0 += kGemmTokens) {
      const int chunk = static_cast<int>(std::min<int64_t>(kGemmTokens, p.n_tokens - t0));
      for (int64_t r0 = 0; r0 < live; r0 += kGemmRows) {
        kGemmRowsFns[chunk](words + r0 * 16, params + r0 * pg, pg,
                            p.xs + t0 * p.padded_cols + pn.col0, p.padded_cols, pn.n_blocks,
                            shift, dots);
        for (int64_t r = r0; r < std::min<int64_t>(live, r0 + kGemmRows); ++r) {
          const float* off = offsets + r * pg;
          for (int t = 0; t < chunk; ++t) {
            const float* xsum = p.xsum + (t0 + t) * p.padded_groups + pn.group0;
            VF o = hn::Zero(DF());
            for (int64_t g = 0; g < pg; g += kNF) {
              o = hn::MulAdd(hn::Load(DF(), off + g), hn::LoadU(DF(), xsum + g), o);
            }
            const float dot = dots[(r - r0) * kGemmTokens + t] + hn::GetLane(hn::SumOfLanes(DF(), o));
            Emit(y, (t0 + t) * rows + row0 + r, mult * dot, first);
          }
        }
      }
    }
  }
}

// Tiles [tile_begin, tile_end) of y = W x, panel by panel.
void TilesImpl(const Int4Matrix& w, const Prepared& p, int64_t tile_begin, int64_t tile_end,
               float* y) {
  for (int pi = 0; pi < w.n_panels(); ++pi) PanelTiles(w, pi, p, tile_begin, tile_end, y);
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::int4_kernel
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace estuary {
namespace int4_kernel {

HWY_EXPORT(TilesImpl);
HWY_EXPORT(PrepareGemvImpl);
HWY_EXPORT(TargetNameImpl);

namespace {

// Inputs of one call in the caller's thread-local scratch (slot 1).
Prepared Prepare(const Int4Matrix& w, const float* x, int64_t n_tokens) {
  Prepared p;
  const int64_t cols = w.cols();
  const int64_t group = w.group_size();
  p.n_tokens = n_tokens;
  p.padded_cols = w.n_blocks() * kBlockCols;
  p.padded_groups = (w.n_groups() + 15) / 16 * 16 + 16;
  if (n_tokens == 1) {
    // [xsum][xstep][x16]
    auto* base = static_cast<uint8_t*>(
        Scratch(1, static_cast<size_t>(8 * p.padded_groups + 2 * p.padded_cols)));
    float* xsum = reinterpret_cast<float*>(base);
    float* xstep = xsum + p.padded_groups;
    auto* x16 = reinterpret_cast<int16_t*>(xstep + p.padded_groups);
    HWY_DYNAMIC_DISPATCH(PrepareGemvImpl)(x, cols, group, p.padded_cols, p.padded_groups, x16,
                                          xstep, xsum);
    p.xsum = xsum;
    p.xstep = xstep;
    p.x16 = x16;
    return p;
  }
  // [xsum: n_tokens][xs: n_tokens]
  float* xsum = static_cast<float*>(
      Scratch(1, static_cast<size_t>(n_tokens * (p.padded_groups + p.padded_cols)) * 4));
  float* xs = xsum + n_tokens * p.padded_groups;
  static constexpr float kScale[8] = {1.0f,     0x1p-4f,  0x1p-8f,  0x1p-12f,
                                      0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * cols;
    float* st = xs + t * p.padded_cols;
    for (int64_t b = 0; b * kBlockCols < p.padded_cols; ++b) {
      for (int pos = 0; pos < 8; ++pos) {
        for (int i = 0; i < 16; ++i) {
          const int64_t c = b * kBlockCols + kSliceCols * (pos % 4) + 2 * i + pos / 4;
          st[b * kBlockCols + pos * 16 + i] = c < cols ? xt[c] * kScale[pos] : 0.0f;
        }
      }
    }
    float* sums = xsum + t * p.padded_groups;
    for (int64_t g = 0; g < p.padded_groups; ++g) {
      float sum = 0.0f;
      for (int64_t c = g * group; c < std::min(cols, (g + 1) * group); ++c) sum += xt[c];
      sums[g] = sum;
    }
  }
  p.xs = xs;
  p.xsum = xsum;
  return p;
}

// Process-wide pool: workers wait for a job and run their share of its tiles. Jobs are
// serialized by `run_mutex_`; the caller takes part as worker 0.
class TilePool {
 public:
  static TilePool& Get() {
    static TilePool* pool = new TilePool();  // never destroyed: workers may outlive main()
    return *pool;
  }

  // Runs fn(begin, end) over [0, n) split into `threads` contiguous parts.
  void Run(int threads, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    Grow(threads - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn;
      job_n_ = n;
      job_parts_ = threads;
      pending_ = threads - 1;
      ++generation_;
    }
    wake_.notify_all();
    RunPart(0, fn, n, threads);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  static void RunPart(int part, const std::function<void(int64_t, int64_t)>& fn, int64_t n,
                      int parts) {
    const int64_t begin = n * part / parts;
    const int64_t end = n * (part + 1) / parts;
    if (begin < end) fn(begin, end);
  }

  void Grow(int workers) {
    while (static_cast<int>(workers_.size()) < workers) {
      const int part = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, part] { WorkerLoop(part); });
    }
  }

  void WorkerLoop(int part) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)>* job;
      int64_t n;
      int parts;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (part >= job_parts_) continue;  // not needed for this job
        job = job_;
        n = job_n_;
        parts = job_parts_;
      }
      RunPart(part, *job, n, parts);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace
}  // namespace int4_kernel

void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y) {
  Int4MatMul(w, x, n_tokens, y, 1);
}

void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, int threads) {
  if (w.empty() || n_tokens <= 0) return;
  const int4_kernel::Prepared p = int4_kernel::Prepare(w, x, n_tokens);
  const int64_t tiles = w.n_tiles();
  const int parts = static_cast<int>(std::clamp<int64_t>(threads, 1, tiles));
  if (parts == 1) {
    HWY_DYNAMIC_DISPATCH(int4_kernel::TilesImpl)(w, p, 0, tiles, y);
    return;
  }
  int4_kernel::TilePool::Get().Run(parts, tiles, [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(int4_kernel::TilesImpl)(w, p, begin, end, y);
  });
}

const char* Int4MatMulTargetName() {
  return HWY_DYNAMIC_DISPATCH(int4_kernel::TargetNameImpl)();
}

}  // namespace estuary
#endif  // HWY_ONCE
