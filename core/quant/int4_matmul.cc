// Int4MatMul: int4 weights (Int4Matrix layout, see int4_matrix.h) × f32 activations, Highway
// runtime dispatch.
//
// Arithmetic. Per row r, group g and token t:
//   y_rt = Σ_g s_rg Σ_{i∈g} q_ri x_ti + Σ_g m_rg X_tg,   X_tg = Σ_{i∈g} x_ti.
// x is converted once per call to int16 per (token, group): x_ti ≈ x16_ti · e_tg with
// e_tg = max_{i∈g} |x_ti| / 32767 (error <= e_tg / 2: a 16-bit activation, as in W4A16). Then
// Σ q x16 over a group is an exact int32 (1024 · 15 · 32767 < 2^31): u16 lanes hold 4 nibbles,
// one shift and/or one AND give 32 codes, and one multiply-add of int16 pairs (vpmaddwd) plus one
// add accumulate them. At the end of a group the int32 sums are converted and folded into f32
// accumulators with one FMA by s_rg · e_tg; the offsets add Σ_g m_rg X_tg at the end, and the
// matrix's param_multiplier scales each output. Widening the codes to f32 instead (and + cvt +
// fma per 16 weights) costs about twice as many vector slots and cannot keep up with memory on
// one Zen 4 core; f32 FMAs per token would likewise bound a batched kernel at the same speed.
//
// One kernel for every token count: kR rows × kT tokens of accumulators; each unpacked vector
// of codes serves kT tokens and each load of x serves kR rows. A token's result is computed by
// the same integer sums and the same f32 operations in the same order whatever n_tokens and the
// chunking are, so outputs are bitwise independent of the batch (int4_matmul_test checks it).
//
// Memory order: column panels (int4_matrix.h) one after the other, each over all its row tiles
// front to back; within a tile, block by block, the kR rows of a block side by side. A panel's
// x (8 KiB of int16 per token) stays in L1 next to the weight stream. Token chunks of up to kT
// re-read the tile's chunk from L1, so the weights are read from memory once per call.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/quant/int4_matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must follow foreach_target.h.
#include "hwy/highway.h"

#ifndef ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE
#define ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/common/worker_pool.h"
#include "core/quant/int4_matmul.h"
#include "core/quant/int4_kernel_common.h"
#include "core/quant/int4_matmul_avx2.h"
#include "core/quant/int4_matmul_vnni.h"
#include "core/quant/int4_matrix.h"
#include "hwy/aligned_allocator.h"

namespace estuary::int4_kernel {

using int4_kernel_common::kBlockCols;
using int4_kernel_common::kMaxChunkTokens;
using int4_kernel_common::kParamStride;
using int4_kernel_common::kTileRows;
using int4_kernel_common::Scratch;
constexpr int64_t kSliceCols = Int4Matrix::kSliceCols;  // 32: one u16 nibble position

// Per-call inputs shared, read-only, by every tile: per token, x as int16 per group, the
// per-group step e_tg and the per-group sums X_tg.
struct Prepared {
  int64_t n_tokens = 0;
  int64_t padded_cols = 0;    // n_blocks * 128
  int64_t padded_groups = 0;  // round_up(n_groups, 16) + 16: token stride of xstep, xsum;
                              // room for every panel's zero padding
  const int16_t* x16 = nullptr;  // [n_blocks][n_tokens][128]: a block's tokens side by side
  const float* xstep = nullptr;  // [n_tokens][padded_groups]
  const float* xsum = nullptr;   // [n_tokens][padded_groups]
};

}  // namespace estuary::int4_kernel
#endif  // ESTUARY_CORE_QUANT_INT4_MATMUL_ONCE

