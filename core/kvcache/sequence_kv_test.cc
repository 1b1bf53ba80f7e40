#include "core/kvcache/sequence_kv.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/kvcache/prefix_hash.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

std::unique_ptr<KvPool> MakePool(const KvLayout& layout, int pages) {
  absl::StatusOr<std::unique_ptr<KvPool>> pool =
      KvPool::Create(layout, pages * layout.page_bytes());
  EXPECT_TRUE(pool.ok()) << pool.status();
  return std::move(pool).value();
}

std::vector<int32_t> Prompt(int n, int32_t start) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// K/V value that depends only on the token prefix ending at `pos` (as real KV does), so a
// sequence that adopted a cached page can check what it reads.
float PrefixValue(const std::vector<int32_t>& tokens, int pos, int layer, int i) {
  uint64_t h = 1469598103934665603ull;
  for (int p = 0; p <= pos; ++p)
    h = (h ^ static_cast<uint32_t>(tokens[static_cast<size_t>(p)])) * 1099511628211ull;
  h ^= static_cast<uint64_t>(layer * 1000 + i) * 0x9e3779b97f4a7c15ull;
  return static_cast<float>(h % 100000) / 7.0f;
}

void WriteTokens(SequenceKv& seq, const std::vector<int32_t>& tokens, int from, int to,
                 const KvLayout& layout) {
  const size_t n = static_cast<size_t>(layout.token_floats());
  std::vector<float> k(n), v(n);
  for (int pos = from; pos < to; ++pos) {
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      for (size_t i = 0; i < n; ++i) {
        k[i] = PrefixValue(tokens, pos, layer, static_cast<int>(i));
        v[i] = -k[i];
      }
      seq.WriteKv(layer, pos, k.data(), v.data());
    }
    seq.SetProvenance(pos, static_cast<uint8_t>(pos % 3 == 0 ? kProvenanceFullDepth : pos % 7));
  }
}

void ExpectTokens(const SequenceKv& seq, const std::vector<int32_t>& tokens, int to,
                  const KvLayout& layout) {
  for (int pos = 0; pos < to; ++pos) {
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      for (int h = 0; h < layout.n_kv_heads; ++h) {
        for (int d = 0; d < layout.head_dim; ++d) {
          const float want = PrefixValue(tokens, pos, layer, h * layout.head_dim + d);
          ASSERT_EQ(seq.k_slot(layer, pos, h)[d], want) << "pos " << pos << " layer " << layer;
          ASSERT_EQ(seq.v_slot(layer, pos, h)[d], -want);
        }
      }
    }
    ASSERT_EQ(seq.provenance(pos), pos % 3 == 0 ? kProvenanceFullDepth : pos % 7);
  }
}

const KvLayout kLayout{.n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .block_size = 16};

TEST(SequenceKvTest, ReserveGrowsByPagesAndReleases) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 8);
  {
    SequenceKv seq(pool.get());
    ASSERT_TRUE(seq.Reserve(1).ok());
    EXPECT_EQ(seq.capacity(), 16);
    ASSERT_TRUE(seq.Reserve(16).ok());
    EXPECT_EQ(seq.pages().size(), 1u);
    ASSERT_TRUE(seq.Reserve(33).ok());
    EXPECT_EQ(seq.pages().size(), 3u);
    ASSERT_TRUE(seq.Reserve(10).ok());  // never shrinks
    EXPECT_EQ(seq.pages().size(), 3u);
    EXPECT_EQ(pool->free_pages(), 5);
    EXPECT_EQ(seq.Reserve(-1).code(), absl::StatusCode::kInvalidArgument);

    // Not enough: nothing allocated.
    const absl::Status s = seq.Reserve(16 * 9);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(seq.pages().size(), 3u);
    EXPECT_EQ(pool->free_pages(), 5);
    seq.set_length(33);
    EXPECT_EQ(seq.length(), 33);
  }
  EXPECT_EQ(pool->free_pages(), 8);
}

