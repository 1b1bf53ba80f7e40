// Each CPU kernel against a plain scalar reference written here with double accumulation.
//
// Tolerances (f32 kernels vs double references):
//   MatMul / GEMV:  |y - ref| <= 2e-6 * sum_i |w_i x_i| + 1e-6  (f32 accumulation; the weights are
//                   the same rounded bf16/f16 values on both sides, so only summation error counts)
//   RmsNorm, SwiGlu, Softmax, Attention: relative 1e-5 of the magnitude, plus 1e-6 absolute
//   RoPE rotation:  1e-6 + 2e-7 * pos (the angle pos * inv_freq is rounded to f32, as in llama2.c)
//   Inverse frequencies: relative 1e-5 (f32 pow / division vs double)

#include "core/kernels/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "core/tensor/half_float.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/testing/random_data.h"

namespace estuary {
// Readable parameter values in test names and failure messages.
void PrintTo(DType dtype, std::ostream* os) { *os << DTypeName(dtype); }
void PrintTo(RopeStyle style, std::ostream* os) {
  *os << (style == RopeStyle::kInterleaved ? "interleaved" : "halves");
}
}  // namespace estuary

namespace estuary::kernels::cpu {
namespace {

using ::estuary::testing::MakeTensor;
using ::estuary::testing::RandomVector;

// ---------------------------------------------------------------------------------------------
// MatMul / GEMV

// Runs MatMul on random data and compares every output with a double-accumulated reference.
void ExpectMatMulMatchesReference(DType dtype, int64_t rows, int64_t cols, int64_t n_tokens) {
  SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + std::to_string(rows) + "x" +
               std::to_string(cols) + " tokens " + std::to_string(n_tokens));
  const Tensor w = MakeTensor(dtype, {rows, cols},
                              RandomVector(rows * cols, static_cast<uint32_t>(rows * 7 + cols)));
  const std::vector<float> x = RandomVector(n_tokens * cols, 99);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);
  ASSERT_TRUE(MatMul(w, x.data(), n_tokens, y.data()).ok());

  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t o = 0; o < rows; ++o) {
      double ref = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < cols; ++i) {
        const double term = static_cast<double>(ElementAsF32(w, o * cols + i)) *
                            static_cast<double>(x[static_cast<size_t>(t * cols + i)]);
        ref += term;
        magnitude += std::abs(term);
      }
      const double got = y[static_cast<size_t>(t * rows + o)];
      ASSERT_NEAR(got, ref, 2e-6 * magnitude + 1e-6) << "token " << t << " row " << o;
    }
  }
}

// (dtype, rows, cols, n_tokens)
class MatMulTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t>> {};

TEST_P(MatMulTest, MatchesDoubleReference) {
  const auto& [dtype, rows, cols, n_tokens] = GetParam();
  ExpectMatMulMatchesReference(dtype, rows, cols, n_tokens);
}

std::string MatMulName(const ::testing::TestParamInfo<MatMulTest::ParamType>& info) {
  const auto& [dtype, rows, cols, n_tokens] = info.param;
  return std::string(DTypeName(dtype)) + "_r" + std::to_string(rows) + "_c" + std::to_string(cols) +
         "_t" + std::to_string(n_tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatMulTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(1, 3, 13, 64, 300), ::testing::Values(1, 17, 172, 2048),
                       // 1: GEMV; 3 and 9: batched GEMV; 65: OpenBLAS sgemm
                       ::testing::Values(1, 3, 9, 65)),
    MatMulName);

// The raw bf16 GEMV at shapes that exercise every tail: rows not a multiple of the row block,
// cols that leave a partial vector, cols below one vector, and both row-blocking regimes.
TEST(GemvTest, Bf16TailsMatchReference) {
  // cols above 4096 take the multi-row path (8 rows side by side on AVX-512).
  for (int64_t rows : {1, 7, 9, 17}) {
    for (int64_t cols : {1, 15, 16, 31, 32, 33, 63, 64, 65, 100, 4096, 4129, 8192}) {
      const std::vector<float> wf = RandomVector(rows * cols, static_cast<uint32_t>(rows + cols));
      std::vector<uint16_t> w(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) w[i] = F32ToBf16(wf[i]);
      const std::vector<float> x = RandomVector(cols, 5);
      std::vector<float> y(static_cast<size_t>(rows));
      GemvBf16(w.data(), x.data(), rows, cols, y.data());
      for (int64_t o = 0; o < rows; ++o) {
        double ref = 0.0, magnitude = 0.0;
        for (int64_t i = 0; i < cols; ++i) {
          const double term = static_cast<double>(Bf16ToF32(w[static_cast<size_t>(o * cols + i)])) *
                              x[static_cast<size_t>(i)];
          ref += term;
          magnitude += std::abs(term);
        }
        ASSERT_NEAR(y[static_cast<size_t>(o)], ref, 2e-6 * magnitude + 1e-6)
            << rows << "x" << cols << " row " << o;
      }
    }
  }
}

