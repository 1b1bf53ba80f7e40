#include "core/quant/int4_matmul.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/quant/int4_matrix.h"
#include "core/quant/quant_test_util.h"
#include "hwy/targets.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

using quant_test::RandomWeights;

// Relative tolerance against Σ_i |x_i · ŵ_i| for f32 accumulation over up to 8192 terms.
constexpr double kTolerance = 2e-5;

// The Highway path rounds x to int16 per (token, group): x_i = x16_i · e_g + δ_i with
// |δ_i| <= e_g / 2, e_g = max_{i∈g} |x_i| / 32767; the VNNI and AVX2 paths to int8
// (e_g = max / 127). The extra error is at most Σ_g |s_g| e_g / 2 · Σ_{i∈g} q_i.
double Int16Bound(const Int4Matrix& w, const float* x, int64_t row) {
  const std::string path = Int4MatMulTargetName();
  const double levels = path == "AVX512_VNNI" || path == "AVX2_INT8" ? 127.0 : 32767.0;
  double bound = 0;
  for (int64_t g = 0; g < w.n_groups(); ++g) {
    double max_abs = 0, codes = 0;
    for (int64_t c = g * w.group_size(); c < std::min(w.cols(), (g + 1) * w.group_size()); ++c) {
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(x[c])));
      codes += w.Code(row, c);
    }
    bound += std::fabs(w.Scale(row, g)) * max_abs / levels / 2.0 * codes;
  }
  return bound;
}

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
    const int64_t row = static_cast<int64_t>(i % static_cast<size_t>(w.rows()));
    const int64_t token = static_cast<int64_t>(i / static_cast<size_t>(w.rows()));
    const double int16 = Int16Bound(w, x.data() + token * w.cols(), row);
    ASSERT_NEAR(y[i], ref[i], kTolerance * mag[i] + 1.0001 * int16 + 1e-30)
        << label << " token " << i / static_cast<size_t>(w.rows()) << " row "
        << i % static_cast<size_t>(w.rows());
  }
  // Each token alone (the GEMV) gives the same bits as in the batch.
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<float> one(static_cast<size_t>(w.rows()), NAN);
    Int4MatMul(w, x.data() + t * w.cols(), 1, one.data());
    ASSERT_EQ(std::memcmp(one.data(), y.data() + t * w.rows(), one.size() * sizeof(float)), 0)
        << label << " token " << t << " alone";
  }
  // The threaded variant gives the same bits.
  for (int threads : {2, 3}) {
    WorkerPool pool(threads);
    std::vector<float> yt(ref.size(), NAN);
    Int4MatMul(w, x.data(), n_tokens, yt.data(), pool);
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
  for (int g : {32, 64, 128, 256, 512, 1024}) {
    for (int64_t cols : {100, 172, 640, 2048, 2100, 4096, 9000}) {
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

// Every SIMD target compiled in and supported here (AVX-512, AVX2, SSE4, ... down to the
// portable fallback), through the same reference check.
TEST(Int4MatMulGroupTest, EverySupportedTarget) {
  std::vector<Int4Matrix> matrices;
  for (const auto& [rows, cols, g] : {std::make_tuple(9, 172, 64), std::make_tuple(13, 4500, 32),
                                      std::make_tuple(5, 300, 256)}) {
    Int4QuantOptions o;
    o.group_size = g;
    auto w = Int4Matrix::Quantize(RandomWeights(rows, cols, static_cast<uint32_t>(cols)), o);
    ASSERT_TRUE(w.ok()) << w.status();
    matrices.push_back(std::move(*w));
  }
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  EXPECT_FALSE(targets.empty());
  SetInt4MatMulPath(Int4Path::kHighway);  // the Highway targets; the VNNI path is checked below
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = Int4MatMulTargetName();
    EXPECT_EQ(name, hwy::TargetName(target));
    std::printf("checking target %s\n", name.c_str());
    for (const Int4Matrix& w : matrices) {
      for (int64_t n : {1, 2, 5}) {
        CheckAgainstReference(w, n, static_cast<uint32_t>(n),
                              absl::StrCat(name, " ", w.rows(), "x", w.cols(), " g",
                                           w.group_size(), " n ", n));
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  // The int8 paths this CPU has, each forced in turn.
  const struct {
    Int4Path path;
    const char* name;
    bool available;
  } int8_paths[] = {{Int4Path::kVnni, "AVX512_VNNI", Int4VnniAvailable()},
                    {Int4Path::kAvx2, "AVX2_INT8", Int4Avx2Available()}};
  for (const auto& p : int8_paths) {
    if (!p.available) {
      std::printf("this CPU cannot run %s: not checked\n", p.name);
      continue;
    }
    SetInt4MatMulPath(p.path);
    EXPECT_EQ(std::string(Int4MatMulTargetName()), p.name);
    for (const Int4Matrix& w : matrices) {
      for (int64_t n : {1, 2, 5, 9}) {
        CheckAgainstReference(w, n, static_cast<uint32_t>(n),
                              absl::StrCat(p.name, " ", w.rows(), "x", w.cols(), " g",
                                           w.group_size(), " n ", n));
      }
    }
  }
  SetInt4MatMulPath(Int4Path::kAuto);
}

// Every group size through the Highway path too (the default path is VNNI where available).
TEST(Int4MatMulGroupTest, HighwayPathEveryGroupSize) {
  SetInt4MatMulPath(Int4Path::kHighway);
  for (int g : {32, 64, 128, 256, 512, 1024}) {
    Int4QuantOptions o;
    o.group_size = g;
    auto w = Int4Matrix::Quantize(RandomWeights(11, 2200, static_cast<uint32_t>(g)), o);
    ASSERT_TRUE(w.ok()) << w.status();
    for (int64_t n : {1, 6}) CheckAgainstReference(*w, n, 7, absl::StrCat("highway g", g));
  }
  SetInt4MatMulPath(Int4Path::kAuto);
}

// Many short calls with changing thread counts: the pool must neither lose a wake-up nor run a
// part twice.
TEST(Int4MatMulGroupTest, ThreadPoolStress) {
  auto w = Int4Matrix::Quantize(RandomWeights(64, 256, 21), Int4QuantOptions());
  ASSERT_TRUE(w.ok());
  const std::vector<float> x = RandomActivations(2 * 256, 5);
  std::vector<float> expected(2 * 64);
  Int4MatMul(*w, x.data(), 2, expected.data());
  std::mt19937 rng(3);
  std::vector<std::unique_ptr<WorkerPool>> pools;
  for (int threads = 1; threads <= 4; ++threads) pools.push_back(std::make_unique<WorkerPool>(threads));
  for (int i = 0; i < 3000; ++i) {
    const int threads = 1 + static_cast<int>(rng() % 4);
    std::vector<float> y(expected.size(), NAN);
    Int4MatMul(*w, x.data(), 2, y.data(), *pools[static_cast<size_t>(threads - 1)]);
    ASSERT_EQ(std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)), 0)
        << "call " << i << " threads " << threads;
    if (i % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers block
  }
}

TEST(Int4MatMulGroupTest, NonFiniteActivationsPropagate) {
  auto w = Int4Matrix::Quantize(RandomWeights(8, 300, 4), Int4QuantOptions());
  ASSERT_TRUE(w.ok());
  for (float bad : {NAN, INFINITY}) {
    for (int64_t n : {1, 3}) {
      std::vector<float> x = RandomActivations(n * 300, 6);
      x[static_cast<size_t>((n - 1) * 300 + 150)] = bad;  // the last token
      std::vector<float> y(static_cast<size_t>(n * 8));
      Int4MatMul(*w, x.data(), n, y.data());
      for (int64_t o = 0; o < 8; ++o) {
        EXPECT_FALSE(std::isfinite(y[static_cast<size_t>((n - 1) * 8 + o)])) << bad << " n " << n;
        if (n > 1) {
          EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(o)]));
        }
      }
    }
  }
}

// Int4Layout::kGroupLanes (the int8 kernels' group-per-lane order) holds exactly the codes,
// scales and offsets of kBlocks, and each int8 path's kernel for it (VNNI, AVX2: every one this
// CPU has) meets the same reference bound, bitwise the same alone, in a batch and on any thread
// count (CheckAgainstReference).
TEST(Int4LayoutTest, GroupLanesHoldTheSameCodesAndMeetTheReference) {
  std::vector<Int4Path> paths;
  if (Int4VnniAvailable()) paths.push_back(Int4Path::kVnni);
  if (Int4Avx2Available()) paths.push_back(Int4Path::kAvx2);
  if (paths.empty()) GTEST_SKIP() << "no AVX512-VNNI or AVX2 here: kGroupLanes needs an int8 path";
  for (const auto& [rows, cols, g] :
       {std::make_tuple(9, 2048, 64), std::make_tuple(5, 4096, 32), std::make_tuple(3, 5120, 64),
        std::make_tuple(4, 8192, 128), std::make_tuple(2, 4096, 256)}) {
    const std::string label = absl::StrCat(rows, "x", cols, " g", g);
    const Tensor weight = RandomWeights(rows, cols, static_cast<uint32_t>(cols + g));
    Int4QuantOptions o;
    o.group_size = g;
    o.layout = Int4Layout::kBlocks;
    auto blocks = Int4Matrix::Quantize(weight, o);
    o.layout = Int4Layout::kGroupLanes;
    auto lanes = Int4Matrix::Quantize(weight, o);
    ASSERT_TRUE(blocks.ok() && lanes.ok()) << label << blocks.status() << lanes.status();
    EXPECT_EQ(blocks->layout(), Int4Layout::kBlocks);
    ASSERT_EQ(lanes->layout(), Int4Layout::kGroupLanes);
    EXPECT_EQ(lanes->bytes(), blocks->bytes()) << label;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(lanes->Code(r, c), blocks->Code(r, c)) << label << " r " << r << " c " << c;
      }
      for (int64_t gi = 0; gi < lanes->n_groups(); ++gi) {
        ASSERT_EQ(lanes->Scale(r, gi), blocks->Scale(r, gi)) << label;
        ASSERT_EQ(lanes->Offset(r, gi), blocks->Offset(r, gi)) << label;
      }
    }
    for (Int4Path path : paths) {
      SetInt4MatMulPath(path);
      const std::string kernel = Int4MatMulTargetName();
      for (int64_t n : {1, 2, 4, 5, 16}) {
        CheckAgainstReference(*lanes, n, static_cast<uint32_t>(n + cols),
                              absl::StrCat(kernel, " ", label, " n ", n));
      }
    }
    SetInt4MatMulPath(Int4Path::kAuto);
  }
}

