#include "core/quant/int4_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/quant/quant_test_util.h"
#include "core/tensor/half_float.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

using quant_test::RandomWeights;

Int4QuantOptions Rtn(int group_size) {
  Int4QuantOptions o;
  o.group_size = group_size;
  o.refine = false;
  return o;
}

Int4QuantOptions Refined(int group_size) {
  Int4QuantOptions o;
  o.group_size = group_size;
  o.refine = true;
  return o;
}

int64_t DocumentedBytes(int64_t rows, int64_t cols, int64_t g) {
  const int64_t n_tiles = (rows + 3) / 4;
  int64_t bytes = 0;
  for (int64_t col0 = 0; col0 < cols; col0 += 4096) {
    const int64_t panel_cols = std::min<int64_t>(4096, cols - col0);
    const int64_t groups = (panel_cols + g - 1) / g;
    const int64_t blocks = (panel_cols + 127) / 128;
    bytes += n_tiles * ((4 * groups * 4 + 63) / 64 * 64 + blocks * 4 * 64);
  }
  return bytes;
}

// RTN: every weight within half a step of its code; codes, scales and offsets consistent.
class RtnBoundTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int>> {};

TEST_P(RtnBoundTest, EveryWeightWithinHalfAStep) {
  const auto [rows, cols, group] = GetParam();
  const Tensor w = RandomWeights(rows, cols, static_cast<uint32_t>(rows * 131 + cols), 0.02f, 0.01);
  auto q = Int4Matrix::Quantize(w, Rtn(group));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->rows(), rows);
  EXPECT_EQ(q->cols(), cols);
  EXPECT_EQ(q->group_size(), group);
  EXPECT_EQ(q->n_groups(), (cols + group - 1) / group);
  const float* src = w.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = c / group;
      const float s = q->Scale(r, g);
      const float m = q->Offset(r, g);
      const int code = q->Code(r, c);
      ASSERT_GE(code, 0);
      ASSERT_LE(code, 15);
      const float deq = q->Dequantize(r, c);
      ASSERT_EQ(deq, static_cast<float>(code) * s + m);
      const float x = src[r * cols + c];
      ASSERT_LE(std::fabs(x - deq), 0.5f * s * (1 + 1e-5f) + 1e-6f * std::fabs(x))
          << "r " << r << " c " << c << " s " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RtnBoundTest,
    ::testing::Values(std::make_tuple(7, 172, 64), std::make_tuple(5, 44, 64),
                      std::make_tuple(3, 1, 64), std::make_tuple(9, 65, 64),
                      std::make_tuple(4, 128, 64), std::make_tuple(1, 2048, 64),
                      std::make_tuple(6, 172, 32),
                      std::make_tuple(6, 300, 128), std::make_tuple(5, 700, 256),
                      std::make_tuple(3, 2100, 1024), std::make_tuple(2, 100, 1024),
                      std::make_tuple(5, 9000, 64), std::make_tuple(3, 8192, 1024)));

TEST(Int4MatrixTest, ShortLastGroupUsesOnlyItsColumns) {
  // cols 172 with g64: groups of 64, 64 and 44. Make the last 44 columns tiny so that their
  // range (and thus scale) differs clearly from the full groups'.
  const int64_t rows = 4, cols = 172;
  Tensor w = RandomWeights(rows, cols, 7, 1.0f);
  float* p = w.mutable_data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 128; c < cols; ++c) p[r * cols + c] *= 1e-3f;
  }
  auto q = Int4Matrix::Quantize(w, Rtn(64));
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_EQ(q->n_groups(), 3);
  for (int64_t r = 0; r < rows; ++r) {
    const float lo = *std::min_element(p + r * cols + 128, p + r * cols + cols);
    const float hi = *std::max_element(p + r * cols + 128, p + r * cols + cols);
    EXPECT_LE(q->Offset(r, 2), lo);
    EXPECT_NEAR(q->Offset(r, 2), lo, 1e-3 * (hi - lo));
    EXPECT_GE(q->Offset(r, 2) + 15 * q->Scale(r, 2), hi);
    EXPECT_NEAR(q->Scale(r, 2), (hi - lo) / 15, 1e-3 * (hi - lo) / 15);
    EXPECT_GT(q->Scale(r, 0), 100 * q->Scale(r, 2));
  }
}

