#pragma once
// Scalar conversions between f32 and the 16-bit float formats. Vector kernels have their own;
// these are for loaders, converters and reference code.

#include <cstdint>
#include <cstring>

namespace estuary {

inline float Bf16ToF32(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, 4);
  return out;
}

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t F32ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);

}  // namespace estuary
