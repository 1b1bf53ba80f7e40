// Multi-token GEMV y[t] = W x[t] over bf16, f16 and f32 weights, with Highway runtime dispatch.
//
// Layouts: w is [rows][cols] row-major, x is [n_tokens][cols], y is [n_tokens][rows].
//
// GemvBatchBf16 runs bf16_dot.cc's AVX512-BF16 kernel instead where the CPU has it (the switch
// is Bf16BatchPath in kernels.h); this file's bf16 kernel is then GemvBatchBf16Fma.
//
// A batched decode step multiplies each weight by a few token vectors. The token loop runs inside
// the row loop, so each weight element is read from memory once per pass of up to ChunkTokens()
// tokens (all of them at Llama-3.2-1B widths and the batch sizes MatMul sends here): a block of
// kTileRows consecutive rows is multiplied by every token of the pass, kTileTokens tokens at a
// time, and after the first token tile the block comes from L1/L2. Inside a tile each widened
// weight vector feeds kTileTokens FMAs and each x vector kTileRows FMAs, one accumulator per
// (row, token) in registers. While the first token tile of a block runs, the next block is
// prefetched into L2.
//
// Roofline on Zen 4 (one core): f32 FMA peak ~58 G/s (one 512-bit FMA per cycle at 3.6 GHz) and
// streaming read ~30 GB/s. bf16 costs one FMA per weight element per token, so from about 4
// tokens on the kernel is compute-bound: its weight rate is at most 2 bytes * 58e9 / n_tokens,
// ~29 GB/s at 4 tokens and ~7.3 GB/s at 16. Measured (bench/gemv_benchmark, medians): 23-26 GB/s
// (0.77-0.94 of streaming) at 4 tokens, 6.5-6.8 GB/s (0.22-0.24, ~90% of the FMA bound) at 16.
// Zen 5 (EPYC VM) issues two 512-bit FMAs per cycle (6.6 G/s measured); with a 128 x 2048 weight
// in L2 this kernel runs at about 80% of that at 4 tokens (42-45 GB/s), 65% at 5 (28-30) and 70%
// at 16 (~10.5); from DRAM, one thread, 4 and 5 tokens read 14-18 GB/s (stream 25-30). Tried
// without a gain beyond this VM's noise (A/B runs interleaved, best of five): forced unrolling of
// the tile, x interleaved so that a tile's tokens are one stream, the tile as raw intrinsics, an
// even-then-odd order with half the weight registers, and prefetching only the start of each row.
// Zen 3 (AVX2, 16 registers, two 256-bit FMAs a cycle): GCC 12 compiles the 2 x 5 tile so that
// every FMA reads its x vector from memory (13 cycles per 16 columns with everything in L1, the
// FMA bound being 10). The tile's column loop as inline assembly, each x loaded once into a
// register for both rows (same products, same bits), read a 64 x 2048 weight in L2 at 5 tokens
// at 10.3 GB/s against 8.0 in one session and 11.8 against 11.4 in the next; from DRAM, two
// one-thread copies side by side (8192 x 2048), 19.7 against 21.8 GB/s. With the columns also
// blocked into panels whose x fits L1 (16 row pairs per panel, accumulators kept between panels,
// same bits): in L2 8.8 -> 12.4 GB/s, from DRAM one thread 10.7 -> 11.8, two copies 17.6 -> 18.8
// and 19.7 -> 19.4 (where the verification pass runs). Not kept either.
//
// bf16 uses the same trick as gemv.cc: 2N bf16 loaded as N u32 lanes give the even-indexed
// elements by `lane << 16` and the odd-indexed ones by `lane & 0xffff0000`, so x is copied once
// per pass into the matching even/odd order (per token, per block of 2N columns). Columns past
// the last full vector block use a scalar loop, as does the HWY_SCALAR target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/kernels/cpu/gemv_batch.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must follow foreach_target.h.
#include "hwy/highway.h"

#ifndef ESTUARY_CORE_KERNELS_CPU_GEMV_BATCH_ONCE
#define ESTUARY_CORE_KERNELS_CPU_GEMV_BATCH_ONCE
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/kernels/cpu/bf16_dot.h"
#include "core/kernels/cpu/kernels.h"
#endif