// Speculative writes past the length roll back page by page: pages holding no position below
// max(num_tokens, length) go back to the pool.
TEST(SequenceKvTest, ReleaseBeyondReturnsPagesPastTheKeptPositions) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 8);
  SequenceKv seq(pool.get());
  ASSERT_TRUE(seq.Reserve(16 * 5).ok());
  seq.set_length(20);
  seq.ReleaseBeyond(40);  // positions [0, 40): 3 pages
  EXPECT_EQ(seq.pages().size(), 3u);
  EXPECT_EQ(pool->free_pages(), 5);
  seq.ReleaseBeyond(0);  // never below the length: 20 positions, 2 pages
  EXPECT_EQ(seq.pages().size(), 2u);
  EXPECT_EQ(seq.length(), 20);
  EXPECT_EQ(pool->free_pages(), 6);
  seq.ReleaseBeyond(100);  // never grows
  EXPECT_EQ(seq.pages().size(), 2u);
}

TEST(SequenceKvTest, MoveTransfersOwnership) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 4);
  SequenceKv a(pool.get());
  ASSERT_TRUE(a.Reserve(20).ok());
  a.set_length(20);
  SequenceKv b(std::move(a));
  EXPECT_EQ(b.pages().size(), 2u);
  EXPECT_EQ(b.length(), 20);
  EXPECT_TRUE(a.pages().empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(pool->free_pages(), 2);
  SequenceKv c(pool.get());
  ASSERT_TRUE(c.Reserve(1).ok());
  c = std::move(b);  // c's own page is released
  EXPECT_EQ(pool->free_pages(), 2);
  c.Release();
  EXPECT_EQ(pool->free_pages(), 4);
  EXPECT_EQ(c.length(), 0);
}

TEST(SequenceKvTest, KvAndProvenanceRoundTripPerSlot) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 4);
  SequenceKv seq(pool.get());
  const std::vector<int32_t> tokens = Prompt(50, 3);
  ASSERT_TRUE(seq.Reserve(50).ok());
  for (int pos = 0; pos < 50; ++pos) EXPECT_EQ(seq.provenance(pos), kProvenanceFullDepth);
  WriteTokens(seq, tokens, 0, 50, kLayout);
  seq.set_length(50);
  ExpectTokens(seq, tokens, 50, kLayout);
  // Provenance lives at [page][slot].
  EXPECT_EQ(pool->provenance(seq.pages()[2])[1], seq.provenance(33));
  seq.SetProvenance(33, 0);
  EXPECT_EQ(pool->provenance(seq.pages()[2])[1], 0);
  // Slot addresses follow the pool layout.
  EXPECT_EQ(seq.k_slot(1, 37, 1), pool->k(1, seq.pages()[2], 1) + 5 * kLayout.head_dim);
  EXPECT_EQ(seq.v_slot(0, 15, 0), pool->v(0, seq.pages()[0], 0) + 15 * kLayout.head_dim);
}

