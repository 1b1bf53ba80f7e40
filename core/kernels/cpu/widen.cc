// Highway conversion of bf16/f16 runs to f32 (see widen.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/kernels/cpu/widen.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must follow foreach_target.h.
#include "hwy/highway.h"

#ifndef ESTUARY_CORE_KERNELS_CPU_WIDEN_ONCE
#define ESTUARY_CORE_KERNELS_CPU_WIDEN_ONCE
#include <cstdint>
#include <cstring>

#include "core/kernels/cpu/widen.h"
#include "core/tensor/half_float.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace estuary::kernels::cpu::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void WidenBf16Impl(const uint16_t* HWY_RESTRICT src, int64_t count, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const size_t n = hn::Lanes(df);
  const size_t total = static_cast<size_t>(count);
  size_t i = 0;
  for (; i + n <= total; i += n) {
    const auto wide = hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src + i)));
    hn::StoreU(hn::BitCast(df, wide), df, out + i);
  }
  for (; i < total; ++i) out[i] = Bf16ToF32(src[i]);
}

void WidenF16Impl(const uint16_t* HWY_RESTRICT src, int64_t count, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const size_t n = hn::Lanes(df);
  const size_t total = static_cast<size_t>(count);
  const auto* half = reinterpret_cast<const hwy::float16_t*>(src);
  size_t i = 0;
  for (; i + n <= total; i += n) {
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, half + i)), df, out + i);
  }
  for (; i < total; ++i) out[i] = F16ToF32(src[i]);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace estuary::kernels::cpu::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace estuary::kernels::cpu::internal {

HWY_EXPORT(WidenBf16Impl);
HWY_EXPORT(WidenF16Impl);

void WidenToF32(DType dtype, const void* src, int64_t n, float* out) {
  if (n <= 0) return;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16:
      HWY_DYNAMIC_DISPATCH(WidenBf16Impl)(static_cast<const uint16_t*>(src), n, out);
      return;
    case DType::kF16:
      HWY_DYNAMIC_DISPATCH(WidenF16Impl)(static_cast<const uint16_t*>(src), n, out);
      return;
    case DType::kInt4:
      break;
  }
}

}  // namespace estuary::kernels::cpu::internal
#endif  // HWY_ONCE