#include "core/kernels/cpu/simd_helpers-inl.h"

HWY_BEFORE_NAMESPACE();
namespace estuary::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace simd = estuary::simd::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register tile: kTileRows rows x kTileTokens tokens, one accumulator each. AVX-512 has 32 vector
// registers: 16 accumulators + 8 widened bf16 weights + 2 x. AVX2 and below have 16: 2 x 4.
// Measured on Zen 4 with the weights in L2 (the compute rate): 4 x 4 runs at ~55 GFMA/s, 95% of
// the core's f32 FMA peak; 2 x 4 and 2 x 8 reach ~40, 1 x 4 and 1 x 8 ~30 (x loads bound), 8 x 2
// ~35-50.
constexpr int kTileRows = HWY_MAX_BYTES >= 64 ? 4 : 2;
constexpr int kTileTokens = 4;
// Calls of one or two tokens take taller tiles (4 rows on every target). A (row, token) accumulator takes one FMA per
// vector of columns (two, even and odd, for bf16), each waiting for the one before it (4 cycles
// on Zen 3 and 4), so a tile of R rows x T tokens keeps at most R*T FMAs in flight: a 2 x 1 tile
// ran one FMA in four cycles, and the batch-invariant path (the lossless mode's drafts and the
// bonus row of its verification) ran a token at 16-22 GB/s where gemv.cc's GEMV ran 22-27 (L2,
// Zen 3). The accumulators are per (row, token) whatever the tile's height, so this changes no
// bit of y.
constexpr int kFewTokenTileRows = 4;
// Tokens per pass over the weight: as many as keep the pass's x (tokens * cols floats) within
// kChunkBytes (L2 holds it next to the weight rows in flight), at least kTileTokens: 32 tokens at
// 2048 columns, 8 at 8192. Past one pass the kernel is compute-bound, so re-reading the weight
// per pass costs little; 64 KiB to 1 MiB measured the same within noise.
constexpr size_t kChunkBytes = size_t{256} << 10;

[[maybe_unused]] static size_t ChunkTokens(size_t cols, size_t n_tokens) {
  const size_t fit = kChunkBytes / (std::max<size_t>(cols, 1) * sizeof(float));
  const size_t tiles = std::max<size_t>(1, fit / kTileTokens);
  return std::min(n_tokens, tiles * kTileTokens);
}

// Tag of the per-thread scratch for the reordered x (simd::ScratchFloats).
struct GemvBatchXeScratch {};

// Prefetches the cache line at `p` into L2 (prefetcht1 on x86), not L1: measured on Zen 4, L1
// prefetches of the next row block (prefetcht0, hwy::Prefetch) occupy the few L1 miss buffers for
// a full DRAM round trip and capped a cold 2048x2048 call at 4 tokens near 12 GB/s; into L2 it
// ran at 20 GB/s, and the tile's demand loads then miss L1 only to hit L2.
HWY_INLINE void PrefetchToL2(const void* p) { __builtin_prefetch(p, /*rw=*/0, /*locality=*/2); }

// Weight element decoders for the scalar tails, and vector loaders (simd_helpers-inl.h).
using simd::Bf16Elem;
using simd::F16Elem;
using simd::F16Loader;
using simd::F32Elem;
using simd::F32Loader;

// Adds the scalar part over columns [begin, end) of every (row, token) of a tile to
// out[t * R + r]. `w` is the tile's first row, `x` the tile's first token; both weight rows and
// x tokens are `stride` (= cols) apart.
template <class Elem, int R, int T, typename W>
HWY_INLINE void AddTails(const W* HWY_RESTRICT w, size_t stride, const float* HWY_RESTRICT x,
                         size_t begin, size_t end, float* HWY_RESTRICT out) {
  if (begin == end) return;
  for (int r = 0; r < R; ++r) {
    const W* row = w + r * stride;
    for (int t = 0; t < T; ++t) {
      const float* xt = x + t * stride;
      float sum = 0.0f;
      for (size_t i = begin; i < end; ++i) sum += Elem::Get(row, i) * xt[i];
      out[t * R + r] += sum;
    }
  }
}

