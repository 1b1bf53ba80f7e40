#include "core/kvcache/kv_pool.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

using ::testing::HasSubstr;

// 2 layers x 2 kv heads x 4 slots x 4 floats: 256 bytes per layer, 512 per page.
KvLayout SmallLayout() {
  return KvLayout{.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = 4};
}

std::unique_ptr<KvPool> MakePool(int pages) {
  const KvLayout layout = SmallLayout();
  absl::StatusOr<std::unique_ptr<KvPool>> pool =
      KvPool::Create(layout, pages * layout.page_bytes());
  EXPECT_TRUE(pool.ok()) << pool.status();
  return std::move(pool).value();
}

TEST(KvLayoutTest, ValidateBoundsEveryField) {
  EXPECT_TRUE(SmallLayout().Validate().ok());
  for (KvLayout bad :
       {KvLayout{0, 2, 4, 4}, KvLayout{256, 2, 4, 4}, KvLayout{2, 0, 4, 4}, KvLayout{2, 2, 0, 4},
        KvLayout{2, 2, 4, 0}, KvLayout{2, 2, 4, -1}, KvLayout{2, 2, 2048, 4}}) {
    EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE((KvLayout{255, 8, 128, 16}).Validate().ok());
}

TEST(KvLayoutTest, FromConfigAndSizes) {
  struct {  // the fields FromConfig reads (LlamaConfig has them)
    int n_layers = 16;
    int n_kv_heads = 8;
    int head_dim = 64;
  } config;
  const KvLayout layout = KvLayout::FromConfig(config, 16);
  EXPECT_EQ(layout.n_layers, 16);
  EXPECT_EQ(layout.n_kv_heads, 8);
  EXPECT_EQ(layout.head_dim, 64);
  EXPECT_EQ(layout.block_size, 16);
  EXPECT_EQ(layout.head_floats(), 16 * 64);
  EXPECT_EQ(layout.page_floats_per_layer(), 2 * 8 * 16 * 64);
  EXPECT_EQ(layout.page_bytes_per_layer(), 2 * 8 * 16 * 64 * 4);
  EXPECT_EQ(layout.page_bytes(), 16 * 2 * 8 * 16 * 64 * 4);
}

TEST(KvPoolTest, CreateComputesPageCount) {
  const KvLayout layout = SmallLayout();
  ASSERT_EQ(layout.page_bytes(), 512);
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(layout, 512 * 10 + 511);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->num_pages(), 10);
  EXPECT_EQ((*pool)->free_pages(), 10);
  EXPECT_EQ((*pool)->page_bytes_per_layer(), 256);
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_NE((*pool)->layer_region(layer).data, nullptr);
    EXPECT_EQ((*pool)->layer_region(layer).bytes, 10u * 256u);
  }
  EXPECT_EQ((*pool)->layer_region(2).data, nullptr);
}