HWY_BEFORE_NAMESPACE();
namespace estuary::int4_kernel {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A slice is 32 u16 lanes: one vector on AVX-512, two on AVX2, four on SSE4.
using D16 = hn::CappedTag<int16_t, 32>;
using DU16 = hn::RebindToUnsigned<D16>;
using D32 = hn::RepartitionToWide<D16>;
using DF = hn::Rebind<float, D32>;
using V16 = hn::Vec<D16>;
using VU16 = hn::Vec<DU16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;
constexpr size_t kN16 = hn::MaxLanes(D16());
constexpr size_t kNF = hn::MaxLanes(DF());
constexpr size_t kVecs = kSliceCols / kN16;  // u16 vectors per slice

// Rows × tokens per kernel call. With 32 registers (AVX-512): 4 rows for one token, 2 rows × up
// to 4 tokens; with 16 (AVX2 and below): 2 rows for one token, 1 row × up to 4 tokens. Each
// (row, token) holds an int32 and an f32 accumulator.
constexpr int kGemvRows = kVecs == 1 ? 4 : 2;
constexpr int kGemmRows = kVecs == 1 ? 2 : 1;

// ---- Per-call preparation ------------------------------------------------------------------

// Σ over [begin, end) and max |x|.
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

// One token: x16 (zero past cols; column c at x16[(c / 128) * block_stride + c % 128]), xstep
// and xsum (zero past the last group).
void PrepareTokenImpl(const float* HWY_RESTRICT x, int64_t cols, int64_t group,
                      int64_t padded_cols, int64_t padded_groups, int16_t* HWY_RESTRICT x16,
                      int64_t block_stride, float* HWY_RESTRICT xstep,
                      float* HWY_RESTRICT xsum) {
  const auto at = [&](int64_t c) { return (c / kBlockCols) * block_stride + c % kBlockCols; };
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
      hn::StoreU(hn::DemoteTo(d16h, q), d16h, x16 + at(i));  // never crosses a block
    }
    for (; i < end; ++i) {
      const float v = std::min(32767.0f, std::max(-32767.0f, std::nearbyint(x[i] * inv)));
      x16[at(i)] = static_cast<int16_t>(v);
    }
  }
  for (int64_t i = cols; i < padded_cols; ++i) x16[at(i)] = 0;
}

// ---- Kernel --------------------------------------------------------------------------------

// Codes of nibble k of each u16 lane, as int16.
template <int k>
HWY_INLINE V16 Unpack(VU16 w) {
  const D16 d16;
  const DU16 du16;
  const auto mask = hn::Set(du16, uint16_t{0xF});
  if constexpr (k == 0) return hn::BitCast(d16, hn::And(w, mask));
  if constexpr (k == 3) return hn::BitCast(d16, hn::ShiftRight<12>(w));
  return hn::BitCast(d16, hn::And(hn::ShiftRight<4 * k>(w), mask));
}

// What a kernel call reads besides the nibbles (pointers at the panel's first column/group).
struct KernelArgs {
  const float* scales;   // s_rg · e_tg at scales[(t * kTileRows + r) * kParamStride + g]
  const float* offsets;  // m_rg at offsets[r * kParamStride + g]
  int64_t n_groups16;    // groups of the panel rounded up to 16 (zeros past the last)
  const int16_t* x16;    // block b, token t at x16 + b * x16_block_stride + t * 128
  int64_t x16_block_stride;
  const float* xsum;     // token t at xsum + t * x_stride
  int64_t x_stride;
  int64_t n_blocks;
  int64_t blocks_per_group;  // kS == 4 only
};

// Per block: which group a slice belongs to and whether it ends there.
struct BlockState {
  const int16_t* x16;  // this block's x of token 0
  int64_t group;       // kS < 4: group of slice 0 (slice k: group + k / kS); kS == 4: the group
  bool flush;          // kS == 4: the group ends with this block
};

// Slice k of one block for kR rows × kT tokens, then the group end if there is one.
template <int kR, int kT, int kS, int k>
HWY_INLINE void Slice(const VU16 (&w)[kR][kVecs], const KernelArgs& a, const BlockState& b,
                      V32 (&isum0)[kR * kT], V32 (&isum1)[kR * kT], VF (&acc)[kR * kT]) {
  const D16 d16;
  const D32 d32;
  const DF df;
  HWY_UNROLL(16)
  for (size_t v = 0; v < kVecs; ++v) {
    V16 q[kR];
    HWY_UNROLL(16)
    for (int r = 0; r < kR; ++r) q[r] = Unpack<k>(w[r][v]);
    HWY_UNROLL(16)
    for (int t = 0; t < kT; ++t) {
      const V16 xv = hn::Load(d16, b.x16 + t * kBlockCols + k * kSliceCols + v * kN16);
      HWY_UNROLL(16)
      for (int r = 0; r < kR; ++r) {
        const int i = r * kT + t;
        isum0[i] = hn::ReorderWidenMulAccumulate(d32, q[r], xv, isum0[i], isum1[i]);
      }
    }
  }
  if constexpr ((k + 1) % kS == 0) {
    if (kS < 4 || b.flush) {
      const int64_t g = kS < 4 ? b.group + k / kS : b.group;
      HWY_UNROLL(16)
      for (int r = 0; r < kR; ++r) {
        HWY_UNROLL(16)
        for (int t = 0; t < kT; ++t) {
          const int i = r * kT + t;
          const VF sum = hn::ConvertTo(df, hn::Add(isum0[i], isum1[i]));
          const float scale = a.scales[(t * kTileRows + r) * kParamStride + g];
          acc[i] = hn::MulAdd(sum, hn::Set(df, scale), acc[i]);
          isum0[i] = hn::Zero(d32);
          isum1[i] = hn::Zero(d32);
        }
      }
    }
  }
}