TEST(SequenceKvTest, TwoSequencesWithTheSamePromptShareFullPages) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 8);
  const std::vector<int32_t> prompt = Prompt(40, 100);

  SequenceKv a(pool.get());
  ASSERT_TRUE(a.AdoptPrefix(prompt).ok());
  EXPECT_EQ(a.cached_tokens(), 0);
  ASSERT_TRUE(a.Reserve(40).ok());
  WriteTokens(a, prompt, 0, 40, kLayout);
  a.set_length(40);
  a.RegisterFullPages(prompt);
  EXPECT_EQ(pool->Stats().registered_pages, 2);  // the 8-token tail page is not full
  EXPECT_EQ(a.frozen_tokens(), 32);

  SequenceKv b(pool.get());
  ASSERT_TRUE(b.AdoptPrefix(prompt).ok());
  EXPECT_EQ(b.cached_tokens(), 32);
  EXPECT_EQ(b.length(), 32);
  ASSERT_EQ(b.pages().size(), 2u);
  EXPECT_EQ(b.pages()[0], a.pages()[0]);
  EXPECT_EQ(b.pages()[1], a.pages()[1]);
  EXPECT_EQ(pool->ref_count(a.pages()[0]), 2);
  EXPECT_EQ(pool->ref_count(a.pages()[2]), 1);
  ExpectTokens(b, prompt, 32, kLayout);
  ASSERT_TRUE(b.Reserve(41).ok());
  EXPECT_NE(b.pages()[2], a.pages()[2]);
  WriteTokens(b, prompt, 32, 40, kLayout);
  b.set_length(40);
  EXPECT_EQ(pool->free_pages(), 8 - 4);

  // An earlier block differing breaks the chain even though block 2 is the same.
  std::vector<int32_t> other = prompt;
  other[3] = 7;
  SequenceKv c(pool.get());
  ASSERT_TRUE(c.AdoptPrefix(other).ok());
  EXPECT_EQ(c.cached_tokens(), 0);
  // Only the second block differing: the first page is still shared.
  std::vector<int32_t> tail_differs = prompt;
  tail_differs[20] = 7;
  SequenceKv d(pool.get());
  ASSERT_TRUE(d.AdoptPrefix(tail_differs).ok());
  EXPECT_EQ(d.cached_tokens(), 16);
  EXPECT_EQ(d.pages()[0], a.pages()[0]);
  // vLLM's prefix-cache figures, in tokens: four lookups of 40, hits 0 + 32 + 0 + 16.
  EXPECT_EQ(pool->Stats().prefix_query_tokens, 4 * 40);
  EXPECT_EQ(pool->Stats().prefix_hit_tokens, 32 + 16);

  a.Release();
  b.Release();
  c.Release();
  d.Release();
  EXPECT_EQ(pool->cached_pages(), 2);
  pool->ClearPrefixCache();
  EXPECT_EQ(pool->free_pages(), 8);
}

TEST(SequenceKvTest, NeverAdoptsTheBlockHoldingTheLastPromptToken) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 8);
  const std::vector<int32_t> prompt = Prompt(32, 0);
  SequenceKv a(pool.get());
  ASSERT_TRUE(a.Reserve(32).ok());
  WriteTokens(a, prompt, 0, 32, kLayout);
  a.set_length(32);
  a.RegisterFullPages(prompt);
  EXPECT_EQ(pool->Stats().registered_pages, 2);

  SequenceKv b(pool.get());
  ASSERT_TRUE(b.AdoptPrefix(prompt).ok());
  EXPECT_EQ(b.cached_tokens(), 16);  // the last token must be prefilled for the logits
  // A longer prompt with the same start adopts both.
  const std::vector<int32_t> longer = Prompt(33, 0);
  SequenceKv c(pool.get());
  ASSERT_TRUE(c.AdoptPrefix(longer).ok());
  EXPECT_EQ(c.cached_tokens(), 32);
  // Adopting into a non-empty sequence is refused.
  EXPECT_EQ(c.AdoptPrefix(longer).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SequenceKvTest, RegisterFullPagesIsIncrementalAndBoundedByLength) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 8);
  const std::vector<int32_t> tokens = Prompt(64, 9);
  SequenceKv a(pool.get());
  ASSERT_TRUE(a.Reserve(64).ok());
  WriteTokens(a, tokens, 0, 20, kLayout);
  a.set_length(20);
  a.RegisterFullPages(tokens);  // only the first page is written in full
  EXPECT_EQ(pool->Stats().registered_pages, 1);
  WriteTokens(a, tokens, 20, 50, kLayout);
  a.set_length(50);
  a.RegisterFullPages(tokens);  // generated tokens' full pages too
  EXPECT_EQ(pool->Stats().registered_pages, 3);

  SequenceKv b(pool.get());
  ASSERT_TRUE(b.AdoptPrefix(absl::MakeConstSpan(tokens).subspan(0, 49)).ok());
  EXPECT_EQ(b.cached_tokens(), 48);
  ExpectTokens(b, tokens, 48, kLayout);
}

