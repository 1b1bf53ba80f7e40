// GemvBatchBf16Dot (bf16_dot.h): AVX512-BF16 intrinsics in functions compiled for that target
// (function attributes, not per-file flags, so that no inline function of another header is
// emitted here with AVX-512 code) and chosen at run time by GemvBatchBf16 (gemv_batch.cc).
// Debian's Highway 1.0.3 has neither a bf16 dot op nor an AVX3_ZEN4 target, hence intrinsics.
// Owned by the issue-18 kernels work (item 4); the f32-FMA path stays in gemv_batch.cc.
//
// Per call, tokens go in passes of up to kChunkBytes of bf16 activations (128 tokens at 2048
// columns, 32 at 8192; L2 is 1 MiB per Zen 4 core): each token of the pass is converted once to
// bf16 and padded with zeros to a multiple of 32 columns; then every block of kRows rows is
// multiplied by every token of the pass, kTokens at a time, with kRows x kTokens f32 accumulators
// in registers (16 accumulators + 4 weights + 1 x of the 32 zmm registers). Each step loads kRows
// weight vectors and kTokens x vectors (32 bf16 each) for kRows * kTokens vdpbf16ps. The weight's
// tail (cols % 32) uses a masked load, whose zeros meet x's zero padding. While the first token
// tile of a block runs, the next block is prefetched into L2 (as in gemv_batch.cc).
//
// Why the bits of a (row, token) do not depend on n_tokens, the rows around it or the thread:
// its accumulator sees the same vdpbf16ps sequence over the same 32-column vectors in every tile
// shape (R x T only decides how many accumulators run side by side), and its horizontal sum is
// one SumLanes, a fixed tree.
#include "core/kernels/cpu/bf16_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace estuary::kernels::cpu {
namespace {

#define ESTUARY_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define ESTUARY_BF16_INLINE \
  inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512bf16")))

// Tile shape: measured on Zen 4 (GCC 12), 6x4, 4x6, 5x5 and 8x2 tiles spill accumulators to the
// stack and ran at a third of 4x4's rate.
constexpr int kRows = 4;
constexpr int kTokens = 4;
constexpr size_t kChunkBytes = size_t{512} << 10;
constexpr size_t kVec = 32;   // bf16 per 512-bit vector
constexpr size_t kLine = 32;  // bf16 per 64-byte cache line

// Bit casts between the bf16 vector type and integer vectors (GCC vector casts, no code).
ESTUARY_BF16_INLINE __m512bh AsBf16(__m512i v) { return (__m512bh)v; }
ESTUARY_BF16_INLINE __m512i AsInt(__m512bh v) { return (__m512i)v; }

// The lowest n (<= 16) lanes of a 16-lane mask.
ESTUARY_BF16_INLINE __mmask16 LowMask16(size_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1);
}

