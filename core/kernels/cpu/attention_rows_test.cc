// AttentionRows (attention_rows.h): close to a double-precision reference, and a row's result
// the same bits however many rows a call covers (decode calls them one page tail at a time,
// prefill a page at a time).
#include "core/kernels/cpu/attention_rows.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/random_data.h"

namespace estuary::kernels::cpu {
namespace {

using ::estuary::testing::RandomVector;

// Every head size works: multiples of 16 take the AVX-512 loops where the CPU has them, the
// others (8, 40) the portable ones.
class AttentionRowsTest : public ::testing::TestWithParam<int> {};

TEST_P(AttentionRowsTest, ScoresMatchTheReferenceAndDoNotDependOnTheRowCount) {
  const int head_dim = GetParam();
  constexpr int kRows = 13;  // three groups of four and a tail of one
  constexpr float kScale = 0.125f;
  const std::vector<float> q = RandomVector(head_dim, 1, -2, 2);
  const std::vector<float> k = RandomVector(int64_t{kRows} * head_dim, 2, -2, 2);
  std::vector<float> all(kRows, NAN);
  ScoreRows(q.data(), k.data(), kRows, head_dim, kScale, all.data());
  for (int p = 0; p < kRows; ++p) {
    double want = 0.0, magnitude = 0.0;
    for (int i = 0; i < head_dim; ++i) {
      want += double{q[i]} * k[p * head_dim + i];
      magnitude += std::abs(double{q[i]} * k[p * head_dim + i]);
    }
    EXPECT_NEAR(all[p], kScale * want, kScale * magnitude * 1e-6) << "row " << p;
    // The same row alone, and as each position of a shorter call.
    for (int first = std::max(0, p - 3); first <= p; ++first) {
      std::vector<float> part(kRows, NAN);
      ScoreRows(q.data(), k.data() + first * head_dim, p - first + 1, head_dim, kScale,
                part.data());
      EXPECT_EQ(part[p - first], all[p]) << "row " << p << " in a call from row " << first;
    }
  }
}

TEST_P(AttentionRowsTest, WeightedRowsMatchTheReferenceAndRowByRowCalls) {
  const int head_dim = GetParam();
  constexpr int kRows = 7;
  const std::vector<float> weights = RandomVector(kRows, 3, 0, 1);
  const std::vector<float> v = RandomVector(int64_t{kRows} * head_dim, 4);
  const std::vector<float> start = RandomVector(head_dim, 5);
  std::vector<float> together = start, one_by_one = start;
  AccumulateRows(weights.data(), v.data(), kRows, head_dim, together.data());
  for (int p = 0; p < kRows; ++p) {
    AccumulateRows(weights.data() + p, v.data() + p * head_dim, 1, head_dim, one_by_one.data());
  }
  for (int i = 0; i < head_dim; ++i) {
    double want = start[i];
    for (int p = 0; p < kRows; ++p) want += double{weights[p]} * v[p * head_dim + i];
    EXPECT_NEAR(together[i], want, 1e-5) << i;
    EXPECT_EQ(together[i], one_by_one[i]) << i;
  }
}

TEST(AttentionRowsVectorizedTest, OnlyMultiplesOf16UpTo256AreVectorized) {
  EXPECT_FALSE(AttentionRowsVectorized(8));
  EXPECT_FALSE(AttentionRowsVectorized(0));
  EXPECT_FALSE(AttentionRowsVectorized(40));
  EXPECT_FALSE(AttentionRowsVectorized(272));
  EXPECT_EQ(AttentionRowsVectorized(64), __builtin_cpu_supports("avx512f") != 0);
}

INSTANTIATE_TEST_SUITE_P(HeadSizes, AttentionRowsTest,
                         ::testing::Values(8, 16, 40, 48, 64, 128, 256));

}  // namespace
}  // namespace estuary::kernels::cpu
