#pragma once
// Internal to the CPU kernels: conversion of f32/bf16/f16 element runs to f32 (SIMD, Highway
// dynamic dispatch). Used to widen GEMM panels, norm weights and embedding rows.

#include <cstdint>

#include "core/tensor/dtype.h"

namespace estuary::kernels::cpu::internal {

// out[i] = src[i] as f32 for i < n. `dtype` must be kF32, kBF16 or kF16 (kF32 copies).
// `src` points at `n` elements of `dtype`; `out` holds `n` floats and must not overlap `src`.
void WidenToF32(DType dtype, const void* src, int64_t n, float* out);

// True for the element types the CPU kernels read as weights.
inline bool IsFloatWeight(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

}  // namespace estuary::kernels::cpu::internal