// out[t * R + r] = horizontal sum of acc[r][t].
template <int R, int T>
HWY_INLINE void ReduceTile(const VF (&acc)[R][T], float* HWY_RESTRICT out) {
  const DF df;
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) out[t * R + r] = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
  }
}

// Writes out[t * R + r] into y[t][row0 + r] (y row stride `rows`).
template <int R, int T>
HWY_INLINE void StoreTile(const float* HWY_RESTRICT out, size_t rows, float* HWY_RESTRICT y) {
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) y[t * rows + r] = out[t * R + r];
  }
}

// Runs `runner.Run<T, kPrefetch>(t)` over the `nt` tokens of a chunk: full tiles of kTileTokens,
// then one tile of the remainder. Only the first tile prefetches the next row block: it is the
// one that reads the current block from memory, the others find it in L1/L2. A lone remainder
// token joins the last full tile instead (AVX-512: a 4 x 5 tile, 20 accumulators, 8 weight and
// 2 x vectors in the 32 registers; AVX2: 2 x 5, 10 + 4 + 2 in the 16; SSE4 and below keep the
// one-token tile): a one-token tile is bound by its loads and widens the weights again, costing
// almost as much as a full one (a verification pass of 4 drafts and the bonus row is 5 tokens).
// On a Zen 3 VM (AVX2) the lossless mode's verification pass went from 1.23-1.67 to 1.05-1.52
// full steps with the merge (four alternating runs each; a noisy host). Each (row, token)
// accumulates in the same order whatever its tile, so the tiling changes no bit of y.
template <class Runner>
HWY_INLINE void ForEachTokenTile(size_t nt, const Runner& runner) {
  constexpr size_t kTile = static_cast<size_t>(kTileTokens);
  const bool merge_last = HWY_MAX_BYTES >= 32 && nt > kTile && nt % kTile == 1;
  const size_t full_tiles_end = merge_last ? nt - kTile - 1 : nt - nt % kTile;
  size_t t = 0;
  if (full_tiles_end > 0) {
    runner.template Run<kTileTokens, true>(0);
    t = kTile;
  }
  for (; t < full_tiles_end; t += kTile) runner.template Run<kTileTokens, false>(t);
  const bool first = t == 0;
  if (merge_last) {
    if (first) {
      runner.template Run<kTileTokens + 1, true>(t);
    } else {
      runner.template Run<kTileTokens + 1, false>(t);
    }
    return;
  }
  static_assert(kTileTokens <= 8, "one case per remainder below");
  switch (nt - t) {
#define ESTUARY_REMAINDER_TILE(TT)         \
  case TT:                                 \
    if constexpr (TT < kTileTokens) {      \
      if (first) {                         \
        runner.template Run<TT, true>(t);  \
      } else {                             \
        runner.template Run<TT, false>(t); \
      }                                    \
    }                                      \
    break;
    ESTUARY_REMAINDER_TILE(1)
    ESTUARY_REMAINDER_TILE(2)
    ESTUARY_REMAINDER_TILE(3)
    ESTUARY_REMAINDER_TILE(4)
    ESTUARY_REMAINDER_TILE(5)
    ESTUARY_REMAINDER_TILE(6)
    ESTUARY_REMAINDER_TILE(7)
#undef ESTUARY_REMAINDER_TILE
    default:
      break;
  }
}

// Advances r over the whole blocks of R rows left below `rows`, calling
// `block(std::integral_constant<int, R>, r, next)` for each; `next` is the first row of the
// following block, which the block prefetches (the last block's is its own, already cached).
template <int R, class Block>
HWY_INLINE void RunRowBlocks(size_t rows, size_t& r, const Block& block) {
  for (; r + R <= rows; r += R) {
    const size_t next = r + 2 * R <= rows ? r + R : r;
    block(std::integral_constant<int, R>{}, r, next);
  }
}

