#pragma once
// Deterministic random inputs for kernel tests (CPU and CUDA alike), so that every test draws
// its data the same way.

#include <cstdint>
#include <vector>

#include "core/tensor/tensor.h"

namespace estuary::testing {

// `n` floats uniform in [lo, hi), from a std::mt19937 seeded with `seed`.
std::vector<float> RandomVector(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// A host tensor of `dtype` (f32, bf16 or f16) holding `values` rounded to that type; values
// beyond the tensor's size are ignored. Fails the calling test when the tensor cannot be made.
Tensor MakeTensor(DType dtype, Shape shape, const std::vector<float>& values);

}  // namespace estuary::testing
