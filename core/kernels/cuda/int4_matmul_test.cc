// Tests of the GPU int4 W4A16 product. The packing tests run on the CPU; the kernel tests
// (CTest label `gpu`) skip without a device and compare against Σ_i x_i · Int4Matrix::Dequantize
// in double, within |y - y_ref| <= 2e-5 · Σ_i |x_i| (|s| q_i + |m|) + 1e-6 (int4_matmul.h).
#include "core/kernels/cuda/int4_matmul.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kernels/cuda/matmul_test_util.h"
#include "core/quant/int4_matrix.h"
#include "core/tensor/half_float.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"

namespace estuary::cuda {
namespace {

using matmul_test::DeviceArray;
using matmul_test::HasCudaDevice;

Tensor RandomWeight(int64_t rows, int64_t cols, uint32_t seed, DType dtype = DType::kF32) {
  absl::StatusOr<Tensor> t = Tensor::Zeros(dtype, {rows, cols});
  EXPECT_TRUE(t.ok());
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = normal(rng);
    if (dtype == DType::kF32) {
      t->mutable_data<float>()[i] = v;
    } else {
      t->mutable_data<uint16_t>()[i] = F32ToBf16(v);
    }
  }
  return *t;
}

// q of (r, c) read back from the GPU layout (int4_matmul.h).
int GpuCode(const Int4GpuHost& h, int64_t r, int64_t c) {
  const uint8_t* row = h.nibbles.data() + r * h.cols / 2;
  const int64_t byte = (c / 32) * 16 + ((c % 32) / 8) * 4 + (c % 8) / 2;
  return (row[byte] >> (4 * (c % 2))) & 15;
}
float GpuScale(const Int4GpuHost& h, int64_t r, int64_t g) {
  return F16ToF32(h.scales[static_cast<size_t>(r * h.n_groups + g)]) * h.multiplier;
}
float GpuOffset(const Int4GpuHost& h, int64_t r, int64_t g) {
  return F16ToF32(h.offsets[static_cast<size_t>(r * h.n_groups + g)]) * h.multiplier;
}

void ExpectSameQuantization(const Int4Matrix& m, const Int4GpuHost& h) {
  ASSERT_EQ(h.rows, m.rows());
  ASSERT_EQ(h.cols, m.cols());
  ASSERT_EQ(h.group_size, m.group_size());
  ASSERT_EQ(h.n_groups, m.n_groups());
  for (int64_t r = 0; r < m.rows(); ++r) {
    for (int64_t g = 0; g < m.n_groups(); ++g) {
      ASSERT_EQ(GpuScale(h, r, g), m.Scale(r, g)) << r << " " << g;
      ASSERT_EQ(GpuOffset(h, r, g), m.Offset(r, g)) << r << " " << g;
    }
    for (int64_t c = 0; c < m.cols(); ++c) ASSERT_EQ(GpuCode(h, r, c), m.Code(r, c)) << r << " " << c;
  }
}

// --- Packing (CPU only) ---

TEST(Int4GpuPackTest, RepacksRtnAndRefinedMatricesExactly) {
  for (int group : {32, 64, 128}) {
    for (bool refine : {false, true}) {
      const Tensor w = RandomWeight(9, 352, 7u + static_cast<uint32_t>(group));  // 352 = 2·128+96
      Int4QuantOptions options;
      options.group_size = group;
      options.refine = refine;
      options.threads = 1;
      absl::StatusOr<Int4Matrix> m = Int4Matrix::Quantize(w, options);
      ASSERT_TRUE(m.ok()) << m.status();
      absl::StatusOr<Int4GpuHost> h = PackInt4ForGpu(*m);
      ASSERT_TRUE(h.ok()) << h.status();
      ExpectSameQuantization(*m, *h);
    }
  }
}

TEST(Int4GpuPackTest, DenseRtnEqualsInt4MatrixRtn) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Tensor w = RandomWeight(5, 256, 3u, dtype);
    absl::StatusOr<Int4GpuHost> h = QuantizeInt4ForGpu(w, 64, 1);
    ASSERT_TRUE(h.ok()) << h.status();
    Int4QuantOptions options;
    options.group_size = 64;
    options.refine = false;
    options.threads = 1;
    absl::StatusOr<Int4Matrix> m = Int4Matrix::Quantize(w, options);
    ASSERT_TRUE(m.ok()) << m.status();
    ExpectSameQuantization(*m, *h);
  }
}