// Covers rows [0, rows) with blocks of the tile height for `nt` tokens (kFewTokenTileRows up to
// two tokens, else kTileRows), then of kTileRows, then single rows.
template <class Block>
HWY_INLINE void ForEachRowBlock(size_t nt, size_t rows, const Block& block) {
  size_t r = 0;
  if (nt <= 2) RunRowBlocks<kFewTokenTileRows>(rows, r, block);
  RunRowBlocks<kTileRows>(rows, r, block);
  RunRowBlocks<1>(rows, r, block);
}

#if HWY_TARGET == HWY_SCALAR
// One lane cannot hold a pair of bf16, and there is nothing to tile: plain loops.
template <class Elem, typename W>
void ScalarBatch(const W* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t n_tokens,
                 int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      float sum = 0.0f;
      for (int64_t i = 0; i < cols; ++i) sum += Elem::Get(w + r * cols, i) * x[t * cols + i];
      y[t * rows + r] = sum;
    }
  }
}

void GemvBatchBf16Impl(const uint16_t* HWY_RESTRICT w, const float* HWY_RESTRICT x,
                       int64_t n_tokens, int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  ScalarBatch<Bf16Elem>(w, x, n_tokens, rows, cols, y);
}
void GemvBatchF16Impl(const uint16_t* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t n_tokens,
                      int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  ScalarBatch<F16Elem>(w, x, n_tokens, rows, cols, y);
}
void GemvBatchF32Impl(const float* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t n_tokens,
                      int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  ScalarBatch<F32Elem>(w, x, n_tokens, rows, cols, y);
}
#else

// ---------------------------------------------------------------------------------------------
// bf16

// R rows x T tokens over columns [0, main) (a multiple of 2N). `w` is the first row (row stride
// `stride`), `xe` the first token's reordered x (token stride `xe_stride`).
template <int R, int T, bool kPrefetch>
HWY_INLINE void Bf16Tile(const uint16_t* HWY_RESTRICT w, size_t stride,
                         const float* HWY_RESTRICT xe, size_t xe_stride, size_t main,
                         const uint16_t* prefetch, float* HWY_RESTRICT out) {
  const DF df;
  const size_t n = hn::Lanes(df);
  VF acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = hn::Zero(df);
  }
  for (size_t i = 0; i < main; i += 2 * n) {
    // One prefetch per row and cache line (an iteration covers a line with AVX-512, half of one
    // with AVX2).
    if constexpr (kPrefetch) {
      if (i % (64 / sizeof(uint16_t)) == 0) {
        for (int r = 0; r < R; ++r) PrefetchToL2(prefetch + r * stride + i);
      }
    }
    if constexpr (T <= 2) {
      // Tall tiles of few tokens: the tokens' x in registers, each row's weights used as they
      // are widened (all of them at once would not fit in the registers next to R*T sums).
      VF x_even[T];
      VF x_odd[T];
      for (int t = 0; t < T; ++t) {
        x_even[t] = hn::Load(df, xe + t * xe_stride + i);
        x_odd[t] = hn::Load(df, xe + t * xe_stride + i + n);
      }
      for (int r = 0; r < R; ++r) {
        VF even;
        VF odd;
        simd::LoadBf16EvenOdd(w + r * stride + i, even, odd);
        for (int t = 0; t < T; ++t) {
          acc[r][t] = hn::MulAdd(even, x_even[t], acc[r][t]);
          acc[r][t] = hn::MulAdd(odd, x_odd[t], acc[r][t]);
        }
      }
      continue;
    }
    VF even[R];
    VF odd[R];
    for (int r = 0; r < R; ++r) simd::LoadBf16EvenOdd(w + r * stride + i, even[r], odd[r]);
    for (int t = 0; t < T; ++t) {
      const VF x_even = hn::Load(df, xe + t * xe_stride + i);
      const VF x_odd = hn::Load(df, xe + t * xe_stride + i + n);
      for (int r = 0; r < R; ++r) {
        acc[r][t] = hn::MulAdd(even[r], x_even, acc[r][t]);
        acc[r][t] = hn::MulAdd(odd[r], x_odd, acc[r][t]);
      }
    }
  }
  ReduceTile<R, T>(acc, out);
}