TEST(GemvTest, ReportsDispatchedTarget) {
  const std::string name = GemvTargetName();
  EXPECT_FALSE(name.empty());
  RecordProperty("gemv_target", name);
}

// Forces each SIMD target this CPU supports (AVX3, AVX2, SSE4, EMU128, ...) in turn, so that the
// targets the dispatcher would pick on other machines are tested here too.
TEST(GemvTest, EveryCompiledTargetMatchesReference) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    EXPECT_STREQ(GemvTargetName(), hwy::TargetName(target));
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t rows : {1, 13}) {
        for (int64_t cols : {1, 17, 172, 4129}) {
          for (int64_t n_tokens : {1, 9, 65}) {
            ExpectMatMulMatchesReference(dtype, rows, cols, n_tokens);
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// ---------------------------------------------------------------------------------------------
// Batched GEMV (GemvBatchBf16 / F16 / F32) called directly

// Runs the batched GEMV of `dtype` on random data and compares every output with a
// double-accumulated reference, with the MatMul tolerance.
void ExpectGemvBatchMatchesReference(DType dtype, int64_t rows, int64_t cols, int64_t n_tokens) {
  SCOPED_TRACE(std::string("GemvBatch ") + DTypeName(dtype) + " " + std::to_string(rows) + "x" +
               std::to_string(cols) + " tokens " + std::to_string(n_tokens));
  const Tensor w = MakeTensor(dtype, {rows, cols},
                              RandomVector(rows * cols, static_cast<uint32_t>(rows * 5 + cols)));
  const std::vector<float> x = RandomVector(n_tokens * cols, static_cast<uint32_t>(n_tokens));
  // One guard element past y: the kernel must not write beyond n_tokens * rows.
  std::vector<float> y(static_cast<size_t>(n_tokens * rows) + 1, NAN);
  switch (dtype) {
    case DType::kF32:
      GemvBatchF32(w.data<float>(), x.data(), n_tokens, rows, cols, y.data());
      break;
    case DType::kBF16:
      GemvBatchBf16(w.data<uint16_t>(), x.data(), n_tokens, rows, cols, y.data());
      break;
    case DType::kF16:
      GemvBatchF16(w.data<uint16_t>(), x.data(), n_tokens, rows, cols, y.data());
      break;
    case DType::kInt4:
      FAIL();
  }
  ASSERT_TRUE(std::isnan(y.back())) << "wrote past the end of y";
  // The weight as f32 once, so the reference loop stays cheap at 33 tokens x 8192 columns.
  std::vector<float> wf(static_cast<size_t>(rows * cols));
  for (int64_t k = 0; k < rows * cols; ++k) wf[static_cast<size_t>(k)] = ElementAsF32(w, k);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t o = 0; o < rows; ++o) {
      double ref = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < cols; ++i) {
        const double term = static_cast<double>(wf[static_cast<size_t>(o * cols + i)]) *
                            static_cast<double>(x[static_cast<size_t>(t * cols + i)]);
        ref += term;
        magnitude += std::abs(term);
      }
      const double got = y[static_cast<size_t>(t * rows + o)];
      ASSERT_NEAR(got, ref, 2e-6 * magnitude + 1e-6) << "token " << t << " row " << o;
    }
  }
}

// (dtype, rows, cols, n_tokens)
class GemvBatchTest
    : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t>> {};

TEST_P(GemvBatchTest, MatchesDoubleReference) {
  const auto& [dtype, rows, cols, n_tokens] = GetParam();
  ExpectGemvBatchMatchesReference(dtype, rows, cols, n_tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvBatchTest,
    // rows: below, at, and past multiples of the row tile (2 or 4 rows); cols: below one vector,
    // partial vector blocks, and the Llama-3.2-1B widths; tokens: below, at and past multiples of
    // the token tile (4) and of a chunk.
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(1, 7, 13, 64), ::testing::Values(1, 17, 172, 2048, 8192),
                       ::testing::Values(2, 3, 8, 16, 17, 33)),
    MatMulName);

