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
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/kernels/cpu/bf16_dot.h"
#include "core/kernels/cpu/stream_read.h"
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

// A batched bf16 kernel called with no tokens or no rows leaves y as it was.
void ExpectZeroSizesWriteNothing(void (*gemv)(const uint16_t*, const float*, int64_t, int64_t,
                                              int64_t, float*)) {
  const std::vector<uint16_t> w(64, 0x3f80);  // bf16 1.0
  const std::vector<float> x(64, 1.0f);
  std::vector<float> y(4, -1.0f);
  gemv(w.data(), x.data(), 0, 2, 32, y.data());
  gemv(w.data(), x.data(), 2, 0, 32, y.data());
  EXPECT_EQ(y, std::vector<float>(4, -1.0f));
}

TEST(GemvBatchTest, ZeroTokensOrRowsWriteNothing) { ExpectZeroSizesWriteNothing(&GemvBatchBf16); }

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
// 301 rows: with two threads the last row block has 13 rows, so a row sits in tiles of different
// heights at 1, 2 and 3+ tokens (gemv_batch.cc's taller one- and two-token tiles) and the last
// row in a single-row tile.
void ExpectBatchInvariantForAnyChunking(DType dtype) {
  const int64_t rows = 301, cols = 200, n = 70;
  const Tensor w = MakeTensor(dtype, {rows, cols}, RandomVector(rows * cols, 3));
  const std::vector<float> x = RandomVector(n * cols, 4);
  std::vector<float> whole(static_cast<size_t>(n * rows));
  ASSERT_TRUE(MatMul(w, x.data(), n, whole.data(), {MatMulPath::kBatchInvariant, nullptr}).ok());
  for (const int chunk : {1, 2, 3, 5, 9, 16, 64}) {  // 5 and 9 end in a 4 x 5 tile
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

// On every compiled SIMD target, as the tests above: the tile shapes differ per target.
TEST(MatMulTest, BatchInvariantPathGivesTheSameBitsForAnyBatch) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      ExpectBatchInvariantForAnyChunking(dtype);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// kFastest with a pool: the GEMV (1 token) and the batched GEMV (3, 17 tokens) split the rows
// over the pool in blocks starting at multiples of 16 rows (several claimed blocks per thread up
// to 16 tokens, one block per thread at 17). Bit-exactness rule: every output element is
// bitwise the serial call's (no element changes its accumulation order), so this compares with
// EXPECT_EQ; the serial call itself is checked against the double reference above.
// The shapes make every call split (>= 2 * 2^18 multiply-adds) and cover odd row counts, a last
// block ending in a partial register tile, and bf16 rows longer than 4096 columns (the GEMV's
// 8-row blocks, whose leftover rows take a different accumulator layout).
TEST(MatMulTest, RowSplitOverThePoolGivesTheSerialBits) {
  WorkerPool pool(2);
  struct Shape {
    int64_t rows, cols;
  };
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape shape : {Shape{37, 20000}, Shape{333, 4100}, Shape{1001, 2048}}) {
      const Tensor w = MakeTensor(dtype, {shape.rows, shape.cols},
                                  RandomVector(shape.rows * shape.cols, 5));
      for (const int64_t n : {1, 3, 17}) {
        const std::vector<float> x = RandomVector(n * shape.cols, 6);
        std::vector<float> serial(static_cast<size_t>(n * shape.rows), NAN);
        std::vector<float> split(serial.size(), NAN);
        ASSERT_TRUE(MatMul(w, x.data(), n, serial.data()).ok());
        ASSERT_TRUE(MatMul(w, x.data(), n, split.data(), {MatMulPath::kFastest, &pool}).ok());
        EXPECT_EQ(split, serial) << DTypeName(dtype) << " " << shape.rows << "x" << shape.cols
                                 << " tokens " << n;
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


// ---------------------------------------------------------------------------------------------
// StreamSum / MeasureStreamRead (stream_read.h). StreamSum is exact: u32 addition wraps mod 2^32
// and is associative, so any accumulator order, prefetch distance or split over threads must
// give the scalar reference's sum bit for bit. No timing assertion: the figures only have to be
// positive and finite.

uint32_t ScalarWordSum(const std::vector<uint8_t>& bytes, size_t offset, size_t size) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    uint32_t word;
    std::memcpy(&word, bytes.data() + offset + i, 4);
    sum += word;
  }
  return sum;
}

TEST(StreamReadTest, SumMatchesScalarReference) {
  std::mt19937 rng(91);
  std::vector<uint8_t> bytes(3 * 4096 + 1000);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  // Unaligned starts, sizes that leave a partial vector and a partial word.
  for (size_t offset : {size_t{0}, size_t{4}, size_t{7}}) {
    for (size_t size : {size_t{0}, size_t{3}, size_t{60}, size_t{1024}, size_t{3 * 4096 + 37}}) {
      for (size_t prefetch : {size_t{0}, size_t{256}, size_t{2048}}) {
        EXPECT_EQ(StreamSum(bytes.data() + offset, size, prefetch),
                  ScalarWordSum(bytes, offset, size))
            << "offset " << offset << " size " << size << " prefetch " << prefetch;
      }
    }
  }
}

TEST(StreamReadTest, SmallBufferGivesPositiveFiguresAndTheRightSum) {
  StreamReadOptions options;
  options.bytes = (size_t{1} << 20) + 5000;  // rounded down to 4 KiB: 257 pages
  options.repetitions = 2;
  options.max_threads = 2;
  const StreamReadResult result = MeasureStreamRead(options);
  ASSERT_EQ(result.bytes, size_t{257} * 4096);
  // Every pass reads the whole 0x01-filled buffer, split over the threads.
  EXPECT_EQ(result.checksum, static_cast<uint32_t>(result.bytes / 4 * 0x01010101u));
  // 2 thread counts x 2 page kinds x 2 prefetch distances.
  ASSERT_EQ(result.variants.size(), 8u);
  ASSERT_EQ(result.best.size(), 2u);
  for (const StreamReadVariant& v : result.variants) {
    EXPECT_TRUE(std::isfinite(v.bytes_per_second) && v.bytes_per_second > 0) << v.threads;
  }
  EXPECT_EQ(result.best[0].threads, 1);
  EXPECT_EQ(result.best[1].threads, 2);
  EXPECT_EQ(result.ceiling_bytes_per_second(),
            std::max(result.best[0].bytes_per_second, result.best[1].bytes_per_second));
  EXPECT_GT(result.ceiling_bytes_per_second(), 0);
}

TEST(StreamReadTest, FasterOfKeepsEachVariantsFasterFigure) {
  StreamReadResult a, b;
  a.variants = {{1, true, 0, 10.0}, {2, true, 0, 30.0}, {2, false, 0, 25.0}};
  b.variants = {{1, true, 0, 12.0}, {2, true, 0, 20.0}, {2, false, 0, 35.0}};
  const StreamReadResult merged = FasterOf(a, b);
  ASSERT_EQ(merged.variants.size(), 3u);
  EXPECT_EQ(merged.variants[0].bytes_per_second, 12.0);
  EXPECT_EQ(merged.variants[1].bytes_per_second, 30.0);
  EXPECT_EQ(merged.variants[2].bytes_per_second, 35.0);
  ASSERT_EQ(merged.best.size(), 2u);
  EXPECT_EQ(merged.best[0].bytes_per_second, 12.0);
  EXPECT_FALSE(merged.best[1].huge_pages);  // the 4 KiB-page variant won at 2 threads
  EXPECT_EQ(merged.ceiling_bytes_per_second(), 35.0);
  EXPECT_EQ(FasterOf(StreamReadResult{}, b).variants[2].bytes_per_second, 35.0);
}


// ---------------------------------------------------------------------------------------------
// GemvBatchBf16Dot (bf16_dot.h, issue 18 item 4) and GemvBatchBf16's choice of path.
//
// The tests above hold GemvBatchBf16 and MatMul to f32-product accuracy (2e-6 of sum |w x|),
// which only its Highway f32-FMA path meets; the environment below pins that path for the whole
// binary, and the Bf16Dot tests switch paths explicitly (Bf16PathScope) and restore it.
//
// Bit-exactness rule of the dot path: activations are rounded to bf16 (round to nearest even),
// the bf16 x bf16 products are exact in f32 and accumulated in f32. So
//   |y - exact| <= 2^-8 * sum_i |w_i x_i| + 1e-6   (2^-9 from rounding x, the rest summation)
//   |y - ref over bf16(x)| <= 2e-6 * sum_i |w_i bf16(x_i)| + 1e-6   (summation error only)
// and a (row, token) output is bitwise the same whatever n_tokens and whichever rows share the
// call.

// Sets GemvBatchBf16's path for one scope.
class Bf16PathScope {
 public:
  explicit Bf16PathScope(Bf16BatchPath path) : saved_(GetBf16BatchPath()) {
    SetBf16BatchPath(path);
  }
  ~Bf16PathScope() { SetBf16BatchPath(saved_); }
  Bf16PathScope(const Bf16PathScope&) = delete;
  Bf16PathScope& operator=(const Bf16PathScope&) = delete;

 private:
  Bf16BatchPath saved_;
};

#define ESTUARY_SKIP_WITHOUT_BF16_DOT()                                         \
  if (!Bf16DotAvailable()) {                                                    \
    GTEST_SKIP() << "this CPU lacks AVX512-BF16 (avx512f/bw/vl + avx512_bf16)"; \
  }

// Random bf16 weights [rows][cols] as raw bits.
std::vector<uint16_t> RandomBf16(int64_t n, uint32_t seed) {
  const std::vector<float> values = RandomVector(n, seed);
  std::vector<uint16_t> bits(values.size());
  std::transform(values.begin(), values.end(), bits.begin(), F32ToBf16);
  return bits;
}

// Runs GemvBatchBf16Dot on random data and checks every output against both references above.
void ExpectBf16DotMatchesReference(int64_t rows, int64_t cols, int64_t n_tokens) {
  SCOPED_TRACE("Bf16Dot " + std::to_string(rows) + "x" + std::to_string(cols) + " tokens " +
               std::to_string(n_tokens));
  const std::vector<uint16_t> w = RandomBf16(rows * cols, static_cast<uint32_t>(rows * 3 + cols));
  const std::vector<float> x = RandomVector(n_tokens * cols, static_cast<uint32_t>(n_tokens + 7));
  std::vector<float> y(static_cast<size_t>(n_tokens * rows) + 1, NAN);  // one guard element
  GemvBatchBf16Dot(w.data(), x.data(), n_tokens, rows, cols, y.data());
  ASSERT_TRUE(std::isnan(y.back())) << "wrote past the end of y";
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t o = 0; o < rows; ++o) {
      double exact = 0.0, rounded = 0.0, magnitude = 0.0, rounded_magnitude = 0.0;
      for (int64_t i = 0; i < cols; ++i) {
        const double wi = Bf16ToF32(w[static_cast<size_t>(o * cols + i)]);
        const float xi = x[static_cast<size_t>(t * cols + i)];
        const double xr = Bf16ToF32(F32ToBf16(xi));
        exact += wi * xi;
        magnitude += std::abs(wi * xi);
        rounded += wi * xr;
        rounded_magnitude += std::abs(wi * xr);
      }
      const double got = y[static_cast<size_t>(t * rows + o)];
      ASSERT_NEAR(got, rounded, 2e-6 * rounded_magnitude + 1e-6) << "token " << t << " row " << o;
      ASSERT_NEAR(got, exact, std::ldexp(magnitude, -8) + 1e-6) << "token " << t << " row " << o;
    }
  }
}

