#include "core/kvcache/paged_attention.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "core/kernels/cpu/kernels.h"
#include "core/kvcache/sequence_kv.h"
#include "gtest/gtest.h"
#include "tests/testing/random_data.h"

namespace estuary {
namespace {

using ::estuary::testing::RandomVector;

// (n_heads, n_kv_heads, head_dim, start_pos, n_queries)
class PagedAttentionTest : public ::testing::TestWithParam<std::tuple<int, int, int, int, int>> {};

TEST_P(PagedAttentionTest, MatchesContiguousCausalAttention) {
  const auto& [n_heads, n_kv_heads, head_dim, start_pos, n_queries] = GetParam();
  constexpr int kBlock = 16;
  constexpr int kLayer = 1;  // the middle of three layers: the others hold garbage
  const KvLayout layout{
      .n_layers = 3, .n_kv_heads = n_kv_heads, .head_dim = head_dim, .block_size = kBlock};
  absl::StatusOr<std::unique_ptr<KvPool>> pool_or =
      KvPool::Create(layout, 40 * layout.page_bytes());
  ASSERT_TRUE(pool_or.ok()) << pool_or.status();
  KvPool& pool = **pool_or;

  const int n_pos = start_pos + n_queries;
  const int64_t kv_stride = int64_t{n_kv_heads} * head_dim;
  const int64_t q_stride = int64_t{n_heads} * head_dim;

  // Interleave the growth of two sequences so the page table is not 0, 1, 2, ...
  SequenceKv seq(&pool), other(&pool);
  for (int cap = kBlock; cap < n_pos + kBlock; cap += kBlock) {
    ASSERT_TRUE(other.Reserve(cap).ok());
    ASSERT_TRUE(seq.Reserve(cap).ok());
  }

  const std::vector<float> k = RandomVector(static_cast<size_t>(n_pos * kv_stride), 52, -2, 2);
  const std::vector<float> v = RandomVector(static_cast<size_t>(n_pos * kv_stride), 53);
  const std::vector<float> q = RandomVector(static_cast<size_t>(n_queries * q_stride), 51, -2, 2);
  const std::vector<float> garbage(static_cast<size_t>(kv_stride), 1e30f);
  const std::vector<float> nan(static_cast<size_t>(kv_stride), NAN);
  for (int pos = 0; pos < seq.capacity(); ++pos) {
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      if (layer == kLayer && pos < n_pos) {
        seq.WriteKv(layer, pos, k.data() + pos * kv_stride, v.data() + pos * kv_stride);
      } else {
        // Other layers and positions past the end: causality and layer offsets must skip them.
        seq.WriteKv(layer, pos, garbage.data(), nan.data());
      }
    }
    if (pos < other.capacity()) {
      for (int layer = 0; layer < layout.n_layers; ++layer) {
        other.WriteKv(layer, pos, garbage.data(), nan.data());
      }
    }
  }
  seq.set_length(n_pos);

  std::vector<float> want(static_cast<size_t>(n_queries * q_stride), NAN);
  kernels::cpu::CausalAttention(q.data(), n_queries, start_pos, k.data(), v.data(), n_heads,
                                n_kv_heads, head_dim, want.data());
  std::vector<float> got(want.size(), NAN);
  PagedAttention(q.data(), n_queries, start_pos, pool, seq.pages(), kLayer, n_heads, got.data());
  // The paged path fuses its products (FMA, attention_rows.h where the CPU has AVX-512) and sums
  // in another order than the reference, so an output whose terms cancel to near zero differs by
  // a few ulps of the V values (|v| <= 1 here), not of itself.
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(want[i])) << i;
    ASSERT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]) + 1e-6) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest,
                         ::testing::Combine(::testing::Values(8), ::testing::Values(4, 8, 1),
                                            ::testing::Values(16, 64),
                                            ::testing::Values(0, 5, 16, 37, 70, 130),
                                            ::testing::Values(1, 7)));

INSTANTIATE_TEST_SUITE_P(OddShapes, PagedAttentionTest,
                         ::testing::Values(std::make_tuple(6, 2, 12, 3, 20),
                                           std::make_tuple(4, 4, 3, 15, 2),
                                           std::make_tuple(8, 2, 128, 40, 33)));

