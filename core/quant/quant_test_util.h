#pragma once
// Random weight tensors for the quant tests.

#include <cstdint>
#include <random>

#include "core/tensor/half_float.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"

namespace estuary::quant_test {

// [rows][cols] f32 (or bf16/f16) Gaussian weights of standard deviation `sigma`; with
// `outlier_rate` > 0 that fraction of weights is multiplied by 8.
inline Tensor RandomWeights(int64_t rows, int64_t cols, uint32_t seed, float sigma = 0.02f,
                            double outlier_rate = 0.0, DType dtype = DType::kF32) {
  absl::StatusOr<Tensor> t = Tensor::Zeros(dtype, {rows, cols});
  EXPECT_TRUE(t.ok());
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t i = 0; i < rows * cols; ++i) {
    float v = normal(rng);
    if (outlier_rate > 0 && uniform(rng) < outlier_rate) v *= 8.0f;
    switch (dtype) {
      case DType::kF32:
        t->mutable_data<float>()[i] = v;
        break;
      case DType::kBF16:
        t->mutable_data<uint16_t>()[i] = F32ToBf16(v);
        break;
      case DType::kF16:
        t->mutable_data<uint16_t>()[i] = F32ToF16(v);
        break;
      case DType::kInt4:
        break;
    }
  }
  return *t;
}

}  // namespace estuary::quant_test
