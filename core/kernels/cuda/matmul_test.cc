// GPU tests (CTest label `gpu`) of the cuBLAS bf16 GEMM against kernels::cpu::MatMul; they skip
// without a device. Tolerance (matmul.h): |y - y_ref| <= 5e-4 · Σ_i |bf16(x_i) · W_oi| + 1e-6.
#include "core/kernels/cuda/matmul.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cuda/matmul_test_util.h"
#include "core/tensor/half_float.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"

namespace estuary::cuda {
namespace {

using matmul_test::DeviceArray;
using matmul_test::HasCudaDevice;

struct GemmCase {
  int64_t out = 0;
  int64_t in = 0;
  int64_t n_tokens = 0;
  bool x_bf16 = false;
};

std::string CaseName(const testing::TestParamInfo<GemmCase>& info) {
  const GemmCase& c = info.param;
  return absl::StrCat(c.out, "x", c.in, "_n", c.n_tokens, c.x_bf16 ? "_xbf16" : "_xf32");
}

std::vector<GemmCase> Cases() {
  std::vector<GemmCase> cases;
  for (bool bf16 : {false, true}) {
    for (int64_t n : {1, 3, 8, 32, 64}) {
      cases.push_back({3, 64, n, bf16});
      cases.push_back({17, 40, n, bf16});
    }
    // Llama-3.2-1B: q/o proj, k/v proj, gate/up, down.
    for (auto [out, in] : {std::pair<int64_t, int64_t>{2048, 2048}, {512, 2048}, {8192, 2048},
                           {2048, 8192}}) {
      for (int64_t n : {1, 8, 32}) cases.push_back({out, in, n, bf16});
    }
  }
  return cases;
}

class CudaMatMulBf16Test : public testing::TestWithParam<GemmCase> {};

TEST_P(CudaMatMulBf16Test, MatchesCpuMatMul) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const GemmCase c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.out * 31 + c.in * 7 + c.n_tokens));
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);

  absl::StatusOr<Tensor> weight = Tensor::Zeros(DType::kBF16, {c.out, c.in});
  ASSERT_TRUE(weight.ok()) << weight.status();
  std::vector<uint16_t> w_bits(static_cast<size_t>(c.out * c.in));
  for (size_t i = 0; i < w_bits.size(); ++i) {
    w_bits[i] = F32ToBf16(normal(rng));
    weight->mutable_data<uint16_t>()[i] = w_bits[i];
  }
  std::vector<float> x(static_cast<size_t>(c.n_tokens * c.in));
  std::vector<uint16_t> x_bits(x.size());
  std::vector<float> x_rounded(x.size());  // what the GPU multiplies in both modes
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = uniform(rng);
    x_bits[i] = F32ToBf16(x[i]);
    x_rounded[i] = Bf16ToF32(x_bits[i]);
  }

  std::vector<float> y_ref(static_cast<size_t>(c.n_tokens * c.out));
  ASSERT_TRUE(kernels::cpu::MatMul(*weight, x_rounded.data(), c.n_tokens, y_ref.data()).ok());

  absl::StatusOr<CublasHandle> handle = CublasHandle::Create(nullptr);
  ASSERT_TRUE(handle.ok()) << handle.status();
  DeviceArray<uint16_t> d_w(w_bits);
  DeviceArray<float> d_y(y_ref.size());
  if (c.x_bf16) {
    DeviceArray<uint16_t> d_x(x_bits);
    ASSERT_TRUE(MatMulBf16(*handle, d_w.get(), c.out, c.in, d_x.get(), c.n_tokens, d_y.get()).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    DeviceArray<float> d_x(x);
    ASSERT_TRUE(MatMulBf16(*handle, d_w.get(), c.out, c.in, d_x.get(), c.n_tokens, d_y.get()).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const std::vector<float> y = d_y.Download();

  int failures = 0;
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int64_t o = 0; o < c.out; ++o) {
      double abs_sum = 0;
      for (int64_t i = 0; i < c.in; ++i) {
        abs_sum += std::fabs(static_cast<double>(x_rounded[static_cast<size_t>(t * c.in + i)]) *
                             Bf16ToF32(w_bits[static_cast<size_t>(o * c.in + i)]));
      }
      const size_t k = static_cast<size_t>(t * c.out + o);
      const double tol = 5e-4 * abs_sum + 1e-6;
      if (std::fabs(static_cast<double>(y[k]) - y_ref[k]) > tol && ++failures <= 10) {
        ADD_FAILURE() << "t=" << t << " o=" << o << " gpu=" << y[k] << " cpu=" << y_ref[k]
                      << " tol=" << tol;
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMatMulBf16Test, testing::ValuesIn(Cases()), CaseName);

// Argument checks run before any CUDA call, so they need no device.
TEST(CudaMatMulBf16ArgsTest, RejectsBadSizes) {
  CublasHandle empty;
  float y = 0;
  const uint16_t w = 0;
  const float x = 0;
  EXPECT_EQ(MatMulBf16(empty, &w, -1, 1, &x, 1, &y).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMulBf16(empty, &w, 1, int64_t{1} << 40, &x, 1, &y).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMulBf16(empty, nullptr, 1, 1, &x, 1, &y).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MatMulBf16(empty, &w, 1, 1, &x, 0, &y).ok());  // no tokens: no-op
  EXPECT_EQ(MatMulBf16(empty, &w, 1, 1, &x, 1, &y).code(),
            absl::StatusCode::kFailedPrecondition);  // no handle
}

TEST(CudaMatMulBf16ArgsTest, CublasStatusNames) {
  EXPECT_TRUE(CublasStatusToStatus(0, "x").ok());
  const absl::Status s = CublasStatusToStatus(7 /* CUBLAS_STATUS_INVALID_VALUE */, "gemm");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << s;
}

}  // namespace
}  // namespace estuary::cuda
