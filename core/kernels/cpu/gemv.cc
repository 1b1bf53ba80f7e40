// Decode GEMV y = W x over bf16, f16 and f32 weights, with Highway runtime dispatch.
//
// The weights are read exactly once, so the bf16 kernel is bound by memory bandwidth and its
// loops are shaped for the hardware prefetchers (see kLinearMaxCols): short rows are streamed
// one after the other, long rows a block at a time so that each load of x serves several rows.
// Every row keeps independent accumulators and bf16 is widened in registers by one shift or mask.
//
// bf16 trick: a vector of 2N bf16 loaded as N u32 lanes holds element 2j in the low half of lane
// j and element 2j+1 in the high half. `lane << 16` is element 2j as f32 and `lane & 0xffff0000`
// is element 2j+1, so x is copied once per call into the matching even/odd order per block.
// Columns past the last full block of 2N, and the HWY_SCALAR target, use a scalar loop.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/kernels/cpu/gemv.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must follow foreach_target.h.
#include "hwy/highway.h"

#ifndef ESTUARY_CORE_KERNELS_CPU_GEMV_ONCE
#define ESTUARY_CORE_KERNELS_CPU_GEMV_ONCE
#include <cstddef>
#include <cstdint>

#include "core/kernels/cpu/kernels.h"
#include "core/tensor/half_float.h"
#endif

#include "core/kernels/cpu/simd_helpers-inl.h"

HWY_BEFORE_NAMESPACE();
namespace estuary::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace simd = estuary::simd::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Row blocking for bf16, measured on Zen 4 (Llama-3.2-1B shapes, weights streamed from DRAM):
// - rows of up to kLinearMaxCols columns (x: 16 KiB, half of L1) are read one after the other, a
//   strictly linear stream that runs at the streaming-read rate; reading 8 such 4 KiB rows side
//   by side starts 8 new prefetch streams per block and was about 20% slower;
// - longer rows run kBf16Rows at a time, sharing each load of x; one at a time they ran at about
//   half speed (at 8192 columns x is 32 KiB and no longer stays in L1 next to the stream).
constexpr size_t kLinearMaxCols = 4096;
constexpr int kBf16Rows = HWY_MAX_BYTES >= 64 ? 8 : 4;  // two accumulators per row
constexpr int kRows = 4;                                // f32 / f16
// The linear stream of short rows is prefetched this many bf16 elements (1 KiB) ahead, one line
// per 64 bytes read; past a row's end that is the next row, past the matrix's a harmless hint.
// Measured on a 2-core AMD Zen 3 VM (AVX2), where the hardware prefetchers alone left the 2048-
// column GEMV at 0.69-0.85 of a one-thread streaming read: 0.80-0.86 at 1 KiB (`gemv_benchmark`;
// 0.5-0.75 KiB about the same, 1.5 KiB and more no better than none), and full-depth decode of
// the 1B shape at batch 1 0.69 -> 0.73 of the read ceiling (means of three alternating runs; a
// noisy host).
constexpr size_t kBf16PrefetchAhead = 512;
constexpr size_t kLineElems = 64 / sizeof(uint16_t);  // bf16 elements per cache line

// Tag of the per-thread scratch for the reordered x (simd::ScratchFloats).
struct GemvXeScratch {};

// Scalar part of a bf16 row: sum over [begin, end).
HWY_INLINE float Bf16Tail(const uint16_t* HWY_RESTRICT row, const float* HWY_RESTRICT x,
                          size_t begin, size_t end) {
  float sum = 0.0f;
  for (size_t i = begin; i < end; ++i) sum += Bf16ToF32(row[i]) * x[i];
  return sum;
}