TEST(Int4MatrixTest, ConstantGroupsAreExact) {
  const int64_t rows = 5, cols = 200;
  Tensor w = RandomWeights(rows, cols, 3);
  float* p = w.mutable_data<float>();
  // Constants representable in f16 (times the matrix's multiplier) come back exactly, the others
  // within half a step (1e-3 is 2^-26 of the largest weight: f16 subnormal territory).
  const float constants[] = {0.0f, 1.5f, -3.25f, 1e-3f, 7e4f};
  for (int64_t r = 0; r < rows; ++r) {
    // Row r: group 1 (cols 64..127) constant; row 0 entirely zero.
    for (int64_t c = 64; c < 128; ++c) p[r * cols + c] = constants[r];
    if (r == 0) std::fill(p, p + cols, 0.0f);
  }
  for (bool refine : {false, true}) {
    auto q = Int4Matrix::Quantize(w, refine ? Refined(64) : Rtn(64));
    ASSERT_TRUE(q.ok()) << q.status();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 64; c < 128; ++c) {
        ASSERT_LE(std::fabs(q->Dequantize(r, c) - constants[r]), 0.5f * q->Scale(r, 1))
            << "r " << r << " refine " << refine;
        if (r < 3) {
          ASSERT_EQ(q->Dequantize(r, c), constants[r]);
        }
      }
    }
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(q->Dequantize(0, c), 0.0f);
  }
}

TEST(Int4MatrixTest, Bf16AndF16InputsMatchF32OfTheSameValues) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const Tensor half = RandomWeights(9, 300, 11, 0.05f, 0.01, dtype);
    absl::StatusOr<Tensor> f32 = ConvertDType(half, DType::kF32);
    ASSERT_TRUE(f32.ok());
    for (bool refine : {false, true}) {
      auto a = Int4Matrix::Quantize(half, refine ? Refined(64) : Rtn(64));
      auto b = Int4Matrix::Quantize(*f32, refine ? Refined(64) : Rtn(64));
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      ASSERT_EQ(a->bytes(), b->bytes());
      EXPECT_EQ(std::memcmp(a->data(), b->data(), static_cast<size_t>(a->bytes())), 0)
          << DTypeName(dtype);
      EXPECT_EQ(a->param_multiplier(), b->param_multiplier());
    }
  }
}

TEST(Int4MatrixTest, BytesFollowTheDocumentedFormula) {
  for (int64_t rows : {1, 3, 4, 7, 512}) {
    for (int64_t cols : {1, 44, 64, 100, 172, 2048, 5000, 8192}) {
      for (int g : {32, 64, 128, 256, 1024}) {
        const Tensor w = RandomWeights(rows, cols, 1);
        auto q = Int4Matrix::Quantize(w, Rtn(g));
        ASSERT_TRUE(q.ok()) << q.status();
        EXPECT_EQ(q->bytes(), DocumentedBytes(rows, cols, g))
            << rows << "x" << cols << " g" << g;
      }
    }
  }
  // Llama shapes: exactly 4 + 32 / g bits per weight.
  for (int g : {32, 64, 128}) {
    for (int64_t cols : {2048, 8192}) {
      const Tensor w = RandomWeights(512, cols, 2);
      auto q = Int4Matrix::Quantize(w, Rtn(g));
      ASSERT_TRUE(q.ok());
      EXPECT_DOUBLE_EQ(8.0 * static_cast<double>(q->bytes()) / (512.0 * cols), 4.0 + 32.0 / g);
    }
  }
}

