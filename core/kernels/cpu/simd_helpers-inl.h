// Highway per-target helpers shared by the GEMV kernels (gemv.cc, gemv_batch.cc) and the int4
// quantizer (core/quant/quantize_hqq.cc): per-thread scratch, the bf16 even/odd widening trick
// and the weight element loaders.
//
// Highway "-inl.h" convention: include this after "hwy/highway.h" (so after foreach_target.h in a
// file compiled once per target) and outside the including file's own HWY_NAMESPACE; the helpers
// are in estuary::simd::HWY_NAMESPACE, e.g. `namespace simd = estuary::simd::HWY_NAMESPACE;`.

#include <cstddef>
#include <cstdint>

#include "core/tensor/half_float.h"
#include "hwy/aligned_allocator.h"

// Per-target include guard: toggled once for each target by foreach_target.h.
#if defined(ESTUARY_CORE_KERNELS_CPU_SIMD_HELPERS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ESTUARY_CORE_KERNELS_CPU_SIMD_HELPERS_INL_H_
#undef ESTUARY_CORE_KERNELS_CPU_SIMD_HELPERS_INL_H_
#else
#define ESTUARY_CORE_KERNELS_CPU_SIMD_HELPERS_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace estuary::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Returns a per-thread, vector-aligned buffer of at least `n` floats; it grows to the largest `n`
// seen and is reused (contents unspecified) by later calls. Each `Tag` type (declare one per use
// in the calling file) has its own buffer, so separate users never share or clobber one another's.
template <class Tag>
float* ScratchFloats(size_t n) {
  thread_local hwy::AlignedFreeUniquePtr<float[]> buffer;
  thread_local size_t capacity = 0;
  if (n > capacity) {
    buffer = hwy::AllocateAligned<float>(n);
    capacity = n;
  }
  return buffer.get();
}

// Scalar weight element decoders: Get(row, i) is element i of a weight row as f32.
struct Bf16Elem {
  static float Get(const uint16_t* row, size_t i) { return Bf16ToF32(row[i]); }
};
struct F16Elem {
  static float Get(const uint16_t* row, size_t i) { return F16ToF32(row[i]); }
};
struct F32Elem {
  static float Get(const float* row, size_t i) { return row[i]; }
};

// Vector weight loaders: Load(row, i) is the N (= Lanes(ScalableTag<float>)) weights of a row
// from column i (no alignment needed) as f32; W is the stored element type.
struct F32Loader {
  using W = float;
  static hn::Vec<hn::ScalableTag<float>> Load(const float* HWY_RESTRICT row, size_t i) {
    return hn::LoadU(hn::ScalableTag<float>(), row + i);
  }
};
struct F16Loader {
  using W = uint16_t;
  static hn::Vec<hn::ScalableTag<float>> Load(const uint16_t* HWY_RESTRICT row, size_t i) {
    const hn::ScalableTag<float> df;
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + i));
  }
};

#if HWY_TARGET != HWY_SCALAR
// bf16 trick: 2N bf16 at `p` loaded as N u32 lanes hold element 2j in the low half of lane j and
// element 2j+1 in the high half. Widens them to f32 by one shift or mask: `even` gets elements
// 0, 2, ..., 2N-2 and `odd` elements 1, 3, ..., 2N-1. (One lane cannot hold a pair on
// HWY_SCALAR, hence no such target here.)
HWY_INLINE void LoadBf16EvenOdd(const uint16_t* HWY_RESTRICT p,
                                hn::Vec<hn::ScalableTag<float>>& even,
                                hn::Vec<hn::ScalableTag<float>>& odd) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Repartition<uint16_t, decltype(df)> du16;
  const auto raw = hn::BitCast(du32, hn::LoadU(du16, p));
  even = hn::BitCast(df, hn::ShiftLeft<16>(raw));
  odd = hn::BitCast(df, hn::And(raw, hn::Set(du32, 0xFFFF0000u)));
}

// Copies x[0, main) (`main` a multiple of 2N) into the order that matches LoadBf16EvenOdd: per
// block b of 2N, xe[b + j] = x[b + 2j] and xe[b + N + j] = x[b + 2j + 1] for j < N. `xe` must be
// vector-aligned (as ScratchFloats is); a pure copy, the values are unchanged.
HWY_INLINE void ReorderEvenOdd(const float* HWY_RESTRICT x, size_t main, float* HWY_RESTRICT xe) {
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  for (size_t b = 0; b < main; b += 2 * n) {
    const auto lo = hn::LoadU(df, x + b);
    const auto hi = hn::LoadU(df, x + b + n);
    hn::Store(hn::ConcatEven(df, hi, lo), df, xe + b);
    hn::Store(hn::ConcatOdd(df, hi, lo), df, xe + b + n);
  }
}
#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::simd
HWY_AFTER_NAMESPACE();

#endif  // ESTUARY_CORE_KERNELS_CPU_SIMD_HELPERS_INL_H_ toggle