#if HWY_TARGET == HWY_SCALAR
// One lane cannot hold a pair of bf16: plain loop.
void GemvBf16Impl(const uint16_t* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t rows,
                  int64_t cols, float* HWY_RESTRICT y) {
  const size_t c = static_cast<size_t>(cols);
  for (int64_t r = 0; r < rows; ++r) y[r] = Bf16Tail(w + r * cols, x, 0, c);
}
#else
// One row over [0, main) (a multiple of 2N), four accumulators. `xe` is x reordered per block
// of 2N: the N even-indexed elements, then the N odd-indexed ones.
HWY_INLINE float Bf16RowDot(const uint16_t* HWY_RESTRICT row, const float* HWY_RESTRICT xe,
                            size_t main) {
  const DF df;
  const size_t n = hn::Lanes(df);
  VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  size_t i = 0;
  for (; i + 4 * n <= main; i += 4 * n) {
    VF even0, odd0, even1, odd1;
    for (size_t line = 0; line < 4 * n; line += kLineElems) {
      __builtin_prefetch(row + i + kBf16PrefetchAhead + line, /*rw=*/0, /*locality=*/3);
    }
    simd::LoadBf16EvenOdd(row + i, even0, odd0);
    simd::LoadBf16EvenOdd(row + i + 2 * n, even1, odd1);
    a0 = hn::MulAdd(even0, hn::Load(df, xe + i), a0);
    a1 = hn::MulAdd(odd0, hn::Load(df, xe + i + n), a1);
    a2 = hn::MulAdd(even1, hn::Load(df, xe + i + 2 * n), a2);
    a3 = hn::MulAdd(odd1, hn::Load(df, xe + i + 3 * n), a3);
  }
  if (i < main) {
    VF even0, odd0;
    simd::LoadBf16EvenOdd(row + i, even0, odd0);
    a0 = hn::MulAdd(even0, hn::Load(df, xe + i), a0);
    a1 = hn::MulAdd(odd0, hn::Load(df, xe + i + n), a1);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

// R rows of stride `stride` side by side over [0, main), sharing each load of x; two
// accumulators per row (even and odd elements). Writes the vector part of each row to y[r].
template <int R>
HWY_INLINE void Bf16RowsDot(const uint16_t* HWY_RESTRICT w, size_t stride,
                            const float* HWY_RESTRICT xe, size_t main, float* HWY_RESTRICT y) {
  const DF df;
  const size_t n = hn::Lanes(df);
  VF even[R];
  VF odd[R];
  for (int r = 0; r < R; ++r) {
    even[r] = hn::Zero(df);
    odd[r] = hn::Zero(df);
  }
  for (size_t i = 0; i < main; i += 2 * n) {
    const VF x_even = hn::Load(df, xe + i);
    const VF x_odd = hn::Load(df, xe + i + n);
    for (int r = 0; r < R; ++r) {
      VF w_even, w_odd;
      simd::LoadBf16EvenOdd(w + r * stride + i, w_even, w_odd);
      even[r] = hn::MulAdd(w_even, x_even, even[r]);
      odd[r] = hn::MulAdd(w_odd, x_odd, odd[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hn::GetLane(hn::SumOfLanes(df, hn::Add(even[r], odd[r])));
}

void GemvBf16Impl(const uint16_t* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t rows,
                  int64_t cols, float* HWY_RESTRICT y) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const size_t c = static_cast<size_t>(cols);
  const size_t main = c - c % (2 * n);
  float* xe = simd::ScratchFloats<GemvXeScratch>(main + 2 * n);
  simd::ReorderEvenOdd(x, main, xe);
  int64_t r = 0;
  if (c > kLinearMaxCols) {
    for (; r + kBf16Rows <= rows; r += kBf16Rows) {
      Bf16RowsDot<kBf16Rows>(w + r * cols, c, xe, main, y + r);
      for (int k = 0; k < kBf16Rows; ++k) y[r + k] += Bf16Tail(w + (r + k) * cols, x, main, c);
    }
  }
  for (; r < rows; ++r) {
    const uint16_t* row = w + r * cols;
    y[r] = Bf16RowDot(row, xe, main) + Bf16Tail(row, x, main, c);
  }
}
#endif  // HWY_TARGET == HWY_SCALAR

// R rows of stride `stride` (the first at `w`) dotted with x over `cols` columns: two
// accumulators per row over blocks of 2N, then (kOneVector) at most one single vector, then
// scalars. Loader / Elem (simd_helpers-inl.h) read the weights as vectors / scalars.
template <class Loader, class Elem, int R, bool kOneVector>
HWY_INLINE void WideRows(const typename Loader::W* HWY_RESTRICT w, size_t stride,
                         const float* HWY_RESTRICT x, size_t cols, float* HWY_RESTRICT y) {
  const DF df;
  const size_t n = hn::Lanes(df);
  VF acc0[R];
  VF acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = hn::Zero(df);
    acc1[r] = hn::Zero(df);
  }
  size_t i = 0;
  for (; i + 2 * n <= cols; i += 2 * n) {
    const VF x0 = hn::LoadU(df, x + i);
    const VF x1 = hn::LoadU(df, x + i + n);
    for (int r = 0; r < R; ++r) {
      acc0[r] = hn::MulAdd(Loader::Load(w + r * stride, i), x0, acc0[r]);
      acc1[r] = hn::MulAdd(Loader::Load(w + r * stride, i + n), x1, acc1[r]);
    }
  }
  if constexpr (kOneVector) {
    if (i + n <= cols) {
      const VF x0 = hn::LoadU(df, x + i);
      for (int r = 0; r < R; ++r) {
        acc0[r] = hn::MulAdd(Loader::Load(w + r * stride, i), x0, acc0[r]);
      }
      i += n;
    }
  }
  for (int r = 0; r < R; ++r) {
    const typename Loader::W* row = w + r * stride;
    float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0[r], acc1[r])));
    for (size_t k = i; k < cols; ++k) sum += Elem::Get(row, k) * x[k];
    y[r] = sum;
  }
}

// WideRows over all rows, kRows at a time.
template <class Loader, class Elem, bool kOneVector>
HWY_INLINE void WideGemv(const typename Loader::W* HWY_RESTRICT w, const float* HWY_RESTRICT x,
                         int64_t rows, int64_t cols, float* HWY_RESTRICT y) {
  const size_t c = static_cast<size_t>(cols);
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    WideRows<Loader, Elem, kRows, kOneVector>(w + r * cols, c, x, c, y + r);
  }
  for (; r < rows; ++r) WideRows<Loader, Elem, 1, kOneVector>(w + r * cols, c, x, c, y + r);
}