template <int kR, int kT, int kS, size_t... K>
HWY_INLINE void Block(std::index_sequence<K...>, const uint16_t* HWY_RESTRICT words,
                      const KernelArgs& a, const BlockState& b, V32 (&isum0)[kR * kT],
                      V32 (&isum1)[kR * kT], VF (&acc)[kR * kT]) {
  const DU16 du16;
  VU16 w[kR][kVecs];
  HWY_UNROLL(16)
  for (int r = 0; r < kR; ++r) {
    HWY_UNROLL(16)
    for (size_t v = 0; v < kVecs; ++v) w[r][v] = hn::Load(du16, words + r * kSliceCols + v * kN16);
  }
  (Slice<kR, kT, kS, static_cast<int>(K)>(w, a, b, isum0, isum1, acc), ...);
}

// kR rows (from `words`: row 0's words of block 0 of the chunk) × kT tokens over one panel.
// kS = slices per group (1 for g32, 2 for g64, 4 for groups of >= 128 columns, which span
// blocks_per_group blocks). dots[r * kT + t] = the panel's part of y_rt before the multiplier.
template <int kR, int kT, int kS>
HWY_NOINLINE void Rows(const uint16_t* HWY_RESTRICT words, const KernelArgs& a, float* dots) {
  const D32 d32;
  const DF df;
  const std::make_index_sequence<4> slices;
  V32 isum0[kR * kT], isum1[kR * kT];
  VF acc[kR * kT];
  HWY_UNROLL(16)
  for (int i = 0; i < kR * kT; ++i) {
    isum0[i] = hn::Zero(d32);
    isum1[i] = hn::Zero(d32);
    acc[i] = hn::Zero(df);
  }
  BlockState b{a.x16, 0, true};
  for (int64_t blk = 0; blk < a.n_blocks; ++blk) {
    b.x16 = a.x16 + blk * a.x16_block_stride;
    if constexpr (kS < 4) {
      b.group = blk * (4 / kS);
    } else {
      b.group = blk / a.blocks_per_group;
      b.flush = (blk + 1) % a.blocks_per_group == 0 || blk + 1 == a.n_blocks;
    }
    Block<kR, kT, kS>(slices, words + blk * kTileRows * kSliceCols, a, b, isum0, isum1, acc);
  }
  for (int r = 0; r < kR; ++r) {
    const float* off = a.offsets + r * kParamStride;
    for (int t = 0; t < kT; ++t) {
      VF total = acc[r * kT + t];
      const float* xsum = a.xsum + t * a.x_stride;
      for (int64_t g = 0; g < a.n_groups16; g += kNF) {
        total = hn::MulAdd(hn::Load(df, off + g), hn::LoadU(df, xsum + g), total);
      }
      dots[r * kT + t] = hn::GetLane(hn::SumOfLanes(df, total));
    }
  }
}

using RowsFn = void (*)(const uint16_t*, const KernelArgs&, float*);

// The kernel for kR rows, kT tokens and group size `group`.
template <int kR, int kT>
RowsFn PickRows(int64_t group) {
  switch (group) {
    case 32:
      return &Rows<kR, kT, 1>;
    case 64:
      return &Rows<kR, kT, 2>;
    default:
      return &Rows<kR, kT, 4>;
  }
}

// ---- Tiles ---------------------------------------------------------------------------------

// int4_kernel_common::LoadChunkParams (int4_kernel_common.h) for this target.
void LoadChunkParams(const uint16_t* HWY_RESTRICT src, int64_t n_groups, int64_t n_groups16,
                     float* HWY_RESTRICT out) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  for (int64_t row = 0; row < 2 * kTileRows; ++row) {
    const auto* in = reinterpret_cast<const hwy::float16_t*>(src + row * n_groups);
    float* dst = out + row * kParamStride;
    for (int64_t g = 0; g < n_groups16; g += kNF) {
      VF v = hn::Zero(df);
      if (g < n_groups) {
        v = hn::PromoteTo(df, hn::LoadU(dh, in + g));
        if (g + static_cast<int64_t>(kNF) > n_groups) {
          v = hn::IfThenElseZero(hn::FirstN(df, static_cast<size_t>(n_groups - g)), v);
        }
      }
      hn::Store(v, df, dst + g);
    }
  }
}

