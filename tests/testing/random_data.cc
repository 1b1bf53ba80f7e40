#include "tests/testing/random_data.h"

#include <algorithm>
#include <random>
#include <utility>

#include "core/tensor/half_float.h"
#include "gtest/gtest.h"

namespace estuary::testing {

std::vector<float> RandomVector(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& v : out) v = dist(rng);
  return out;
}

Tensor MakeTensor(DType dtype, Shape shape, const std::vector<float>& values) {
  auto made = Tensor::Zeros(dtype, std::move(shape));
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return Tensor();
  Tensor t = *std::move(made);
  const size_t n = std::min(values.size(), static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32:
        t.mutable_data<float>()[i] = values[i];
        break;
      case DType::kBF16:
        t.mutable_data<uint16_t>()[i] = F32ToBf16(values[i]);
        break;
      case DType::kF16:
        t.mutable_data<uint16_t>()[i] = F32ToF16(values[i]);
        break;
      case DType::kInt4:
        break;
    }
  }
  return t;
}

}  // namespace estuary::testing