// A prefix adopted from another sequence's pages gives the same attention as the writer's own.
TEST(PagedAttentionPrefixTest, SharedPagesReadTheSameAsOwnPages) {
  const KvLayout layout{.n_layers = 1, .n_kv_heads = 2, .head_dim = 16, .block_size = 16};
  std::unique_ptr<KvPool> pool = KvPool::Create(layout, 8 * layout.page_bytes()).value();
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[static_cast<size_t>(i)] = i * 3;
  const int64_t kv_stride = 2 * 16;
  const std::vector<float> k = RandomVector(40 * kv_stride, 7), v = RandomVector(40 * kv_stride, 8);

  SequenceKv a(pool.get());
  ASSERT_TRUE(a.Reserve(40).ok());
  for (int pos = 0; pos < 40; ++pos) {
    a.WriteKv(0, pos, k.data() + pos * kv_stride, v.data() + pos * kv_stride);
  }
  a.set_length(40);
  a.RegisterFullPages(prompt);

  SequenceKv b(pool.get());
  ASSERT_TRUE(b.AdoptPrefix(prompt).ok());
  ASSERT_EQ(b.cached_tokens(), 32);
  ASSERT_TRUE(b.Reserve(40).ok());
  for (int pos = 32; pos < 40; ++pos) {
    b.WriteKv(0, pos, k.data() + pos * kv_stride, v.data() + pos * kv_stride);
  }
  b.set_length(40);

  const std::vector<float> q = RandomVector(8 * 4 * 16, 9);
  std::vector<float> out_a(q.size()), out_b(q.size());
  PagedAttention(q.data(), 8, 32, *pool, a.pages(), 0, 4, out_a.data());
  PagedAttention(q.data(), 8, 32, *pool, b.pages(), 0, 4, out_b.data());
  EXPECT_EQ(out_a, out_b);
}

// The rank's pool splits the (query, KV head) pairs of a call; each pair's arithmetic is the same
// on any thread, so the output must be bitwise the serial one (EXPECT_EQ). A long prefill chunk
// (500 queries) on 3 threads, and a batch-1 decode step (one query, 8 KV heads, 1B-class heads
// of 64, ~1.2M multiply-adds: enough to split) on 2.
TEST(PagedAttentionThreadsTest, ThePoolDoesNotChangeTheOutput) {
  struct Case {
    int n_kv_heads, n_heads, head_dim, tokens, n_queries, threads;
  };
  for (const Case c : {Case{2, 4, 16, 600, 500, 3}, Case{8, 32, 64, 301, 1, 2}}) {
    const KvLayout layout{
        .n_layers = 1, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block_size = 16};
    std::unique_ptr<KvPool> pool =
        KvPool::Create(layout, (c.tokens / 16 + 2) * layout.page_bytes()).value();
    const int64_t kv_stride = int64_t{c.n_kv_heads} * c.head_dim;
    const std::vector<float> k = RandomVector(c.tokens * kv_stride, 11);
    const std::vector<float> v = RandomVector(c.tokens * kv_stride, 12);
    SequenceKv seq(pool.get());
    ASSERT_TRUE(seq.Reserve(c.tokens).ok());
    for (int pos = 0; pos < c.tokens; ++pos) {
      seq.WriteKv(0, pos, k.data() + pos * kv_stride, v.data() + pos * kv_stride);
    }
    const int start_pos = c.tokens - c.n_queries;
    const std::vector<float> q =
        RandomVector(int64_t{c.n_queries} * c.n_heads * c.head_dim, 13);
    std::vector<float> serial(q.size(), NAN), split(q.size(), NAN);
    PagedAttention(q.data(), c.n_queries, start_pos, *pool, seq.pages(), 0, c.n_heads,
                   serial.data());
    WorkerPool workers(c.threads);
    PagedAttention(q.data(), c.n_queries, start_pos, *pool, seq.pages(), 0, c.n_heads,
                   split.data(), 0, &workers);
    EXPECT_EQ(serial, split) << c.n_queries << " queries on " << c.threads << " threads";
  }
}

}  // namespace
}  // namespace estuary