TEST(GemvBatchTest, ZeroTokensOrRowsWriteNothing) {
  const std::vector<uint16_t> w(64, 0x3f80);  // bf16 1.0
  const std::vector<float> x(64, 1.0f);
  std::vector<float> y(4, -1.0f);
  GemvBatchBf16(w.data(), x.data(), 0, 2, 32, y.data());
  GemvBatchBf16(w.data(), x.data(), 2, 0, 32, y.data());
  EXPECT_EQ(y, std::vector<float>(4, -1.0f));
}

// Every compiled SIMD target, as for the GEMV above: the batched kernels directly (all tails)
// and through MatMul at the batch sizes it sends to them.
TEST(GemvBatchTest, EveryCompiledTargetMatchesReference) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t rows : {1, 13}) {
        for (int64_t cols : {1, 17, 172, 2048}) {
          for (int64_t n_tokens : {2, 3, 8, 17}) {
            ExpectGemvBatchMatchesReference(dtype, rows, cols, n_tokens);
          }
        }
      }
      ExpectGemvBatchMatchesReference(dtype, 5, 8192, 33);
      ExpectMatMulMatchesReference(dtype, 13, 172, 5);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// kBatchInvariant: a token's output bits do not depend on how many tokens share the call, nor
// on the thread count (what makes chunked prefill write the same KV whatever the chunk size).
TEST(MatMulTest, BatchInvariantPathGivesTheSameBitsForAnyBatch) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t rows = 300, cols = 200, n = 70;
    const Tensor w = MakeTensor(dtype, {rows, cols}, RandomVector(rows * cols, 3));
    const std::vector<float> x = RandomVector(n * cols, 4);
    std::vector<float> whole(static_cast<size_t>(n * rows));
    ASSERT_TRUE(MatMul(w, x.data(), n, whole.data(), {MatMulPath::kBatchInvariant, nullptr}).ok());
    for (const int chunk : {1, 3, 16, 64}) {
      for (const int threads : {1, 2}) {
        WorkerPool pool(threads);
        std::vector<float> y(whole.size());
        for (int64_t t0 = 0; t0 < n; t0 += chunk) {
          const int64_t m = std::min<int64_t>(chunk, n - t0);
          ASSERT_TRUE(MatMul(w, x.data() + t0 * cols, m, y.data() + t0 * rows,
                             {MatMulPath::kBatchInvariant, &pool})
                          .ok());
        }
        EXPECT_EQ(y, whole) << DTypeName(dtype) << " chunk " << chunk << " threads " << threads;
      }
    }
  }
}