TEST(Bf16DotTest, MatchesDoubleReference) {
  ESTUARY_SKIP_WITHOUT_BF16_DOT();
  // rows: below, at and past multiples of the 4-row tile; cols: below one 32-column vector,
  // around it, partial vectors and the Llama-3.2-1B widths; tokens: below, at and past
  // multiples of the 4-token tile and of a 128-token pass at 2048 columns.
  for (int64_t rows : {1, 3, 4, 5, 13}) {
    for (int64_t cols : {1, 17, 31, 32, 33, 172, 2048}) {
      for (int64_t n_tokens : {1, 2, 3, 4, 5, 8, 17}) {
        ExpectBf16DotMatchesReference(rows, cols, n_tokens);
      }
    }
  }
  ExpectBf16DotMatchesReference(9, 2048, 130);  // two passes, the second of 2 tokens
  ExpectBf16DotMatchesReference(5, 8192, 33);   // 32-token passes at 8192 columns
}

TEST(Bf16DotTest, ZeroTokensOrRowsWriteNothing) {
  ESTUARY_SKIP_WITHOUT_BF16_DOT();
  ExpectZeroSizesWriteNothing(&GemvBatchBf16Dot);
}

// Every (row, token) of one call over all rows and tokens equals, bit for bit, the same element
// computed one token at a time, in token groups of every size, and over row slices that put the
// row at another place in the 4-row tiles (or in the 1-row remainder).
TEST(Bf16DotTest, BitwiseBatchInvariant) {
  ESTUARY_SKIP_WITHOUT_BF16_DOT();
  for (const int64_t cols : {200, 2048}) {
    const int64_t rows = 13, n = cols == 2048 ? 131 : 70;  // 131: past a 128-token pass
    SCOPED_TRACE("cols " + std::to_string(cols));
    const std::vector<uint16_t> w = RandomBf16(rows * cols, 11);
    const std::vector<float> x = RandomVector(n * cols, 12);
    std::vector<float> whole(static_cast<size_t>(n * rows));
    GemvBatchBf16Dot(w.data(), x.data(), n, rows, cols, whole.data());
    for (const int64_t group : {1, 2, 3, 5, 64}) {
      std::vector<float> y(whole.size());
      for (int64_t t0 = 0; t0 < n; t0 += group) {
        const int64_t m = std::min(group, n - t0);
        GemvBatchBf16Dot(w.data(), x.data() + t0 * cols, m, rows, cols, y.data() + t0 * rows);
      }
      ASSERT_EQ(y, whole) << "token groups of " << group;
    }
    for (const int64_t begin : {1, 2, 9, 12}) {
      const int64_t slice = rows - begin;
      std::vector<float> y(static_cast<size_t>(n * slice));
      GemvBatchBf16Dot(w.data() + begin * cols, x.data(), n, slice, cols, y.data());
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t o = 0; o < slice; ++o) {
          ASSERT_EQ(y[static_cast<size_t>(t * slice + o)],
                    whole[static_cast<size_t>(t * rows + begin + o)])
              << "rows from " << begin << " token " << t << " row " << o;
        }
      }
    }
  }
}