// One tile of R rows x T tokens starting at token t of the chunk: the vector part, the scalar
// tails, the store. `x` is the chunk's first token in the caller's layout, `xe` the same tokens
// reordered (token stride `main`), `y` the chunk's first output row at the block's first row
// column, `prefetch` the first row of the next row block.
template <int R>
struct Bf16TileRunner {
  const uint16_t* w;
  size_t cols;
  const float* x;
  const float* xe;
  size_t main;
  size_t rows;
  float* y;
  const uint16_t* prefetch;

  template <int T, bool kPrefetch>
  HWY_INLINE void Run(size_t t) const {
    float out[R * T];
    Bf16Tile<R, T, kPrefetch>(w, cols, xe + t * main, main, main, prefetch, out);
    AddTails<Bf16Elem, R, T>(w, cols, x + t * cols, main, cols, out);
    StoreTile<R, T>(out, rows, y + t * rows);
  }
};

void GemvBatchBf16Impl(const uint16_t* HWY_RESTRICT w, const float* HWY_RESTRICT x,
                       int64_t n_tokens, int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const size_t c = static_cast<size_t>(cols);
  const size_t r_count = static_cast<size_t>(rows);
  const size_t main = c - c % (2 * n);
  const size_t chunk = ChunkTokens(c, static_cast<size_t>(n_tokens));
  float* xe = simd::ScratchFloats<GemvBatchXeScratch>(chunk * main + 2 * n);
  for (size_t t0 = 0; t0 < static_cast<size_t>(n_tokens); t0 += chunk) {
    const size_t nt = std::min(chunk, static_cast<size_t>(n_tokens) - t0);
    const float* xc = x + t0 * c;
    // xe[t][b + j] = x[t][b + 2j], xe[t][b + n + j] = x[t][b + 2j + 1] per block b of 2n.
    for (size_t t = 0; t < nt; ++t) simd::ReorderEvenOdd(xc + t * c, main, xe + t * main);
    float* yc = y + t0 * r_count;
    ForEachRowBlock(nt, r_count, [&](auto rows_tag, size_t r, size_t next) {
      constexpr int R = decltype(rows_tag)::value;
      ForEachTokenTile(
          nt, Bf16TileRunner<R>{w + r * c, c, xc, xe, main, r_count, yc + r, w + next * c});
    });
  }
}

// ---------------------------------------------------------------------------------------------
// f32 and f16: one weight vector is N consecutive elements, x is read in place.

// R rows x T tokens over columns [0, main) (a multiple of N). `w` is the first row and `x` the
// first token (both of stride `stride`), `prefetch` the first row of the next row block.
template <class Loader, int R, int T, bool kPrefetch>
HWY_INLINE void WideTile(const typename Loader::W* HWY_RESTRICT w, size_t stride,
                         const float* HWY_RESTRICT x, size_t main,
                         const typename Loader::W* prefetch, float* HWY_RESTRICT out) {
  const DF df;
  const size_t n = hn::Lanes(df);
  // Elements per cache line: one prefetch per row per line.
  constexpr size_t kLine = 64 / sizeof(typename Loader::W);
  VF acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = hn::Zero(df);
  }
  for (size_t i = 0; i < main; i += n) {
    VF wv[R];
    for (int r = 0; r < R; ++r) {
      if constexpr (kPrefetch) {
        if (i % kLine == 0) PrefetchToL2(prefetch + r * stride + i);
      }
      wv[r] = Loader::Load(w + r * stride, i);
    }
    for (int t = 0; t < T; ++t) {
      const VF xv = hn::LoadU(df, x + t * stride + i);
      for (int r = 0; r < R; ++r) acc[r][t] = hn::MulAdd(wv[r], xv, acc[r][t]);
    }
  }
  ReduceTile<R, T>(acc, out);
}

// As Bf16TileRunner, for f32 / f16 weights (x read in place).
template <class Loader, class Elem, int R>
struct WideTileRunner {
  using W = typename Loader::W;
  const W* w;
  size_t cols;
  const float* x;
  size_t main;
  size_t rows;
  float* y;
  const W* prefetch;