TEST(MatMulTest, RejectsBadWeights) {
  const std::vector<float> x(8, 1.0f);
  std::vector<float> y(8);
  const Tensor vector = MakeTensor(DType::kF32, {8}, std::vector<float>(8, 1.0f));
  EXPECT_EQ(MatMul(vector, x.data(), 1, y.data()).code(), absl::StatusCode::kInvalidArgument);
  auto int4 = Tensor::Zeros(DType::kInt4, {2, 8});
  ASSERT_TRUE(int4.ok());
  EXPECT_EQ(MatMul(*int4, x.data(), 1, y.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMul(Tensor(), x.data(), 1, y.data()).code(), absl::StatusCode::kInvalidArgument);
  const Tensor w = MakeTensor(DType::kF32, {2, 4}, std::vector<float>(8, 1.0f));
  EXPECT_EQ(MatMul(w, x.data(), -1, y.data()).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// RmsNorm

class RmsNormTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(RmsNormTest, MatchesDoubleReference) {
  const auto& [dtype, dim] = GetParam();
  const int64_t n_tokens = 3;
  const float eps = 1e-5f;
  const Tensor w = MakeTensor(dtype, {dim}, RandomVector(dim, 11, 0.5f, 1.5f));
  const std::vector<float> x = RandomVector(n_tokens * dim, 12, -3.0f, 3.0f);
  std::vector<float> out(x.size());
  RmsNorm(x.data(), w, n_tokens, dim, eps, out.data());
  for (int64_t t = 0; t < n_tokens; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const double xi = x[static_cast<size_t>(t * dim + i)];
      ss += xi * xi;
    }
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) {
      const size_t k = static_cast<size_t>(t * dim + i);
      const double ref = ElementAsF32(w, i) * (scale * x[k]);
      ASSERT_NEAR(out[k], ref, 1e-5 * std::abs(ref) + 1e-6) << "token " << t << " i " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16),
                                            ::testing::Values(1, 17, 288, 2048)));

// ---------------------------------------------------------------------------------------------
// RoPE

TEST(RopeTest, InverseFrequenciesWithoutScaling) {
  for (int head_dim : {2, 8, 48, 64, 128}) {
    for (float theta : {10000.0f, 500000.0f}) {
      const std::vector<float> inv_freq = RopeInverseFrequencies(head_dim, theta, RopeScaling{});
      ASSERT_EQ(inv_freq.size(), static_cast<size_t>(head_dim / 2));
      for (int i = 0; i < head_dim / 2; ++i) {
        const double ref = std::pow(double{theta}, -2.0 * i / head_dim);
        EXPECT_NEAR(inv_freq[static_cast<size_t>(i)], ref, 1e-5 * ref) << head_dim << " " << i;
      }
    }
  }
}

// llama2.c's run.c computes `1.0f / powf(10000.0f, head_dim / (float)head_size)` and
// `cosf(pos * freq)`; golden tests against its outputs need exactly these f32 values.
TEST(RopeTest, BitExactWithLlama2c) {
  const int head_size = 48;
  const std::vector<float> inv_freq = RopeInverseFrequencies(head_size, 10000.0f, RopeScaling{});
  for (int i = 0; i < head_size; i += 2) {
    const float freq = 1.0f / powf(10000.0f, static_cast<float>(i) / static_cast<float>(head_size));
    EXPECT_EQ(inv_freq[static_cast<size_t>(i / 2)], freq) << i;
  }
  std::vector<float> x = RandomVector(2 * head_size, 3);
  std::vector<float> expected = x;
  const int pos = 37;
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < head_size; i += 2) {
      const float freq =
          1.0f / powf(10000.0f, static_cast<float>(i) / static_cast<float>(head_size));
      const float val = static_cast<float>(pos) * freq;
      const float fcr = cosf(val), fci = sinf(val);
      float* vec = expected.data() + h * head_size;
      const float v0 = vec[i], v1 = vec[i + 1];
      vec[i] = v0 * fcr - v1 * fci;
      vec[i + 1] = v0 * fci + v1 * fcr;
    }
  }
  ApplyRope(x.data(), 2, head_size, pos, inv_freq, RopeStyle::kInterleaved);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], expected[i]) << i;
}

// Llama 3.2 rope_scaling, checked against Meta's reference `apply_scaling` (llama/model.py),
// written here in double with its own if/elif/else structure.
TEST(RopeTest, Llama3ScalingMatchesMetaReference) {
  RopeScaling scaling;
  scaling.enabled = true;
  scaling.factor = 32.0f;
  scaling.low_freq_factor = 1.0f;
  scaling.high_freq_factor = 4.0f;
  scaling.original_max_position_embeddings = 8192;
  const double theta = 500000.0;
  for (int head_dim : {64, 128}) {
    const std::vector<float> got =
        RopeInverseFrequencies(head_dim, static_cast<float>(theta), scaling);
    ASSERT_EQ(got.size(), static_cast<size_t>(head_dim / 2));
    int n_high = 0, n_low = 0, n_mid = 0;
    for (int i = 0; i < head_dim / 2; ++i) {
      const double freq = 1.0 / std::pow(theta, 2.0 * i / head_dim);
      const double low_freq_wavelen = 8192.0 / 1.0, high_freq_wavelen = 8192.0 / 4.0;
      const double wavelen = 2.0 * std::numbers::pi / freq;
      double expected;
      if (wavelen < high_freq_wavelen) {
        expected = freq;
        ++n_high;
      } else if (wavelen > low_freq_wavelen) {
        expected = freq / 32.0;
        ++n_low;
      } else {
        const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
        expected = (1.0 - smooth) * freq / 32.0 + smooth * freq;
        ++n_mid;
      }
      EXPECT_NEAR(got[static_cast<size_t>(i)], expected, 1e-5 * expected)
          << "head_dim " << head_dim << " i " << i;
    }
    // The three bands are all exercised at these settings.
    EXPECT_GT(n_high, 0);
    EXPECT_GT(n_low, 0);
    EXPECT_GT(n_mid, 0);
  }
  // Known endpoints for Llama 3.2 1B (head_dim 64): the first frequency is untouched and the
  // last is the unscaled one divided by the factor.
  const std::vector<float> got = RopeInverseFrequencies(64, 500000.0f, scaling);
  EXPECT_EQ(got.front(), 1.0f);
  EXPECT_NEAR(got.back(), std::pow(500000.0, -62.0 / 64.0) / 32.0, 1e-5 * got.back());
}