TEST(Int4MatrixTest, DequantizeToF32MatchesElementAccess) {
  const Tensor w = RandomWeights(7, 172, 5);
  auto q = Int4Matrix::Quantize(w, Refined(64));
  ASSERT_TRUE(q.ok());
  auto d = q->DequantizeToF32();
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->dtype(), DType::kF32);
  ASSERT_EQ(d->shape(), (Shape{7, 172}));
  for (int64_t r = 0; r < 7; ++r) {
    for (int64_t c = 0; c < 172; ++c) ASSERT_EQ(d->data<float>()[r * 172 + c], q->Dequantize(r, c));
  }
}

TEST(Int4MatrixTest, ResultDoesNotDependOnThreadCount) {
  const Tensor w = RandomWeights(37, 300, 9, 0.02f, 0.01);
  Int4QuantOptions one = Refined(64);
  one.threads = 1;
  Int4QuantOptions three = Refined(64);
  three.threads = 3;
  auto a = Int4Matrix::Quantize(w, one);
  auto b = Int4Matrix::Quantize(w, three);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->bytes(), b->bytes());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), static_cast<size_t>(a->bytes())), 0);
}

TEST(Int4MatrixTest, ExtremeMagnitudesStayWithinHalfAStep) {
  for (float sigma : {1e4f, 1e-7f}) {
    const Tensor w = RandomWeights(4, 256, 13, sigma);
    auto q = Int4Matrix::Quantize(w, Rtn(64));
    ASSERT_TRUE(q.ok()) << q.status();
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t c = 0; c < 256; ++c) {
        const float s = q->Scale(r, c / 64);
        ASSERT_TRUE(std::isfinite(s));
        ASSERT_GT(s, 0.0f);
        ASSERT_LE(std::fabs(w.data<float>()[r * 256 + c] - q->Dequantize(r, c)),
                  0.5f * s * (1 + 1e-5f));
      }
    }
  }
}

TEST(Int4MatrixTest, MoveLeavesSourceEmpty) {
  auto q = Int4Matrix::Quantize(RandomWeights(4, 64, 1), Rtn(64));
  ASSERT_TRUE(q.ok());
  const int64_t bytes = q->bytes();
  Int4Matrix a = std::move(*q);
  EXPECT_TRUE(q->empty());
  EXPECT_EQ(q->bytes(), 0);
  EXPECT_EQ(a.rows(), 4);
  EXPECT_EQ(a.bytes(), bytes);
  Int4Matrix b;
  EXPECT_TRUE(b.empty());
  EXPECT_FALSE(b.DequantizeToF32().ok());
  b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.rows(), 4);
  EXPECT_TRUE(b.DequantizeToF32().ok());
}

TEST(Int4MatrixTest, RejectsBadOptionsAndInputs) {
  const Tensor w = RandomWeights(4, 64, 1);
  for (int g : {0, 8, 16, 48, 96, 2048}) {
    EXPECT_EQ(Int4Matrix::Quantize(w, Rtn(g)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << g;
  }
  Int4QuantOptions bad_iters = Refined(64);
  bad_iters.refine_iterations = -1;
  EXPECT_FALSE(bad_iters.Validate().ok());
  EXPECT_TRUE(Int4QuantOptions().Validate().ok());

  EXPECT_EQ(Int4Matrix::Quantize(Tensor(), Rtn(64)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto rank1 = Tensor::Zeros(DType::kF32, {64});
  ASSERT_TRUE(rank1.ok());
  EXPECT_EQ(Int4Matrix::Quantize(*rank1, Rtn(64)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto empty = Tensor::Zeros(DType::kF32, {0, 64});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(Int4Matrix::Quantize(*empty, Rtn(64)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto int4 = Tensor::Zeros(DType::kInt4, {4, 64});
  ASSERT_TRUE(int4.ok());
  EXPECT_EQ(Int4Matrix::Quantize(*int4, Rtn(64)).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (float bad : {NAN, INFINITY}) {
    Tensor nan = RandomWeights(4, 64, 1);
    nan.mutable_data<float>()[77] = bad;
    EXPECT_EQ(Int4Matrix::Quantize(nan, Rtn(64)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace estuary