// out[t][r][g] = scales[r][g] · e_tg for the chunk's tokens (token t's steps at
// xstep + t * x_stride); rows of kParamStride.
void CombineScales(const float* HWY_RESTRICT scales, int64_t n_groups16, const float* xstep,
                   int64_t x_stride, int chunk, float* HWY_RESTRICT out) {
  const DF df;
  for (int t = 0; t < chunk; ++t) {
    for (int64_t r = 0; r < kTileRows; ++r) {
      const float* s = scales + r * kParamStride;
      float* o = out + (t * kTileRows + r) * kParamStride;
      for (int64_t g = 0; g < n_groups16; g += kNF) {
        hn::Store(hn::Mul(hn::Load(df, s + g), hn::LoadU(df, xstep + t * x_stride + g)), df,
                  o + g);
      }
    }
  }
}

// Tiles [tile_begin, tile_end) of one panel of y = W x, all tokens. The first panel stores the
// outputs, later panels add to them.
void PanelTiles(const Int4Matrix& w, int pi, const Prepared& p, int64_t tile_begin,
                int64_t tile_end, float* y) {
  const Int4Matrix::Panel& pn = w.panel(pi);
  const bool gemv = p.n_tokens == 1;
  const int64_t n_groups16 = (pn.n_groups + 15) / 16 * 16;
  // [8][kParamStride] parameters, then [kMaxChunkTokens][kTileRows][kParamStride] combined.
  float* params = static_cast<float*>(
      Scratch(0, static_cast<size_t>((2 + kMaxChunkTokens) * kTileRows * kParamStride) * 4));
  float* combined = params + 2 * kTileRows * kParamStride;
  const int row_step = gemv ? kGemvRows : kGemmRows;
  const int token_step = gemv ? 1 : kMaxChunkTokens;
  RowsFn fns[kMaxChunkTokens + 1] = {nullptr};
  if (gemv) {
    fns[1] = PickRows<kGemvRows, 1>(w.group_size());
  } else {
    fns[1] = PickRows<kGemmRows, 1>(w.group_size());
    fns[2] = PickRows<kGemmRows, 2>(w.group_size());
    fns[3] = PickRows<kGemmRows, 3>(w.group_size());
    fns[4] = PickRows<kGemmRows, 4>(w.group_size());
  }
  KernelArgs a;
  a.n_groups16 = n_groups16;
  a.x16_block_stride = p.n_tokens * kBlockCols;
  a.x_stride = p.padded_groups;
  a.n_blocks = pn.n_blocks;
  a.blocks_per_group = std::max<int64_t>(1, w.group_size() / kBlockCols);
  int4_kernel_common::RunPanelTiles(
      w, pi, p.n_tokens, tile_begin, tile_end, row_step, token_step, y,
      [&](int64_t tile) {
        LoadChunkParams(w.chunk_params(pi, tile), pn.n_groups, n_groups16, params);
      },
      [&](int64_t t0, int chunk) {
        CombineScales(params, n_groups16, p.xstep + t0 * p.padded_groups + pn.group0,
                      p.padded_groups, chunk, combined);
        a.x16 = p.x16 + (pn.col0 / kBlockCols) * a.x16_block_stride + t0 * kBlockCols;
        a.xsum = p.xsum + t0 * p.padded_groups + pn.group0;
      },
      [&](int64_t tile, int64_t r0, int chunk, float* dots) {
        a.scales = combined + r0 * kParamStride;
        a.offsets = params + (kTileRows + r0) * kParamStride;
        fns[chunk](w.chunk_nibbles(pi, tile) + r0 * kSliceCols, a, dots);
      });
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
HWY_EXPORT(PrepareTokenImpl);
HWY_EXPORT(TargetNameImpl);
HWY_EXPORT(CombineScales);
HWY_EXPORT(LoadChunkParams);

namespace {

// Inputs of one call in the caller's thread-local scratch (slot 1): [xsum][xstep][x16].
Prepared Prepare(const Int4Matrix& w, const float* x, int64_t n_tokens) {
  Prepared p;
  const int64_t cols = w.cols();
  p.n_tokens = n_tokens;
  p.padded_cols = w.n_blocks() * kBlockCols;
  p.padded_groups = (w.n_groups() + 15) / 16 * 16 + 16;
  auto* base = static_cast<uint8_t*>(
      Scratch(1, static_cast<size_t>(n_tokens * (8 * p.padded_groups + 2 * p.padded_cols))));
  float* xsum = reinterpret_cast<float*>(base);
  float* xstep = xsum + n_tokens * p.padded_groups;
  auto* x16 = reinterpret_cast<int16_t*>(xstep + n_tokens * p.padded_groups);
  for (int64_t t = 0; t < n_tokens; ++t) {
    HWY_DYNAMIC_DISPATCH(PrepareTokenImpl)(x + t * cols, cols, w.group_size(), p.padded_cols,
                                           p.padded_groups, x16 + t * kBlockCols,
                                           n_tokens * kBlockCols, xstep + t * p.padded_groups,
                                           xsum + t * p.padded_groups);
  }
  p.x16 = x16;
  p.xstep = xstep;
  p.xsum = xsum;
  return p;
}

std::atomic<Int4Path> g_path{Int4Path::kAuto};

// kAuto: VNNI, else AVX2 int8, else Highway. A path forced where the CPU lacks it runs Highway
// (the CLI refuses such a flag up front: cli/river_flags.cc).
bool UseVnni() {
  const Int4Path path = g_path.load(std::memory_order_relaxed);
  return (path == Int4Path::kAuto || path == Int4Path::kVnni) && int4_vnni::Available();
}

bool UseAvx2() {
  const Int4Path path = g_path.load(std::memory_order_relaxed);
  return (path == Int4Path::kAuto || path == Int4Path::kAvx2) && !UseVnni() &&
         int4_avx2::Available();
}

}  // namespace
}  // namespace int4_kernel

