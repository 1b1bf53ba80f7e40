// Round-to-nearest int4 quantization of one group, and the f16 storage of (scale, offset).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/quant/quantize_internal.h"
#include "core/tensor/half_float.h"

namespace estuary::quant_internal {
namespace {

// The next f16 above / below a finite f16 (bit patterns; -0 and +0 both step to the smallest
// subnormal of the right sign).
uint16_t F16NextUp(uint16_t h) {
  if (h == 0x8000u || h == 0) return 0x0001u;
  return (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}
uint16_t F16NextDown(uint16_t h) {
  if (h == 0x8000u || h == 0) return 0x8001u;
  return (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}

// f16 nearest to v, then stepped so that the result is <= v (down) or >= v (up).
uint16_t F16RoundDown(float v) {
  uint16_t h = F32ToF16(v);
  while (F16ToF32(h) > v) h = F16NextDown(h);
  return h;
}
uint16_t F16RoundUp(float v) {
  uint16_t h = F32ToF16(v);
  while (F16ToF32(h) < v) h = F16NextUp(h);
  return h;
}

}  // namespace

GroupParams RtnParams(const float* w, int n) {
  float lo = w[0];
  float hi = w[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  // hi/15 - lo/15 cannot overflow where (hi - lo)/15 could.
  return GroupParams{hi / 15.0f - lo / 15.0f, lo};
}

StoredParams StoreRtn(GroupParams rtn, float inv_multiplier) {
  const float lo = rtn.offset * inv_multiplier;
  const float hi = (rtn.offset + 15.0f * rtn.scale) * inv_multiplier;
  StoredParams out;
  out.offset = F16RoundDown(lo);
  const float m = F16ToF32(out.offset);
  if (hi <= m) return out;  // constant group stored exactly: s = 0
  out.scale = F16RoundUp((hi - m) / 15.0f);
  // Cover [lo, hi] also after the f32 rounding of m + 15 s (the kernel's arithmetic).
  while (m + 15.0f * F16ToF32(out.scale) < hi) out.scale = F16NextUp(out.scale);
  return out;
}

StoredParams StoreNearest(GroupParams params, float inv_multiplier) {
  StoredParams out;
  out.scale = F32ToF16(std::max(params.scale, 0.0f) * inv_multiplier);
  out.offset = F32ToF16(params.offset * inv_multiplier);
  return out;
}

GroupParams Load(StoredParams stored, float multiplier) {
  return GroupParams{F16ToF32(stored.scale) * multiplier, F16ToF32(stored.offset) * multiplier};
}

double AssignCodes(const float* w, int n, GroupParams params, uint8_t* q) {
  const float s = params.scale;
  const float m = params.offset;
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  float sum = 0.0f;  // at most 1024 terms; the caller accumulates groups in double
  for (int i = 0; i < n; ++i) {
    const float t = std::clamp((w[i] - m) * inv, 0.0f, 15.0f);
    const int code = static_cast<int>(t + 0.5f);
    q[i] = static_cast<uint8_t>(code);
    const float d = w[i] - (static_cast<float>(code) * s + m);
    sum += d * d;
  }
  return sum;
}

}  // namespace estuary::quant_internal