// GemvBatchBf16 runs the path the switch names (bitwise the direct call), kFma by default, and
// MatMul's batched and batch-invariant bf16 paths go through it.
TEST(Bf16DotTest, DispatchFollowsTheSwitch) {
  EXPECT_EQ(GetBf16BatchPath(), Bf16BatchPath::kFma);
  ESTUARY_SKIP_WITHOUT_BF16_DOT();
  const int64_t rows = 37, cols = 172, n = 9;
  const std::vector<float> wf = RandomVector(rows * cols, 21);
  const Tensor w = MakeTensor(DType::kBF16, {rows, cols}, wf);
  const uint16_t* wb = w.data<uint16_t>();
  const std::vector<float> x = RandomVector(n * cols, 22);
  const size_t size = static_cast<size_t>(n * rows);
  std::vector<float> dot(size), fma(size), got(size);
  GemvBatchBf16Dot(wb, x.data(), n, rows, cols, dot.data());
  GemvBatchBf16Fma(wb, x.data(), n, rows, cols, fma.data());
  ASSERT_NE(dot, fma) << "the two paths should round differently on random data";
  {
    const Bf16PathScope scope(Bf16BatchPath::kDot);
    EXPECT_TRUE(Bf16BatchUsesDot());
    GemvBatchBf16(wb, x.data(), n, rows, cols, got.data());
    EXPECT_EQ(got, dot);
    ASSERT_TRUE(MatMul(w, x.data(), n, got.data()).ok());
    EXPECT_EQ(got, dot) << "MatMul, 2..64 tokens";
    WorkerPool pool(2);
    ASSERT_TRUE(MatMul(w, x.data(), n, got.data(), {MatMulPath::kBatchInvariant, &pool}).ok());
    EXPECT_EQ(got, dot) << "MatMul, kBatchInvariant";
  }
  {
    const Bf16PathScope scope(Bf16BatchPath::kFma);
    EXPECT_FALSE(Bf16BatchUsesDot());
    GemvBatchBf16(wb, x.data(), n, rows, cols, got.data());
    EXPECT_EQ(got, fma);
  }
}

// The batch-invariant MatMul on the dot path: a token's bits do not depend on the prompt's
// chunking nor on the thread count (the prefill contract), as the test above for the f32 path.
TEST(Bf16DotTest, BatchInvariantMatMulGivesTheSameBitsForAnyChunking) {
  ESTUARY_SKIP_WITHOUT_BF16_DOT();
  const Bf16PathScope scope(Bf16BatchPath::kDot);
  ExpectBatchInvariantForAnyChunking(DType::kBF16);
}

}  // namespace
}  // namespace estuary::kernels::cpu
