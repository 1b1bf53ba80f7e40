#include "core/kvcache/kv_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"

namespace estuary {
namespace {

// A caller bug that would corrupt the accounting (double release, retaining a free page): log and
// abort rather than continue with a broken pool.
[[noreturn]] void Fatal(const std::string& message) {
  { ESTUARY_LOG(ERROR) << "KvPool: " << message; }
  std::abort();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const KvLayout& layout,
                                                       int64_t kv_cache_bytes, int num_shards,
                                                       const KvRegionAllocator& allocator) {
  if (absl::Status s = layout.Validate(); !s.ok()) return s;
  if (num_shards < 1 || num_shards > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool: num_shards = ", num_shards, " outside [1, 64]"));
  }
  if (kv_cache_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool: kv_cache_bytes = ", kv_cache_bytes));
  }
  const int64_t page_bytes = layout.page_bytes() * num_shards;
  const int64_t pages =
      std::min<int64_t>(kv_cache_bytes / page_bytes, std::numeric_limits<int32_t>::max());
  if (pages <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool: kv_cache_bytes = ", kv_cache_bytes, " holds no page of ", page_bytes,
                     " bytes (", num_shards, " shards x ", layout.n_layers, " layers x ",
                     layout.n_kv_heads, " kv heads x ", layout.block_size, " slots x ",
                     layout.head_dim, " floats x K,V)"));
  }
  const int32_t num_pages = static_cast<int32_t>(pages);
  std::unique_ptr<KvPool> pool(new KvPool(layout, num_pages, num_shards));

  // The one big allocation: one anonymous mapping per layer and shard. Zero-filled by the kernel
  // and page-aligned (which transports want for registration).
  const size_t region_bytes =
      static_cast<size_t>(num_pages) * static_cast<size_t>(layout.page_bytes_per_layer());
  for (int shard = 0; shard < num_shards; ++shard) {
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      if (allocator) {
        absl::StatusOr<KvRegionMemory> memory = allocator(region_bytes);
        if (!memory.ok()) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "KV pool: cannot allocate ", region_bytes, " bytes for layer ", layer,
              " of shard ", shard, ": ", memory.status().ToString()));
        }
        pool->regions_.push_back(
            {static_cast<float*>(memory->data), region_bytes, std::move(memory->owner)});
        continue;
      }
      void* mapped = ::mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mapped == MAP_FAILED) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "KV pool: cannot map ", region_bytes, " bytes for layer ", layer, " of ",
            layout.n_layers, " of shard ", shard, " (", num_pages, " pages)"));
      }
      pool->regions_.push_back({static_cast<float*>(mapped), region_bytes, nullptr});
    }
  }

  // Per-page metadata (small next to K/V, but still sized by the budget).
  try {
    const size_t n = static_cast<size_t>(num_pages);
    pool->provenance_.assign(n * static_cast<size_t>(layout.block_size), kProvenanceFullDepth);
    absl::MutexLock lock(&pool->mu_);
    pool->free_list_.resize(n);
    // A stack popped from the back: lowest ids first.
    for (size_t i = 0; i < n; ++i) pool->free_list_[i] = static_cast<int32_t>(n - 1 - i);
    pool->ref_counts_.assign(n, 0);
    pool->page_hash_.assign(n, 0);
    pool->registered_.assign(n, 0);
    pool->lru_prev_.assign(n, -1);
    pool->lru_next_.assign(n, -1);
    // Each page is registered under at most one hash: reserving now means RegisterPrefix never
    // allocates (and never throws) later.
    pool->prefix_map_.reserve(n);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool: cannot allocate page metadata for ", num_pages, " pages"));
  }
  return pool;
}

KvPool::KvPool(const KvLayout& layout, int32_t num_pages, int num_shards)
    : layout_(layout),
      num_pages_(num_pages),
      num_shards_(num_shards),
      page_floats_(layout.page_floats_per_layer()) {
  regions_.reserve(static_cast<size_t>(layout.n_layers) * static_cast<size_t>(num_shards));
}

KvPool::~KvPool() {
  for (const LayerRegion& region : regions_) {
    if (region.owner == nullptr) ::munmap(region.data, region.bytes);
  }
}

KvRegion KvPool::layer_region(int layer, int shard) const {
  if (layer < 0 || layer >= layout_.n_layers || shard < 0 || shard >= num_shards_) return {};
  const LayerRegion& region = regions_[static_cast<size_t>(shard * layout_.n_layers + layer)];
  return {region.data, region.bytes};
}

int32_t KvPool::free_pages() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(free_list_.size());
}

int32_t KvPool::cached_pages() const {
  absl::MutexLock lock(&mu_);
  return lru_size_;
}

int32_t KvPool::available_pages() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(free_list_.size()) + lru_size_;
}

KvPoolStats KvPool::Stats() const {
  absl::MutexLock lock(&mu_);
  KvPoolStats stats;
  stats.num_pages = num_pages_;
  stats.free_pages = static_cast<int32_t>(free_list_.size());
  stats.cached_pages = lru_size_;
  stats.used_pages = num_pages_ - stats.free_pages - stats.cached_pages;
  stats.registered_pages = static_cast<int32_t>(prefix_map_.size());
  stats.prefix_hits = prefix_hits_;
  stats.prefix_misses = prefix_misses_;
  stats.prefix_query_tokens = prefix_query_tokens_;
  stats.prefix_hit_tokens = prefix_hit_tokens_;
  stats.evictions = evictions_;
  return stats;
}

