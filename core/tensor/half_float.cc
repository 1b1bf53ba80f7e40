#include "core/tensor/half_float.h"

#include <cmath>

namespace estuary {

float F16ToF32(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t F32ToF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(value)) return sign | 0x7e00u;
  const float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return sign | 0x7c00u;  // overflow to infinity
  if (magnitude < std::ldexp(1.0f, -14)) {
    // Subnormal: round to nearest even multiple of 2^-24.
    const float scaled = magnitude * std::ldexp(1.0f, 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t abs_bits = bits & 0x7fffffffu;
  // Re-bias exponent from 127 to 15 and round the 23-bit mantissa to 10 bits (nearest even).
  const uint32_t rounding = 0xfffu + ((abs_bits >> 13) & 1u);
  abs_bits += rounding;
  const uint32_t exponent = (abs_bits >> 23) - 127 + 15;
  const uint32_t mantissa = (abs_bits >> 13) & 0x3ffu;
  if (exponent >= 31) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>((exponent << 10) | mantissa);
}

}  // namespace estuary