class RopeApplyTest : public ::testing::TestWithParam<std::tuple<RopeStyle, int, int>> {};

TEST_P(RopeApplyTest, MatchesDoubleReference) {
  const auto& [style, head_dim, pos] = GetParam();
  const int n_heads = 3;
  const std::vector<float> inv_freq = RopeInverseFrequencies(head_dim, 10000.0f, RopeScaling{});
  const std::vector<float> input = RandomVector(n_heads * head_dim, 21);
  std::vector<float> x = input;
  ApplyRope(x.data(), n_heads, head_dim, pos, inv_freq, style);

  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < half; ++i) {
      const int a = style == RopeStyle::kInterleaved ? h * head_dim + 2 * i : h * head_dim + i;
      const int b = style == RopeStyle::kInterleaved ? a + 1 : a + half;
      const double angle = static_cast<double>(pos) * inv_freq[static_cast<size_t>(i)];
      const double v0 = input[static_cast<size_t>(a)], v1 = input[static_cast<size_t>(b)];
      const double tol = 1e-6 + 2e-7 * pos;
      EXPECT_NEAR(x[static_cast<size_t>(a)], v0 * std::cos(angle) - v1 * std::sin(angle), tol);
      EXPECT_NEAR(x[static_cast<size_t>(b)], v0 * std::sin(angle) + v1 * std::cos(angle), tol);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeApplyTest,
    ::testing::Combine(::testing::Values(RopeStyle::kInterleaved, RopeStyle::kHalves),
                       ::testing::Values(2, 8, 64), ::testing::Values(0, 1, 7, 1000)));

// ---------------------------------------------------------------------------------------------
// SwiGlu, Softmax

TEST(SwiGluTest, MatchesDoubleReferenceAndRunsInPlace) {
  for (int64_t n : {1, 17, 1000}) {
    const std::vector<float> gate = RandomVector(n, 31, -8.0f, 8.0f);
    const std::vector<float> up = RandomVector(n, 32, -2.0f, 2.0f);
    std::vector<float> out(static_cast<size_t>(n));
    SwiGlu(gate.data(), up.data(), n, out.data());
    std::vector<float> in_place = gate;
    SwiGlu(in_place.data(), up.data(), n, in_place.data());
    for (size_t i = 0; i < out.size(); ++i) {
      const double g = gate[i];
      const double ref = g / (1.0 + std::exp(-g)) * up[i];
      ASSERT_NEAR(out[i], ref, 1e-5 * std::abs(ref) + 1e-6) << i;
      ASSERT_EQ(in_place[i], out[i]) << i;
    }
  }
}

TEST(SoftmaxTest, MatchesDoubleReference) {
  for (int64_t n : {1, 5, 17, 1000}) {
    const std::vector<float> input = RandomVector(n, 41, -10.0f, 10.0f);
    std::vector<float> x = input;
    Softmax(x.data(), n);
    const double max_value = *std::max_element(input.begin(), input.end());
    double sum = 0.0;
    for (float v : input) sum += std::exp(v - max_value);
    for (size_t i = 0; i < x.size(); ++i) {
      const double ref = std::exp(input[i] - max_value) / sum;
      ASSERT_NEAR(x[i], ref, 1e-5 * ref + 1e-7) << i;
    }
  }
}