TEST(SequenceKvTest, AdoptedPagesSurviveTheirWriterAndAreEvictedUnderPressure) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 4);
  const std::vector<int32_t> prompt = Prompt(40, 0);
  {
    SequenceKv a(pool.get());
    ASSERT_TRUE(a.Reserve(40).ok());
    WriteTokens(a, prompt, 0, 40, kLayout);
    a.set_length(40);
    a.RegisterFullPages(prompt);
  }
  EXPECT_EQ(pool->free_pages(), 2);
  EXPECT_EQ(pool->cached_pages(), 2);
  {
    SequenceKv b(pool.get());
    ASSERT_TRUE(b.AdoptPrefix(prompt).ok());
    EXPECT_EQ(b.cached_tokens(), 32);
    ExpectTokens(b, prompt, 32, kLayout);
  }
  // A sequence needing all 4 pages evicts both cached ones.
  SequenceKv big(pool.get());
  ASSERT_TRUE(big.Reserve(64).ok());
  EXPECT_EQ(pool->Stats().evictions, 2);
  EXPECT_EQ(pool->Stats().registered_pages, 0);
  big.Release();
  SequenceKv late(pool.get());
  ASSERT_TRUE(late.AdoptPrefix(prompt).ok());
  EXPECT_EQ(late.cached_tokens(), 0);
}

TEST(SequenceKvDeathTest, SetLengthOutsideWritableRangeAborts) {
  std::unique_ptr<KvPool> pool = MakePool(kLayout, 4);
  SequenceKv a(pool.get());
  ASSERT_TRUE(a.Reserve(20).ok());
  EXPECT_DEATH(a.set_length(33), "set_length");
  const std::vector<int32_t> tokens = Prompt(20, 0);
  a.set_length(20);
  a.RegisterFullPages(tokens);
  EXPECT_DEATH(a.set_length(10), "set_length");  // the first page is shared now
}

