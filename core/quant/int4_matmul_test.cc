#include "core/quant/int4_matmul.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/quant/int4_matrix.h"
#include "core/quant/quant_test_util.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

using quant_test::RandomWeights;

// Relative tolerance against Σ_i |x_i · ŵ_i| (f32 accumulation over up to 8192 terms).
constexpr double kTolerance = 2e-5;

std::vector<float> RandomActivations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

// y from Dequantize with double accumulation; also Σ |x ŵ| per output for the tolerance.
void Reference(const Int4Matrix& w, const std::vector<float>& x, int64_t n_tokens,
               std::vector<double>* y, std::vector<double>* magnitude) {
  const int64_t rows = w.rows(), cols = w.cols();
  auto deq = w.DequantizeToF32();
  ASSERT_TRUE(deq.ok());
  const float* d = deq->data<float>();
  y->assign(static_cast<size_t>(n_tokens * rows), 0.0);
  magnitude->assign(y->size(), 0.0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t o = 0; o < rows; ++o) {
      double sum = 0, mag = 0;
      for (int64_t i = 0; i < cols; ++i) {
        const double p = static_cast<double>(x[static_cast<size_t>(t * cols + i)]) * d[o * cols + i];
        sum += p;
        mag += std::fabs(p);
      }
      (*y)[static_cast<size_t>(t * rows + o)] = sum;
      (*magnitude)[static_cast<size_t>(t * rows + o)] = mag;
    }
  }
}

void CheckAgainstReference(const Int4Matrix& w, int64_t n_tokens, uint32_t seed,
                           const std::string& label) {
  const std::vector<float> x = RandomActivations(n_tokens * w.cols(), seed);
  std::vector<double> ref, mag;
  Reference(w, x, n_tokens, &ref, &mag);
  std::vector<float> y(ref.size(), NAN);
  Int4MatMul(w, x.data(), n_tokens, y.data());
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_NEAR(y[i], ref[i], kTolerance * mag[i] + 1e-30)
        << label << " token " << i / static_cast<size_t>(w.rows()) << " row "
        << i % static_cast<size_t>(w.rows());
  }
  // The threaded variant gives the same bits.
  for (int threads : {2, 3}) {
    std::vector<float> yt(ref.size(), NAN);
    Int4MatMul(w, x.data(), n_tokens, yt.data(), threads);
    ASSERT_EQ(std::memcmp(yt.data(), y.data(), y.size() * sizeof(float)), 0)
        << label << " threads " << threads;
  }
}

class Int4MatMulTest
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(Int4MatMulTest, MatchesDequantizedReference) {
  const auto [rows, cols, n_tokens] = GetParam();
  const Tensor weight = RandomWeights(rows, cols, static_cast<uint32_t>(rows * 7 + cols), 0.02f,
                                      0.01, DType::kBF16);
  auto w = Int4Matrix::Quantize(weight, Int4QuantOptions());
  ASSERT_TRUE(w.ok()) << w.status();
  CheckAgainstReference(*w, n_tokens, static_cast<uint32_t>(n_tokens),
                        absl::StrCat(rows, "x", cols, " n ", n_tokens));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int4MatMulTest,
                         ::testing::Combine(::testing::Values(1, 7, 64, 512),
                                            ::testing::Values(64, 172, 2048, 100),
                                            ::testing::Values(1, 3, 16, 33)));

TEST(Int4MatMulGroupTest, EveryGroupSize) {
  for (int g : {16, 32, 64, 128, 256, 512, 1024}) {
    for (int64_t cols : {100, 172, 640, 2048, 2100}) {
      Int4QuantOptions o;
      o.group_size = g;
      o.refine = (g == 64);
      auto w = Int4Matrix::Quantize(RandomWeights(13, cols, static_cast<uint32_t>(g + cols)), o);
      ASSERT_TRUE(w.ok()) << w.status();
      for (int64_t n : {1, 2, 5, 8, 9}) {
        CheckAgainstReference(*w, n, static_cast<uint32_t>(n * 3 + g),
                              absl::StrCat("g", g, " cols ", cols, " n ", n));
      }
    }
  }
}

TEST(Int4MatMulGroupTest, LargeAndSmallMagnitudes) {
  for (float sigma : {3e3f, 1e-6f}) {
    auto w = Int4Matrix::Quantize(RandomWeights(8, 256, 3, sigma), Int4QuantOptions());
    ASSERT_TRUE(w.ok());
    CheckAgainstReference(*w, 1, 1, absl::StrCat("sigma ", sigma));
    CheckAgainstReference(*w, 4, 2, absl::StrCat("sigma ", sigma));
  }
}

TEST(Int4MatMulGroupTest, TargetName) {
  const std::string name = Int4MatMulTargetName();
  EXPECT_FALSE(name.empty());
  std::printf("Int4MatMul target: %s\n", name.c_str());
}

}  // namespace
}  // namespace estuary