// x [nt][cols] f32 -> xb [nt][padded] bf16 (round to nearest even), zeros past cols.
ESTUARY_BF16_TARGET void ConvertTokens(const float* x, size_t nt, size_t cols, size_t padded,
                                       uint16_t* xb) {
  for (size_t t = 0; t < nt; ++t) {
    const float* src = x + t * cols;
    uint16_t* dst = xb + t * padded;
    for (size_t i = 0; i < padded; i += kVec) {
      const size_t left = cols > i ? cols - i : 0;
      const __m512 lo = _mm512_maskz_loadu_ps(LowMask16(left), src + i);
      const __m512 hi = _mm512_maskz_loadu_ps(LowMask16(left > 16 ? left - 16 : 0), src + i + 16);
      // cvtne2ps(a, b) puts b in elements 0..15 and a in 16..31.
      _mm512_storeu_si512(dst + i, AsInt(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

// acc[r][t] += w row r . x token t over the 32 columns at i, the weight loaded under `mask`.
template <int R, int T>
ESTUARY_BF16_INLINE void DotStep(const uint16_t* w, size_t cols, const uint16_t* xb, size_t padded,
                                 size_t i, __mmask32 mask, __m512 (&acc)[R][T]) {
  __m512bh wv[R];
  for (int r = 0; r < R; ++r) wv[r] = AsBf16(_mm512_maskz_loadu_epi16(mask, w + r * cols + i));
  for (int t = 0; t < T; ++t) {
    const __m512bh xv = AsBf16(_mm512_loadu_si512(xb + t * padded + i));
    for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
  }
}

// The sum of v's 16 lanes by a fixed tree: halves, quarters, pairs, neighbours. The all-ones
// maskz forms are the plain shuffles; unlike them (and _mm512_reduce_add_ps) they do not trip
// GCC 12's -Wmaybe-uninitialized on the headers' _mm512_undefined_ps.
ESTUARY_BF16_INLINE float SumLanes(__m512 v) {
  constexpr __mmask16 kAll = 0xffff;
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(kAll, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(kAll, v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(kAll, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(kAll, v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(v);
}

// out[t * R + r] = row r . token t over `padded` columns; the last vector of each weight row is
// loaded under `tail` (cols % 32 elements, all when 0). With kPrefetch, the rows at `prefetch`
// (same stride) are brought into L2 a cache line per step.
template <int R, int T, bool kPrefetch>
ESTUARY_BF16_TARGET void Tile(const uint16_t* w, size_t cols, const uint16_t* xb, size_t padded,
                              __mmask32 tail, const uint16_t* prefetch, float* out) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const size_t full = padded - kVec;
  for (size_t i = 0; i < full; i += kVec) {
    if constexpr (kPrefetch) {
      static_assert(kVec == kLine, "one prefetch per row and step");
      for (int r = 0; r < R; ++r) __builtin_prefetch(prefetch + r * cols + i, 0, 2);
    }
    DotStep<R, T>(w, cols, xb, padded, i, ~__mmask32{0}, acc);
  }
  DotStep<R, T>(w, cols, xb, padded, full, tail, acc);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) out[t * R + r] = SumLanes(acc[r][t]);
  }
}

// The operands of one row block within one pass.
struct Block {
  const uint16_t* w;  // first row of the block (row stride cols)
  size_t cols;
  const uint16_t* xb;  // the pass's bf16 tokens (token stride padded)
  size_t padded;
  __mmask32 tail;
  const uint16_t* prefetch;  // first row of the next block
  size_t rows;               // y's token stride
  float* y;                  // the pass's first token, at the block's first row
};

// T tokens starting at token t of the pass: tile, then store into y.
template <int R, int T, bool kPrefetch>
ESTUARY_BF16_TARGET void RunTile(const Block& b, size_t t) {
  float out[R * T];
  Tile<R, T, kPrefetch>(b.w, b.cols, b.xb + t * b.padded, b.padded, b.tail, b.prefetch, out);
  for (int tt = 0; tt < T; ++tt) {
    for (int r = 0; r < R; ++r) b.y[(t + tt) * b.rows + r] = out[tt * R + r];
  }
}

// The remainder tile (nt % kTokens tokens) starting at token t.
template <int R, bool kPrefetch>
ESTUARY_BF16_TARGET void RunRemainder(const Block& b, size_t t, size_t left) {
  static_assert(kTokens <= 8, "one case per remainder below");
  switch (left) {
#define ESTUARY_BF16_REMAINDER(TT)                               \
  case TT:                                                       \
    if constexpr (TT < kTokens) RunTile<R, TT, kPrefetch>(b, t); \
    break;
    ESTUARY_BF16_REMAINDER(1)
    ESTUARY_BF16_REMAINDER(2)
    ESTUARY_BF16_REMAINDER(3)
    ESTUARY_BF16_REMAINDER(4)
    ESTUARY_BF16_REMAINDER(5)
    ESTUARY_BF16_REMAINDER(6)
    ESTUARY_BF16_REMAINDER(7)
#undef ESTUARY_BF16_REMAINDER
    default:
      break;
  }
}

// Rows [0, R) of the block x tokens [0, nt) of the pass, kTokens at a time. Only the first tile
// prefetches the next block: it is the one that reads this block from memory.
template <int R>
ESTUARY_BF16_TARGET void RowBlock(const Block& b, size_t nt) {
  if (nt < static_cast<size_t>(kTokens)) {
    RunRemainder<R, true>(b, 0, nt);
    return;
  }
  RunTile<R, kTokens, true>(b, 0);
  size_t t = kTokens;
  for (; t + kTokens <= nt; t += kTokens) RunTile<R, kTokens, false>(b, t);
  RunRemainder<R, false>(b, t, nt - t);
}

// The mask of the weight's last 32-column vector: cols % 32 lanes, all when that is 0.
__mmask32 TailMask(size_t cols) {
  const size_t rem = cols % kVec;
  if (cols == 0) return 0;
  return rem == 0 ? ~__mmask32{0} : static_cast<__mmask32>((1u << rem) - 1);
}

ESTUARY_BF16_TARGET void GemvBatchBf16DotImpl(const uint16_t* w, const float* x, size_t n_tokens,
                                              size_t rows, size_t cols, float* y) {
  const size_t padded = std::max<size_t>(kVec, (cols + kVec - 1) / kVec * kVec);
  const size_t chunk = std::min(n_tokens, std::max<size_t>(kTokens, kChunkBytes / (padded * 2)));
  thread_local std::vector<uint16_t> scratch;
  if (scratch.size() < chunk * padded) scratch.resize(chunk * padded);
  uint16_t* xb = scratch.data();
  const __mmask32 tail = TailMask(cols);
  for (size_t t0 = 0; t0 < n_tokens; t0 += chunk) {
    const size_t nt = std::min(chunk, n_tokens - t0);
    ConvertTokens(x + t0 * cols, nt, cols, padded, xb);
    float* yc = y + t0 * rows;
    // Each block prefetches the next one; the last prefetches itself (already cached).
    size_t r = 0;
    for (; r + kRows <= rows; r += kRows) {
      const size_t next = r + 2 * kRows <= rows ? r + kRows : r;
      RowBlock<kRows>(Block{w + r * cols, cols, xb, padded, tail, w + next * cols, rows, yc + r},
                      nt);
    }
    for (; r < rows; ++r) {
      const size_t next = r + 1 < rows ? r + 1 : r;
      RowBlock<1>(Block{w + r * cols, cols, xb, padded, tail, w + next * cols, rows, yc + r}, nt);
    }
  }
}

}  // namespace

bool Bf16DotAvailable() {
  static const bool available =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return available;
}

void GemvBatchBf16Dot(const uint16_t* w, const float* x, int64_t n_tokens, int64_t rows,
                      int64_t cols, float* y) {
  if (n_tokens <= 0 || rows <= 0) return;
  GemvBatchBf16DotImpl(w, x, static_cast<size_t>(n_tokens), static_cast<size_t>(rows),
                       static_cast<size_t>(cols), y);
}

}  // namespace estuary::kernels::cpu