void GemvF32Impl(const float* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t rows,
                 int64_t cols, float* HWY_RESTRICT y) {
  WideGemv<simd::F32Loader, simd::F32Elem, /*kOneVector=*/true>(w, x, rows, cols, y);
}

// f16 widens N elements at a time through PromoteTo (F16C on AVX2 and AVX-512).
void GemvF16Impl(const uint16_t* HWY_RESTRICT w, const float* HWY_RESTRICT x, int64_t rows,
                 int64_t cols, float* HWY_RESTRICT y) {
  WideGemv<simd::F16Loader, simd::F16Elem, /*kOneVector=*/false>(w, x, rows, cols, y);
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace estuary::kernels::cpu {

HWY_EXPORT(GemvBf16Impl);
HWY_EXPORT(GemvF32Impl);
HWY_EXPORT(GemvF16Impl);
HWY_EXPORT(TargetNameImpl);

void GemvBf16(const uint16_t* w, const float* x, int64_t rows, int64_t cols, float* y) {
  if (rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemvBf16Impl)(w, x, rows, cols, y);
}

void GemvF32(const float* w, const float* x, int64_t rows, int64_t cols, float* y) {
  if (rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemvF32Impl)(w, x, rows, cols, y);
}

void GemvF16(const uint16_t* w, const float* x, int64_t rows, int64_t cols, float* y) {
  if (rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemvF16Impl)(w, x, rows, cols, y);
}

const char* GemvTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace estuary::kernels::cpu
#endif  // HWY_ONCE