// A seeded random mix of creating, growing, finishing, aborting and moving sequences with prefix
// adoption. After every step each page's reference count equals the number of live sequences
// holding it, and free + cached + used == num_pages; at the end, with every sequence gone and
// the prefix cache cleared, every page is free again.
TEST(SequenceKvTest, RandomMixKeepsPoolAccountingExact) {
  const KvLayout layout{.n_layers = 2, .n_kv_heads = 1, .head_dim = 4, .block_size = 4};
  constexpr int kPages = 48;
  std::unique_ptr<KvPool> pool = MakePool(layout, kPages);
  std::mt19937 rng(20240611);
  // Prompts share prefixes: a few stems, then random tails.
  std::vector<std::vector<int32_t>> stems;
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> stem(static_cast<size_t>(4 + rng() % 12));
    for (int32_t& t : stem) t = static_cast<int32_t>(rng() % 50);
    stems.push_back(stem);
  }
  struct Live {
    SequenceKv kv;
    std::vector<int32_t> tokens;
  };
  std::vector<Live> live;
  int64_t adopted_tokens = 0;
  int exhausted = 0;  // Reserve calls refused

  auto check = [&]() {
    std::map<int32_t, int> held;
    for (const Live& s : live) {
      for (int32_t p : s.kv.pages()) ++held[p];
    }
    for (int32_t p = 0; p < kPages; ++p) {
      const auto it = held.find(p);
      ASSERT_EQ(pool->ref_count(p), it == held.end() ? 0 : it->second) << "page " << p;
    }
    const KvPoolStats stats = pool->Stats();
    ASSERT_EQ(stats.used_pages, static_cast<int32_t>(held.size()));
    ASSERT_EQ(stats.free_pages + stats.cached_pages + stats.used_pages, kPages);
  };

  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 3 || live.empty()) {  // create: adopt prefix, reserve the prompt, prefill, register
      std::vector<int32_t> prompt = stems[rng() % stems.size()];
      const int tail = static_cast<int>(rng() % 10);
      for (int i = 0; i < tail; ++i) prompt.push_back(static_cast<int32_t>(rng() % 50));
      if (prompt.empty()) prompt.push_back(1);
      Live s{SequenceKv(pool.get()), prompt};
      ASSERT_TRUE(s.kv.AdoptPrefix(prompt).ok());
      adopted_tokens += s.kv.cached_tokens();
      ExpectTokens(s.kv, prompt, s.kv.cached_tokens(), layout);
      const int before = pool->available_pages();
      const absl::Status reserved = s.kv.Reserve(static_cast<int>(prompt.size()));
      if (!reserved.ok()) {
        ++exhausted;
        ASSERT_EQ(reserved.code(), absl::StatusCode::kResourceExhausted);
        ASSERT_EQ(pool->available_pages(), before);  // nothing taken
        continue;                                    // s is destroyed: aborted at admission
      }
      WriteTokens(s.kv, prompt, s.kv.cached_tokens(), static_cast<int>(prompt.size()), layout);
      s.kv.set_length(static_cast<int>(prompt.size()));
      s.kv.RegisterFullPages(prompt);
      live.push_back(std::move(s));
    } else if (op < 7) {  // grow: decode a few tokens
      Live& s = live[rng() % live.size()];
      const int n = 1 + static_cast<int>(rng() % 6);
      const int before = pool->available_pages();
      const size_t pages_before = s.kv.pages().size();
      const absl::Status grown = s.kv.Reserve(s.kv.length() + n);
      if (!grown.ok()) {
        ++exhausted;
        ASSERT_EQ(grown.code(), absl::StatusCode::kResourceExhausted);
        ASSERT_EQ(pool->available_pages(), before);
        ASSERT_EQ(s.kv.pages().size(), pages_before);
      } else {
        for (int i = 0; i < n; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 50));
        WriteTokens(s.kv, s.tokens, s.kv.length(), s.kv.length() + n, layout);
        s.kv.set_length(s.kv.length() + n);
      }
    } else if (op < 8) {  // finish: register what is full, then drop
      const size_t i = rng() % live.size();
      ExpectTokens(live[i].kv, live[i].tokens, live[i].kv.length(), layout);
      live[i].kv.RegisterFullPages(live[i].tokens);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op < 9) {  // abort: destroy without registering
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(rng() % live.size()));
    } else {  // move a sequence into a new owner
      const size_t i = rng() % live.size();
      Live moved{std::move(live[i].kv), live[i].tokens};
      live[i] = std::move(moved);
    }
    check();
    if (HasFatalFailure()) return;
  }
  // The mix did exercise prefix reuse, pool exhaustion and eviction.
  const KvPoolStats stats = pool->Stats();
  std::printf("adopted %lld tokens, %lld hits, %lld misses, %lld evictions, %d refusals\n",
              static_cast<long long>(adopted_tokens), static_cast<long long>(stats.prefix_hits),
              static_cast<long long>(stats.prefix_misses), static_cast<long long>(stats.evictions),
              exhausted);
  EXPECT_GT(adopted_tokens, 0);
  EXPECT_GT(stats.prefix_hits, 0);
  EXPECT_GT(stats.evictions, 0);
  EXPECT_GT(exhausted, 0);
  live.clear();
  pool->ClearPrefixCache();
  EXPECT_EQ(pool->free_pages(), kPages);
  EXPECT_EQ(pool->cached_pages(), 0);
  EXPECT_EQ(pool->Stats().registered_pages, 0);
}

}  // namespace
}  // namespace estuary