absl::StatusOr<std::vector<int32_t>> KvPool::Allocate(int n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("KV pool: Allocate(", n, ")"));
  std::vector<int32_t> pages;
  if (n == 0) return pages;
  try {
    pages.reserve(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool: Allocate(", n, ")"));
  }
  absl::MutexLock lock(&mu_);
  const int64_t free_now = static_cast<int64_t>(free_list_.size());
  if (n > free_now + lru_size_) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool: asked for ", n, " pages, ", free_now,
                                                     " free and ", lru_size_, " evictable of ",
                                                     num_pages_));
  }
  while (static_cast<int64_t>(free_list_.size()) < n) EvictOne();
  const size_t block = static_cast<size_t>(layout_.block_size);
  for (int i = 0; i < n; ++i) {
    const int32_t page = free_list_.back();
    free_list_.pop_back();
    ref_counts_[static_cast<size_t>(page)] = 1;
    std::memset(provenance_.data() + ProvenanceOffset(page), kProvenanceFullDepth, block);
    pages.push_back(page);
  }
  return pages;
}

void KvPool::CheckPageId(int32_t page, const char* op) const {
  if (page < 0 || page >= num_pages_) {
    Fatal(absl::StrCat(op, "(", page, "): page id outside [0, ", num_pages_, ")"));
  }
}

void KvPool::Retain(int32_t page) {
  CheckPageId(page, "Retain");
  absl::MutexLock lock(&mu_);
  int32_t& count = ref_counts_[static_cast<size_t>(page)];
  if (count == 0) {
    if (!registered_[static_cast<size_t>(page)]) {
      Fatal(absl::StrCat("Retain(", page, "): the page is free"));
    }
    LruRemove(page);  // a cached page comes back into use
  }
  ++count;
}

void KvPool::Release(int32_t page) {
  CheckPageId(page, "Release");
  absl::MutexLock lock(&mu_);
  int32_t& count = ref_counts_[static_cast<size_t>(page)];
  if (count <= 0) Fatal(absl::StrCat("Release(", page, "): the page holds no reference"));
  if (--count > 0) return;
  if (registered_[static_cast<size_t>(page)]) {
    LruPushBack(page);
  } else {
    free_list_.push_back(page);
  }
}

int32_t KvPool::ref_count(int32_t page) const {
  CheckPageId(page, "ref_count");
  absl::MutexLock lock(&mu_);
  return ref_counts_[static_cast<size_t>(page)];
}

std::optional<int32_t> KvPool::LookupPrefix(uint64_t hash) {
  absl::MutexLock lock(&mu_);
  const auto it = prefix_map_.find(hash);
  if (it == prefix_map_.end()) {
    ++prefix_misses_;
    return std::nullopt;
  }
  const int32_t page = it->second;
  int32_t& count = ref_counts_[static_cast<size_t>(page)];
  if (count == 0) LruRemove(page);
  ++count;
  ++prefix_hits_;
  return page;
}

void KvPool::RegisterPrefix(uint64_t hash, int32_t page) {
  CheckPageId(page, "RegisterPrefix");
  absl::MutexLock lock(&mu_);
  const size_t p = static_cast<size_t>(page);
  if (ref_counts_[p] <= 0) {
    Fatal(absl::StrCat("RegisterPrefix(", page, "): the page holds no reference"));
  }
  if (registered_[p]) return;
  if (!prefix_map_.try_emplace(hash, page).second) return;  // first registration wins
  page_hash_[p] = hash;
  registered_[p] = 1;
}

void KvPool::ClearPrefixCache() {
  absl::MutexLock lock(&mu_);
  for (const auto& [hash, page] : prefix_map_) {
    const size_t p = static_cast<size_t>(page);
    registered_[p] = 0;
    if (ref_counts_[p] == 0) {
      LruRemove(page);
      free_list_.push_back(page);
    }
  }
  prefix_map_.clear();
}

int64_t KvPool::prefix_hits() const {
  absl::MutexLock lock(&mu_);
  return prefix_hits_;
}

int64_t KvPool::prefix_misses() const {
  absl::MutexLock lock(&mu_);
  return prefix_misses_;
}

void KvPool::RecordPrefixQuery(int64_t queried_tokens, int64_t hit_tokens) {
  absl::MutexLock lock(&mu_);
  prefix_query_tokens_ += queried_tokens;
  prefix_hit_tokens_ += hit_tokens;
}

void KvPool::LruPushBack(int32_t page) {
  const size_t p = static_cast<size_t>(page);
  lru_prev_[p] = lru_tail_;
  lru_next_[p] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[static_cast<size_t>(lru_tail_)] = page;
  } else {
    lru_head_ = page;
  }
  lru_tail_ = page;
  ++lru_size_;
}

void KvPool::LruRemove(int32_t page) {
  const size_t p = static_cast<size_t>(page);
  const int32_t prev = lru_prev_[p];
  const int32_t next = lru_next_[p];
  if (prev >= 0) {
    lru_next_[static_cast<size_t>(prev)] = next;
  } else {
    lru_head_ = next;
  }
  if (next >= 0) {
    lru_prev_[static_cast<size_t>(next)] = prev;
  } else {
    lru_tail_ = prev;
  }
  lru_prev_[p] = -1;
  lru_next_[p] = -1;
  --lru_size_;
}

void KvPool::EvictOne() {
  const int32_t page = lru_head_;
  const size_t p = static_cast<size_t>(page);
  LruRemove(page);
  prefix_map_.erase(page_hash_[p]);
  registered_[p] = 0;
  free_list_.push_back(page);
  ++evictions_;
}

}  // namespace estuary