namespace int4_kernel_common {

void LoadChunkParams(const uint16_t* src, int64_t n_groups, int64_t n_groups16, float* out) {
  HWY_DYNAMIC_DISPATCH(int4_kernel::LoadChunkParams)(src, n_groups, n_groups16, out);
}

void CombineScales(const float* scales, int64_t n_groups16, const float* xstep, int64_t x_stride,
                   int chunk, float* out) {
  HWY_DYNAMIC_DISPATCH(int4_kernel::CombineScales)(scales, n_groups16, xstep, x_stride, chunk,
                                                   out);
}

}  // namespace int4_kernel_common

std::optional<Int4Path> Int4PathFromName(std::string_view name) {
  if (name == "auto") return Int4Path::kAuto;
  if (name == "highway") return Int4Path::kHighway;
  if (name == "vnni") return Int4Path::kVnni;
  if (name == "avx2") return Int4Path::kAvx2;
  return std::nullopt;
}

void SetInt4MatMulPath(Int4Path path) { int4_kernel::g_path.store(path); }
bool Int4VnniAvailable() { return int4_vnni::Available(); }
bool Int4Avx2Available() { return int4_avx2::Available(); }
bool Int4MatMulUsesInt8() { return int4_kernel::UseVnni() || int4_kernel::UseAvx2(); }

void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y) {
  Int4MatMul(w, x, n_tokens, y, WorkerPool::Serial());
}

void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y,
                WorkerPool& pool) {
  if (w.empty() || n_tokens <= 0) return;
  // A kGroupLanes matrix is read by an int8 path: the one chosen, or where the Highway path is
  // (it reads only kBlocks), VNNI if the CPU has it, else AVX2 (Quantize writes kGroupLanes only
  // where one of them runs).
  const bool lanes = w.layout() == Int4Layout::kGroupLanes;
  if (int4_kernel::UseVnni() ||
      (lanes && !int4_kernel::UseAvx2() && int4_vnni::Available())) {
    return int4_vnni::MatMul(w, x, n_tokens, y, pool);
  }
  if (lanes || int4_kernel::UseAvx2()) return int4_avx2::MatMul(w, x, n_tokens, y, pool);
  const int4_kernel::Prepared p = int4_kernel::Prepare(w, x, n_tokens);
  pool.ParallelFor(w.n_tiles(), [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(int4_kernel::TilesImpl)(w, p, begin, end, y);
  });
}

const char* Int4MatMulTargetName() {
  if (int4_kernel::UseVnni()) return "AVX512_VNNI";
  if (int4_kernel::UseAvx2()) return "AVX2_INT8";
  return HWY_DYNAMIC_DISPATCH(int4_kernel::TargetNameImpl)();
}

}  // namespace estuary
#endif  // HWY_ONCE