// TP shards: one page table, one memory region per layer per shard, the budget covering all.
TEST(KvPoolTest, ShardsShareThePageTableAndSplitTheMemory) {
  const KvLayout layout = SmallLayout();
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(layout, 512 * 2 * 10, 2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvPool& p = **pool;
  EXPECT_EQ(p.num_shards(), 2);
  EXPECT_EQ(p.num_pages(), 10);
  for (int layer = 0; layer < 2; ++layer) {
    const KvRegion a = p.layer_region(layer, 0), b = p.layer_region(layer, 1);
    ASSERT_NE(a.data, nullptr);
    ASSERT_NE(b.data, nullptr);
    EXPECT_NE(a.data, b.data);
    EXPECT_EQ(b.bytes, 10u * 256u);
    EXPECT_EQ(static_cast<void*>(p.k(layer, 3, 1, 1)),
              static_cast<void*>(static_cast<float*>(b.data) + 3 * layout.page_floats_per_layer() +
                                 layout.head_floats()));
  }
  EXPECT_EQ(p.layer_region(0, 2).data, nullptr);
  // Writing shard 1 leaves shard 0 untouched.
  p.k(1, 4, 0, 1)[0] = 7.0f;
  EXPECT_EQ(p.k(1, 4, 0, 0)[0], 0.0f);
  EXPECT_EQ(KvPool::Create(layout, 512 * 10, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvPoolTest, RegionsMayComeFromAnAllocatorThatOwnsThem) {
  const KvLayout layout = SmallLayout();
  int live = 0;
  {
    auto pool = KvPool::Create(layout, 512 * 4, 1, [&live](size_t bytes) -> absl::StatusOr<KvRegionMemory> {
      auto memory = std::shared_ptr<std::vector<float>>(new std::vector<float>(bytes / 4, 0.0f),
                                                        [&live](std::vector<float>* v) {
                                                          --live;
                                                          delete v;
                                                        });
      ++live;
      return KvRegionMemory{memory->data(), memory};
    });
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ(live, 2);
    (*pool)->k(1, 3, 1)[0] = 1.5f;
    EXPECT_EQ((*pool)->k(1, 3, 1)[0], 1.5f);
  }
  EXPECT_EQ(live, 0);
  auto failing = KvPool::Create(layout, 512 * 4, 1, [](size_t) -> absl::StatusOr<KvRegionMemory> {
    return absl::UnavailableError("no shared memory");
  });
  EXPECT_EQ(failing.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(failing.status().message().find("no shared memory"), absl::string_view::npos);
}

TEST(KvPoolTest, CreateRejectsBadInput) {
  const KvLayout layout = SmallLayout();
  absl::StatusOr<std::unique_ptr<KvPool>> too_small = KvPool::Create(layout, 511);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_small.status().message(), HasSubstr("512"));
  EXPECT_EQ(KvPool::Create(layout, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvPool::Create(KvLayout{2, 2, 4, 0}, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvPoolTest, CreateFailsCleanlyWhenMemoryCannotBeHad) {
  // A 2^50-byte (1 PiB) layer region cannot be mapped.
  const KvLayout layout{1, 1024, 1024, 1024};
  absl::StatusOr<std::unique_ptr<KvPool>> pool =
      KvPool::Create(layout, layout.page_bytes() * 131072);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted) << pool.status();
}

TEST(KvPoolTest, MemoryLayoutIsPageKvHeadSlotDim) {
  std::unique_ptr<KvPool> pool = MakePool(3);
  const KvLayout& l = pool->layout();
  for (int layer = 0; layer < l.n_layers; ++layer) {
    const float* base = static_cast<const float*>(pool->layer_region(layer).data);
    for (int32_t page = 0; page < 3; ++page) {
      for (int h = 0; h < l.n_kv_heads; ++h) {
        const int64_t page_off = page * l.page_floats_per_layer();
        EXPECT_EQ(pool->k(layer, page, h), base + page_off + h * l.head_floats());
        EXPECT_EQ(pool->v(layer, page, h), base + page_off + (l.n_kv_heads + h) * l.head_floats());
      }
    }
  }
  // Memory starts zeroed; every float of every region is writable and distinct.
  const float* k0 = pool->k(0, 2, 1);
  EXPECT_EQ(k0[0], 0.0f);
  for (int layer = 0; layer < l.n_layers; ++layer) {
    float* base = static_cast<float*>(pool->layer_region(layer).data);
    const int64_t n = 3 * l.page_floats_per_layer();
    for (int64_t i = 0; i < n; ++i) base[i] = static_cast<float>(layer * 100000 + i);
  }
  EXPECT_EQ(pool->v(1, 2, 1)[3], static_cast<float>(100000 + 2 * 64 + 3 * 16 + 3));
}

TEST(KvPoolTest, AllocateReleaseAccounting) {
  std::unique_ptr<KvPool> pool = MakePool(10);
  absl::StatusOr<std::vector<int32_t>> a = pool->Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool->free_pages(), 7);
  absl::StatusOr<std::vector<int32_t>> b = pool->Allocate(7);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool->free_pages(), 0);
  std::set<int32_t> all(a->begin(), a->end());
  all.insert(b->begin(), b->end());
  EXPECT_EQ(all.size(), 10u);
  for (int32_t p : all) EXPECT_EQ(pool->ref_count(p), 1);

  absl::StatusOr<std::vector<int32_t>> c = pool->Allocate(1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("asked for 1 pages, 0 free"));

  for (int32_t p : *a) pool->Release(p);
  EXPECT_EQ(pool->free_pages(), 3);
  // All or nothing: asking for 4 of 3 changes nothing.
  absl::StatusOr<std::vector<int32_t>> d = pool->Allocate(4);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(d.status().message(), HasSubstr("asked for 4 pages, 3 free"));
  EXPECT_EQ(pool->free_pages(), 3);

  EXPECT_TRUE(pool->Allocate(0).ok());
  EXPECT_TRUE(pool->Allocate(0)->empty());
  EXPECT_EQ(pool->Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
  for (int32_t p : *b) pool->Release(p);
  EXPECT_EQ(pool->free_pages(), 10);
  EXPECT_EQ(pool->Allocate(11).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->free_pages(), 10);
}

TEST(KvPoolTest, AllocateResetsProvenance) {
  std::unique_ptr<KvPool> pool = MakePool(1);
  std::vector<int32_t> pages = *pool->Allocate(1);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(pool->provenance(pages[0])[s], kProvenanceFullDepth);
  pool->provenance(pages[0])[2] = 7;
  pool->Release(pages[0]);
  pages = *pool->Allocate(1);
  EXPECT_EQ(pool->provenance(pages[0])[2], kProvenanceFullDepth);
  pool->Release(pages[0]);
}

TEST(KvPoolTest, ReferenceCountsShareAPage) {
  std::unique_ptr<KvPool> pool = MakePool(2);
  const int32_t page = (*pool->Allocate(1))[0];
  pool->Retain(page);
  pool->Retain(page);
  EXPECT_EQ(pool->ref_count(page), 3);
  pool->Release(page);
  pool->Release(page);
  EXPECT_EQ(pool->free_pages(), 1);
  pool->Release(page);
  EXPECT_EQ(pool->free_pages(), 2);
  EXPECT_EQ(pool->ref_count(page), 0);
}

TEST(KvPoolDeathTest, MisuseAbortsWithAMessage) {
  std::unique_ptr<KvPool> pool = MakePool(2);
  EXPECT_DEATH(pool->Release(0), "holds no reference");
  EXPECT_DEATH(pool->Retain(1), "the page is free");
  EXPECT_DEATH(pool->Release(2), "outside");
  EXPECT_DEATH(pool->RegisterPrefix(42, 0), "holds no reference");
}

TEST(KvPoolTest, PrefixCacheKeepsReleasedPagesUntilEvicted) {
  std::unique_ptr<KvPool> pool = MakePool(4);
  const std::vector<int32_t> pages = *pool->Allocate(2);
  pool->RegisterPrefix(111, pages[0]);
  pool->RegisterPrefix(222, pages[1]);
  EXPECT_EQ(pool->Stats().registered_pages, 2);

  // Hit retains.
  std::optional<int32_t> hit = pool->LookupPrefix(111);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, pages[0]);
  EXPECT_EQ(pool->ref_count(pages[0]), 2);
  EXPECT_FALSE(pool->LookupPrefix(333).has_value());
  EXPECT_EQ(pool->prefix_hits(), 1);
  EXPECT_EQ(pool->prefix_misses(), 1);

  // Released to zero: cached, not free.
  pool->Release(pages[0]);
  pool->Release(pages[0]);
  pool->Release(pages[1]);
  EXPECT_EQ(pool->free_pages(), 2);
  EXPECT_EQ(pool->cached_pages(), 2);
  EXPECT_EQ(pool->available_pages(), 4);

  // A lookup revives a cached page.
  hit = pool->LookupPrefix(222);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(pool->ref_count(pages[1]), 1);
  EXPECT_EQ(pool->cached_pages(), 1);
  pool->Release(pages[1]);
  // Now LRU order: pages[0] (released first), then pages[1].

  // Pressure: 3 pages with 2 free evicts the least recently released cached page only.
  absl::StatusOr<std::vector<int32_t>> big = pool->Allocate(3);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(pool->Stats().evictions, 1);
  EXPECT_FALSE(pool->LookupPrefix(111).has_value());
  EXPECT_EQ(pool->cached_pages(), 1);
  // Too much even with eviction: nothing is evicted.
  EXPECT_EQ(pool->Allocate(2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->cached_pages(), 1);
  EXPECT_EQ(pool->Stats().evictions, 1);
  hit = pool->LookupPrefix(222);
  ASSERT_TRUE(hit.has_value());
  pool->Release(*hit);
  for (int32_t p : *big) pool->Release(p);

  const KvPoolStats stats = pool->Stats();
  EXPECT_EQ(stats.free_pages + stats.cached_pages + stats.used_pages, 4);
  EXPECT_EQ(stats.used_pages, 0);
  pool->ClearPrefixCache();
  EXPECT_EQ(pool->free_pages(), 4);
  EXPECT_EQ(pool->Stats().registered_pages, 0);
}

TEST(KvPoolTest, FirstRegistrationWinsAndClearKeepsInUsePages) {
  std::unique_ptr<KvPool> pool = MakePool(3);
  const std::vector<int32_t> pages = *pool->Allocate(2);
  pool->RegisterPrefix(5, pages[0]);
  pool->RegisterPrefix(5, pages[1]);  // same content computed twice: keep the first
  pool->RegisterPrefix(6, pages[0]);  // a page has one name
  EXPECT_EQ(pool->Stats().registered_pages, 1);
  EXPECT_FALSE(pool->LookupPrefix(6).has_value());

  pool->ClearPrefixCache();  // pages[0] is in use: unregistered, freed on release
  EXPECT_FALSE(pool->LookupPrefix(5).has_value());
  pool->Release(pages[0]);
  pool->Release(pages[1]);
  EXPECT_EQ(pool->free_pages(), 3);
  EXPECT_EQ(pool->cached_pages(), 0);
}

TEST(KvPoolTest, ConcurrentAllocateAndReleaseKeepExactAccounting) {
  std::unique_ptr<KvPool> pool = MakePool(64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      std::vector<int32_t> held;
      for (int i = 0; i < 2000; ++i) {
        if (held.empty() || rng() % 2 == 0) {
          absl::StatusOr<std::vector<int32_t>> got =
              pool->Allocate(1 + static_cast<int>(rng() % 4));
          if (got.ok()) {
            for (int32_t p : *got) {
              if (rng() % 4 == 0) pool->RegisterPrefix(rng() % 32, p);
              held.push_back(p);
            }
          }
        } else if (rng() % 3 == 0) {
          if (std::optional<int32_t> hit = pool->LookupPrefix(rng() % 32)) held.push_back(*hit);
        } else {
          const size_t i = rng() % held.size();
          pool->Release(held[i]);
          held[i] = held.back();
          held.pop_back();
        }
      }
      for (int32_t p : held) pool->Release(p);
    });
  }
  for (std::thread& t : threads) t.join();
  const KvPoolStats stats = pool->Stats();
  EXPECT_EQ(stats.used_pages, 0);
  EXPECT_EQ(stats.free_pages + stats.cached_pages, 64);
  pool->ClearPrefixCache();
  EXPECT_EQ(pool->free_pages(), 64);
}

}  // namespace
}  // namespace estuary
