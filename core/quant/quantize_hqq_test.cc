// HQQ-style refinement against plain round-to-nearest.

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/quant/int4_matrix.h"
#include "core/quant/quant_test_util.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"

namespace estuary {
namespace {

using quant_test::RandomWeights;

struct Errors {
  double sq = 0;  // Σ (w - ŵ)²
  double lp = 0;  // Σ |w - ŵ|^0.7 (HQQ's objective)
  std::vector<double> sq_per_group;
};

Errors Measure(const Tensor& w, const Int4Matrix& q) {
  Errors e;
  const int64_t rows = q.rows(), cols = q.cols(), g = q.group_size();
  e.sq_per_group.assign(static_cast<size_t>(rows * q.n_groups()), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double d = static_cast<double>(w.data<float>()[r * cols + c]) - q.Dequantize(r, c);
      e.sq += d * d;
      e.lp += std::pow(std::fabs(d), 0.7);
      e.sq_per_group[static_cast<size_t>(r * q.n_groups() + c / g)] += d * d;
    }
  }
  return e;
}

struct Case {
  int64_t rows, cols;
  int group;
  double outlier_rate;
};

class RefineTest : public ::testing::TestWithParam<Case> {};

TEST_P(RefineTest, LowersErrorAgainstRoundToNearest) {
  const Case c = GetParam();
  const Tensor w = RandomWeights(c.rows, c.cols, 42, 0.02f, c.outlier_rate);
  Int4QuantOptions rtn_options;
  rtn_options.group_size = c.group;
  rtn_options.refine = false;
  Int4QuantOptions hqq_options = rtn_options;
  hqq_options.refine = true;
  Int4QuantStats rtn_stats, hqq_stats;
  auto rtn = Int4Matrix::Quantize(w, rtn_options, &rtn_stats);
  auto hqq = Int4Matrix::Quantize(w, hqq_options, &hqq_stats);
  ASSERT_TRUE(rtn.ok() && hqq.ok());
  const Errors a = Measure(w, *rtn);
  const Errors b = Measure(w, *hqq);

  // The stats agree with the matrices.
  EXPECT_NEAR(rtn_stats.sq_error, a.sq, 1e-6 * a.sq);
  EXPECT_NEAR(hqq_stats.sq_error, b.sq, 1e-6 * b.sq);
  EXPECT_NEAR(hqq_stats.rtn_sq_error, a.sq, 1e-6 * a.sq);
  EXPECT_EQ(rtn_stats.refined_groups, 0);
  EXPECT_EQ(hqq_stats.groups, c.rows * rtn->n_groups());

  std::printf("%lldx%lld g%d outliers %.3f: squared error %.4f of RTN, lp(0.7) %.4f of RTN, "
              "%lld of %lld groups refined, %.3f s\n",
              static_cast<long long>(c.rows), static_cast<long long>(c.cols), c.group,
              c.outlier_rate, b.sq / a.sq, b.lp / a.lp,
              static_cast<long long>(hqq_stats.refined_groups),
              static_cast<long long>(hqq_stats.groups), hqq_stats.seconds);
  // A strict improvement on average, in both norms.
  EXPECT_LT(b.sq, 0.95 * a.sq);
  EXPECT_LT(b.lp, a.lp);
  // The safeguard: no group is worse than under RTN.
  for (size_t i = 0; i < a.sq_per_group.size(); ++i) {
    ASSERT_LE(b.sq_per_group[i], a.sq_per_group[i] * (1 + 1e-6) + 1e-30) << "group " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RefineTest,
                         ::testing::Values(Case{256, 1024, 64, 0.01}, Case{256, 1024, 64, 0.0},
                                           Case{128, 1024, 128, 0.01}, Case{128, 1024, 32, 0.01},
                                           Case{256, 172, 64, 0.01}, Case{64, 2048, 256, 0.01}));

TEST(RefineTest, EverySupportedTarget) {
  const Tensor w = RandomWeights(32, 300, 8, 0.02f, 0.01);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    Int4QuantStats stats;
    auto q = Int4Matrix::Quantize(w, Int4QuantOptions(), &stats);
    ASSERT_TRUE(q.ok());
    EXPECT_LT(stats.sq_error, 0.9 * stats.rtn_sq_error) << hwy::TargetName(target);
    EXPECT_NEAR(Measure(w, *q).sq, stats.sq_error, 1e-6 * stats.sq_error);
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(RefineTest, ZeroIterationsStillRefines) {
  const Tensor w = RandomWeights(64, 512, 5, 0.02f, 0.01);
  Int4QuantOptions o;
  o.refine_iterations = 0;
  Int4QuantStats stats;
  auto q = Int4Matrix::Quantize(w, o, &stats);
  ASSERT_TRUE(q.ok());
  EXPECT_LT(stats.sq_error, 0.95 * stats.rtn_sq_error);
}

}  // namespace
}  // namespace estuary