TEST(Int4LayoutTest, WhichShapesFitAndWhoChooses) {
  EXPECT_TRUE(Int4Matrix::GroupLanesFit(2048, 64));
  EXPECT_TRUE(Int4Matrix::GroupLanesFit(8192, 64));
  EXPECT_TRUE(Int4Matrix::GroupLanesFit(5120, 64));   // 4096 + 1024: 64 and 16 groups
  EXPECT_FALSE(Int4Matrix::GroupLanesFit(172, 64));   // a short last group
  EXPECT_FALSE(Int4Matrix::GroupLanesFit(4100, 64));  // 4 columns past the first panel
  EXPECT_FALSE(Int4Matrix::GroupLanesFit(128, 64));   // 2 groups: no whole superblock
  EXPECT_FALSE(Int4Matrix::GroupLanesFit(4096, 512)); // 8 groups a panel
  Int4QuantOptions o;
  o.layout = Int4Layout::kGroupLanes;
  auto unfit = Int4Matrix::Quantize(RandomWeights(4, 172, 1), o);
  if (Int4VnniAvailable() || Int4Avx2Available()) {
    EXPECT_EQ(unfit.status().code(), absl::StatusCode::kInvalidArgument) << unfit.status();
  } else {
    EXPECT_EQ(unfit.status().code(), absl::StatusCode::kFailedPrecondition) << unfit.status();
  }
  // kAuto: group lanes only where Int4MatMul would run an int8 kernel on the matrix anyway.
  o.layout = Int4Layout::kAuto;
  auto automatic = Int4Matrix::Quantize(RandomWeights(4, 2048, 2), o);
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->layout(),
            Int4MatMulUsesInt8() ? Int4Layout::kGroupLanes : Int4Layout::kBlocks);
  SetInt4MatMulPath(Int4Path::kHighway);
  auto highway = Int4Matrix::Quantize(RandomWeights(4, 2048, 2), o);
  SetInt4MatMulPath(Int4Path::kAuto);
  ASSERT_TRUE(highway.ok());
  EXPECT_EQ(highway->layout(), Int4Layout::kBlocks);
}

TEST(Int4MatMulGroupTest, TargetName) {
  const std::string name = Int4MatMulTargetName();
  EXPECT_FALSE(name.empty());
  std::printf("Int4MatMul target: %s\n", name.c_str());
}

}  // namespace
}  // namespace estuary