TEST(Int4GpuPackTest, RejectsColumnsNotMultipleOf32) {
  const Tensor w = RandomWeight(2, 72, 1u);
  EXPECT_EQ(QuantizeInt4ForGpu(w, 64, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackInt4ForGpu(Int4Matrix()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Int4GpuPackTest, MatMulRejectsBadArguments) {
  Int4GpuView v = matmul_test::Int4ViewOfShape(4, 72, 64);  // cols not a multiple of 32
  float x[8] = {};
  float y[4] = {};
  EXPECT_EQ(Int4MatMul(v, x, 1, y, nullptr).code(), absl::StatusCode::kInvalidArgument);
  v = matmul_test::Int4ViewOfShape(4, 64, 64);
  EXPECT_EQ(Int4MatMul(v, x, 1, y, nullptr).code(), absl::StatusCode::kInvalidArgument);  // null
  EXPECT_EQ(Int4MatMul(v, x, -1, y, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Int4MatMul(v, x, 0, y, nullptr).ok());
}

// --- Kernel (GPU) ---

struct Int4Case {
  int64_t rows = 0;
  int64_t cols = 0;
  int group = 64;
  int64_t n_tokens = 1;
  bool x_bf16 = false;
};

std::string CaseName(const testing::TestParamInfo<Int4Case>& info) {
  const Int4Case& c = info.param;
  return absl::StrCat(c.rows, "x", c.cols, "_g", c.group, "_n", c.n_tokens,
                      c.x_bf16 ? "_xbf16" : "_xf32");
}

// Cases of one (rows, cols, group) are adjacent so that the test's one-entry cache of the
// quantized matrix serves them all.
std::vector<Int4Case> Cases() {
  std::vector<Int4Case> cases;
  const std::tuple<int64_t, int64_t, int> tiny[] = {
      {5, 64, 64}, {3, 160, 64}, {7, 96, 128}, {33, 256, 128}, {17, 384, 64}};
  for (auto [rows, cols, group] : tiny) {
    for (bool bf16 : {false, true}) {
      for (int64_t n : {1, 2, 3, 5, 8, 9, 32, 64}) cases.push_back({rows, cols, group, n, bf16});
    }
  }
  // Llama-3.2-1B: q/o proj, k/v proj, gate/up, down.
  const std::pair<int64_t, int64_t> llama[] = {{2048, 2048}, {512, 2048}, {8192, 2048},
                                               {2048, 8192}};
  for (auto [rows, cols] : llama) {
    for (int group : {64, 128}) {
      for (bool bf16 : {false, true}) {
        for (int64_t n : {1, 8, 32}) cases.push_back({rows, cols, group, n, bf16});
      }
    }
  }
  return cases;
}

struct Quantized {
  int64_t rows = -1;
  int64_t cols = -1;
  int group = -1;
  Int4GpuHost host;
  std::vector<float> w_hat;  // Dequantize, [rows][cols]
  std::vector<float> w_abs;  // |s| q + |m|, [rows][cols]
};

const Quantized& GetQuantized(int64_t rows, int64_t cols, int group) {
  static Quantized* cache = new Quantized;
  if (cache->rows == rows && cache->cols == cols && cache->group == group) return *cache;
  *cache = Quantized{};
  absl::StatusOr<matmul_test::QuantizedInt4> q = matmul_test::QuantizeInt4(
      RandomWeight(rows, cols, static_cast<uint32_t>(rows * 3 + cols + group)), group);
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return *cache;
  cache->host = std::move(q->host);
  cache->w_hat = std::move(q->dequantized);
  cache->w_abs.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = c / group;
      cache->w_abs[static_cast<size_t>(r * cols + c)] =
          std::fabs(GpuScale(cache->host, r, g)) * static_cast<float>(GpuCode(cache->host, r, c)) +
          std::fabs(GpuOffset(cache->host, r, g));
    }
  }
  cache->rows = rows;
  cache->cols = cols;
  cache->group = group;
  return *cache;
}

class CudaInt4MatMulTest : public testing::TestWithParam<Int4Case> {};

TEST_P(CudaInt4MatMulTest, MatchesDequantizedProduct) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const Int4Case c = GetParam();
  const Quantized& q = GetQuantized(c.rows, c.cols, c.group);

  std::mt19937 rng(static_cast<uint32_t>(c.n_tokens * 101 + c.rows));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.n_tokens * c.cols));
  std::vector<uint16_t> x_bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = uniform(rng);
    x_bits[i] = F32ToBf16(x[i]);
    if (c.x_bf16) x[i] = Bf16ToF32(x_bits[i]);  // the reference uses what the GPU reads
  }

  absl::StatusOr<Int4GpuMatrix> w = Int4GpuMatrix::Upload(q.host);
  ASSERT_TRUE(w.ok()) << w.status();
  DeviceArray<float> d_y(static_cast<size_t>(c.n_tokens * c.rows));
  if (c.x_bf16) {
    DeviceArray<uint16_t> d_x(x_bits);
    ASSERT_TRUE(Int4MatMul(w->view(), d_x.get(), c.n_tokens, d_y.get(), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    DeviceArray<float> d_x(x);
    ASSERT_TRUE(Int4MatMul(w->view(), d_x.get(), c.n_tokens, d_y.get(), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const std::vector<float> y = d_y.Download();

  int failures = 0;
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    const float* xt = x.data() + t * c.cols;
    for (int64_t o = 0; o < c.rows; ++o) {
      double ref = 0;
      double bound = 0;
      for (int64_t i = 0; i < c.cols; ++i) {
        const size_t k = static_cast<size_t>(o * c.cols + i);
        ref += static_cast<double>(xt[i]) * q.w_hat[k];
        bound += std::fabs(static_cast<double>(xt[i])) * q.w_abs[k];
      }
      const double tol = 2e-5 * bound + 1e-6;
      const float got = y[static_cast<size_t>(t * c.rows + o)];
      if (std::fabs(got - ref) > tol && ++failures <= 10) {
        ADD_FAILURE() << "t=" << t << " o=" << o << " gpu=" << got << " ref=" << ref
                      << " tol=" << tol;
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaInt4MatMulTest, testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace estuary::cuda
