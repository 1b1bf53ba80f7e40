#include "core/tensor/tensor.h"

#include <cmath>

#include "core/tensor/half_float.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

TEST(HalfFloatTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties to even (down).
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
}

TEST(HalfFloatTest, F16RoundTripsRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
}

TEST(TensorTest, ZerosViewsAndRows) {
  auto t = Tensor::Zeros(DType::kF32, {4, 3});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->numel(), 12);
  EXPECT_EQ(t->nbytes(), 48u);
  t->mutable_data<float>()[7] = 5.0f;
  auto rows = t->Rows(2, 4);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->dim(0), 2);
  EXPECT_EQ(rows->data<float>()[1], 5.0f);
  EXPECT_FALSE(t->Rows(3, 5).ok());
}

TEST(TensorTest, RejectsNegativeAndOverflowingShapes) {
  EXPECT_EQ(Tensor::Zeros(DType::kF32, {-1, 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckedNumel({int64_t{1} << 40, int64_t{1} << 40}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, ConvertsBetweenFloatTypes) {
  auto t = Tensor::Zeros(DType::kF32, {3});
  ASSERT_TRUE(t.ok());
  t->mutable_data<float>()[0] = 1.5f;
  t->mutable_data<float>()[1] = -3.0f;
  t->mutable_data<float>()[2] = 0.1f;
  auto bf = ConvertDType(*t, DType::kBF16);
  ASSERT_TRUE(bf.ok());
  EXPECT_EQ(ElementAsF32(*bf, 0), 1.5f);
  EXPECT_EQ(ElementAsF32(*bf, 1), -3.0f);
  EXPECT_NEAR(ElementAsF32(*bf, 2), 0.1f, 1e-3f);
  auto back = ConvertDType(*bf, DType::kF32);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data<float>()[0], 1.5f);
}

}  // namespace
}  // namespace estuary