  template <int T, bool kPrefetch>
  HWY_INLINE void Run(size_t t) const {
    float out[R * T];
    WideTile<Loader, R, T, kPrefetch>(w, cols, x + t * cols, main, prefetch, out);
    AddTails<Elem, R, T>(w, cols, x + t * cols, main, cols, out);
    StoreTile<R, T>(out, rows, y + t * rows);
  }
};

template <class Loader, class Elem>
void WideBatch(const typename Loader::W* HWY_RESTRICT w, const float* HWY_RESTRICT x,
               int64_t n_tokens, int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const size_t c = static_cast<size_t>(cols);
  const size_t r_count = static_cast<size_t>(rows);
  const size_t main = c - c % n;
  const size_t chunk = ChunkTokens(c, static_cast<size_t>(n_tokens));
  for (size_t t0 = 0; t0 < static_cast<size_t>(n_tokens); t0 += chunk) {
    const size_t nt = std::min(chunk, static_cast<size_t>(n_tokens) - t0);
    const float* xc = x + t0 * c;
    float* yc = y + t0 * r_count;
    ForEachRowBlock(nt, r_count, [&](auto rows_tag, size_t r, size_t next) {
      constexpr int R = decltype(rows_tag)::value;
      ForEachTokenTile(nt, WideTileRunner<Loader, Elem, R>{w + r * c, c, xc, main, r_count, yc + r,
                                                           w + next * c});
    });
  }
}

void GemvBatchF32Impl(const float* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t n_tokens,
                      int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  WideBatch<F32Loader, F32Elem>(w, x, n_tokens, rows, cols, y);
}

void GemvBatchF16Impl(const uint16_t* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t n_tokens,
                      int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  WideBatch<F16Loader, F16Elem>(w, x, n_tokens, rows, cols, y);
}

#endif  // HWY_TARGET == HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace estuary::kernels::cpu {

HWY_EXPORT(GemvBatchBf16Impl);
HWY_EXPORT(GemvBatchF32Impl);
HWY_EXPORT(GemvBatchF16Impl);

namespace {

std::atomic<Bf16BatchPath> g_bf16_path{Bf16BatchPath::kFma};

}  // namespace

void SetBf16BatchPath(Bf16BatchPath path) { g_bf16_path.store(path, std::memory_order_relaxed); }

Bf16BatchPath GetBf16BatchPath() { return g_bf16_path.load(std::memory_order_relaxed); }

bool Bf16BatchUsesDot() { return GetBf16BatchPath() == Bf16BatchPath::kDot && Bf16DotAvailable(); }

void GemvBatchBf16Fma(const uint16_t* w, const float* x, int64_t n_tokens, int64_t rows,
                      int64_t cols, float* y) {
  if (n_tokens <= 0 || rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemvBatchBf16Impl)(w, x, n_tokens, rows, cols, y);
}

// The path is chosen per call but never by n_tokens or rows, so MatMulPath::kBatchInvariant
// stays batch-invariant as long as the path is not switched in the middle of a prompt.
void GemvBatchBf16(const uint16_t* w, const float* x, int64_t n_tokens, int64_t rows, int64_t cols,
                   float* y) {
  if (Bf16BatchUsesDot()) {
    GemvBatchBf16Dot(w, x, n_tokens, rows, cols, y);
  } else {
    GemvBatchBf16Fma(w, x, n_tokens, rows, cols, y);
  }
}

void GemvBatchF32(const float* w, const float* x, int64_t n_tokens, int64_t rows, int64_t cols,
                  float* y) {
  if (n_tokens <= 0 || rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemvBatchF32Impl)(w, x, n_tokens, rows, cols, y);
}

void GemvBatchF16(const uint16_t* w, const float* x, int64_t n_tokens, int64_t rows, int64_t cols,
                  float* y) {
  if (n_tokens <= 0 || rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemvBatchF16Impl)(w, x, n_tokens, rows, cols, y);
}

}  // namespace estuary::kernels::cpu
#endif  // HWY_ONCE