TEST(SoftmaxTest, LargeLogitsDoNotOverflow) {
  std::vector<float> x = {1000.0f, 1001.0f, -1000.0f};
  Softmax(x.data(), 3);
  EXPECT_NEAR(x[0], 1.0 / (1.0 + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(x[1], std::exp(1.0) / (1.0 + std::exp(1.0)), 1e-6);
  EXPECT_EQ(x[2], 0.0f);
}

// ---------------------------------------------------------------------------------------------
// CausalAttention

// (n_heads, n_kv_heads, head_dim, start_pos, n_queries)
class AttentionTest : public ::testing::TestWithParam<std::tuple<int, int, int, int, int>> {};

TEST_P(AttentionTest, MatchesDoubleReference) {
  const auto& [n_heads, n_kv_heads, head_dim, start_pos, n_queries] = GetParam();
  const int n_pos = start_pos + n_queries;
  const int64_t q_stride = int64_t{n_heads} * head_dim, kv_stride = int64_t{n_kv_heads} * head_dim;
  const std::vector<float> q = RandomVector(n_queries * q_stride, 51, -2.0f, 2.0f);
  // One spare position past the end, filled with garbage: causality must ignore it.
  std::vector<float> k = RandomVector((n_pos + 1) * kv_stride, 52, -2.0f, 2.0f);
  std::vector<float> v = RandomVector((n_pos + 1) * kv_stride, 53);
  std::fill(k.begin() + n_pos * kv_stride, k.end(), 1e30f);
  std::fill(v.begin() + n_pos * kv_stride, v.end(), NAN);
  std::vector<float> out(static_cast<size_t>(n_queries * q_stride), NAN);
  CausalAttention(q.data(), n_queries, start_pos, k.data(), v.data(), n_heads, n_kv_heads, head_dim,
                  out.data());

  const int group = n_heads / n_kv_heads;
  for (int t = 0; t < n_queries; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / group;
      const int visible = start_pos + t + 1;
      std::vector<double> scores(static_cast<size_t>(visible));
      for (int p = 0; p < visible; ++p) {
        double dot = 0.0;
        for (int i = 0; i < head_dim; ++i) {
          dot += double{q[static_cast<size_t>(t * q_stride + h * head_dim + i)]} *
                 k[static_cast<size_t>(p * kv_stride + kvh * head_dim + i)];
        }
        scores[static_cast<size_t>(p)] = dot / std::sqrt(static_cast<double>(head_dim));
      }
      const double max_score = *std::max_element(scores.begin(), scores.end());
      double sum = 0.0;
      for (double& s : scores) sum += (s = std::exp(s - max_score));
      for (int i = 0; i < head_dim; ++i) {
        double ref = 0.0;
        for (int p = 0; p < visible; ++p) {
          ref += scores[static_cast<size_t>(p)] / sum *
                 v[static_cast<size_t>(p * kv_stride + kvh * head_dim + i)];
        }
        ASSERT_NEAR(out[static_cast<size_t>(t * q_stride + h * head_dim + i)], ref,
                    1e-5 * std::abs(ref) + 1e-6)
            << "query " << t << " head " << h << " i " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(std::make_tuple(8, 2, 16, 0, 1),      // GQA, first token
                                           std::make_tuple(8, 2, 16, 0, 5),      // GQA prefill
                                           std::make_tuple(8, 2, 16, 6, 1),      // GQA decode
                                           std::make_tuple(8, 2, 16, 6, 5),      // GQA chunk
                                           std::make_tuple(4, 4, 8, 3, 5),       // MHA
                                           std::make_tuple(6, 1, 12, 9, 1),      // MQA
                                           std::make_tuple(32, 8, 64, 40, 5)));  // Llama 3.2 1B

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(EmbeddingTest, CopiesRowsForEachDType) {
  const int64_t vocab = 10, dim = 37;
  const std::vector<float> values = RandomVector(vocab * dim, 61);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor table = MakeTensor(dtype, {vocab, dim}, values);
    const std::vector<int32_t> ids = {3, 0, 9, 3};
    std::vector<float> out(ids.size() * dim, NAN);
    ASSERT_TRUE(Embedding(table, ids, out.data()).ok());
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_EQ(out[t * dim + static_cast<size_t>(i)], ElementAsF32(table, ids[t] * dim + i))
            << DTypeName(dtype) << " token " << t << " i " << i;
      }
    }
  }
}

TEST(EmbeddingTest, RejectsOutOfRangeIds) {
  const Tensor table = MakeTensor(DType::kF32, {10, 4}, RandomVector(40, 62));
  std::vector<float> out(8);
  for (int32_t bad : {10, -1, 1 << 30}) {
    const std::vector<int32_t> ids = {1, bad};
    EXPECT_EQ(Embedding(table, ids, out.data()).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  const Tensor flat = MakeTensor(DType::kF32, {40}, RandomVector(40, 63));
  const std::vector<int32_t> ok_ids = {1};
  EXPECT_EQ(Embedding(flat, ok_ids, out.data()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace estuary::kernels::cpu
