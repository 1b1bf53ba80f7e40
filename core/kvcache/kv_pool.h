#pragma once
// KvPool: the paged KV cache of one decode (or prefill) worker (design §4).
//
// Ownership: the pool owns all K/V memory, allocated once in Create(): one region per layer laid
// out [page][K|V][kv_head][slot][head_dim] (see kv_layout.h), plus one provenance byte per token
// slot, laid out [page][slot].
//
// Tensor-parallel shards (design §6): a pool created with `num_shards` = tp_size holds one set
// of layer regions per TP rank, each with the layout's KV heads (those local to that rank), and
// one page table for all of them: a page id names the same token slots on every rank, so one
// allocation, one prefix cache and one provenance record serve the whole TP group, and a
// transfer descriptor needs one list of page ids. Rank r touches only shard r's memory. Pages are handed out by id (int32 in [0, num_pages())) with a
// reference count; SequenceKv (sequence_kv.h) is the usual owner of those references.
//
// Page states:
//   free       refcount 0, on the free list;
//   in use     refcount > 0 (possibly registered in the prefix cache, then shared read-only);
//   cached     refcount 0 but registered in the prefix cache: kept for reuse by LookupPrefix and
//              evicted (least recently released first) when Allocate needs the room.
//
// Thread-safety: allocation, reference counts, the prefix map and the counters are guarded by one
// mutex, so every method may be called from any thread. K/V and provenance accessors take no lock:
// a page has one writer (the sequence that allocated it, until it is full and registered) and its
// readers are ordered after the writes by the engine's step structure.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/kvcache/kv_layout.h"

namespace estuary {

// Provenance byte of a token whose KV came from every backbone layer (it never exited early).
// Any other value is the index of the last backbone layer its KV came from.
inline constexpr uint8_t kProvenanceFullDepth = 255;

// One layer's memory region, for registering with a transport (UCX, NCCL) later.
struct KvRegion {
  void* data = nullptr;
  size_t bytes = 0;  // num_pages * page_bytes_per_layer
};

// Where the pool's layer regions come from. By default anonymous mappings; a worker that pushes
// or receives KV over a transport may hand in the transport's allocator instead (shared memory
// that a peer on the same host maps directly). The returned memory must be zeroed and stay valid
// while `owner` lives; the pool keeps `owner` until it is destroyed.
struct KvRegionMemory {
  void* data = nullptr;
  std::shared_ptr<void> owner;
};
using KvRegionAllocator = std::function<absl::StatusOr<KvRegionMemory>(size_t bytes)>;

// A consistent snapshot of the pool's accounting (taken under the lock).
struct KvPoolStats {
  int32_t num_pages = 0;
  int32_t free_pages = 0;        // on the free list
  int32_t cached_pages = 0;      // refcount 0, registered, evictable
  int32_t used_pages = 0;        // refcount > 0; free + cached + used == num_pages
  int32_t registered_pages = 0;  // in the prefix map (cached, or in use and shared)
  int64_t prefix_hits = 0;
  int64_t prefix_misses = 0;
  // In tokens, as vLLM's vllm:prefix_cache_queries / _hits: the prompt tokens of every
  // adoption attempt (RecordPrefixQuery), and those of them found cached.
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t evictions = 0;
};

class KvPool {
 public:
  // Allocates the whole pool: kv_cache_bytes / layout.page_bytes() pages (capped at 2^31 - 1).
  // INVALID_ARGUMENT for a bad layout or a budget below one page; RESOURCE_EXHAUSTED when the
  // memory cannot be had. K/V memory starts zeroed; provenance starts at kProvenanceFullDepth.
  // With num_shards > 1 the budget covers all shards: each page costs num_shards * page_bytes().
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(const KvLayout& layout,
                                                        int64_t kv_cache_bytes,
                                                        int num_shards = 1,
                                                        const KvRegionAllocator& allocator = {});
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int32_t num_pages() const { return num_pages_; }
  int num_shards() const { return num_shards_; }
  int64_t page_bytes_per_layer() const { return layout_.page_bytes_per_layer(); }
  // One layer's memory of one shard; empty for indices out of range.
  KvRegion layer_region(int layer, int shard = 0) const;

  // Pages on the free list (excludes cached prefix pages, which Allocate may also evict).
  int32_t free_pages() const;
  // Cached prefix pages with no reference (evictable).
  int32_t cached_pages() const;
  // free_pages() + cached_pages(): the most one Allocate can hand out now.
  int32_t available_pages() const;
  KvPoolStats Stats() const;

  // `n` pages, each with reference count 1 and provenance reset to kProvenanceFullDepth.
  // All or nothing: when fewer than `n` pages are free, evicts cached prefix pages (least recently
  // released first) if that makes enough room; otherwise RESOURCE_EXHAUSTED (asked vs free) and
  // nothing changes. n == 0 gives an empty vector; n < 0 is INVALID_ARGUMENT.
  absl::StatusOr<std::vector<int32_t>> Allocate(int n);
  // Adds a reference to a page that is in use or cached. Aborts with a message for a free page or
  // an id out of range (a caller bug that would otherwise corrupt the pool).
  void Retain(int32_t page);
  // Drops a reference. At zero the page returns to the free list, or, when it is registered in
  // the prefix cache, stays cached until evicted. Aborts on a page with no reference.
  void Release(int32_t page);
  int32_t ref_count(int32_t page) const;

  // K (or V) of `kv_head` in `page` at `layer` of `shard`: [block_size][head_dim] floats,
  // contiguous. No checks (hot path): layer < n_layers, page < num_pages, kv_head < n_kv_heads,
  // shard < num_shards.
  float* k(int layer, int32_t page, int kv_head, int shard = 0) {
    return HeadSlice(layer, page, kv_head, 0, shard);
  }
  float* v(int layer, int32_t page, int kv_head, int shard = 0) {
    return HeadSlice(layer, page, kv_head, 1, shard);
  }
  const float* k(int layer, int32_t page, int kv_head, int shard = 0) const {
    return HeadSlice(layer, page, kv_head, 0, shard);
  }
  const float* v(int layer, int32_t page, int kv_head, int shard = 0) const {
    return HeadSlice(layer, page, kv_head, 1, shard);
  }
  // Provenance of `page`: [block_size] bytes, one per token slot.
  uint8_t* provenance(int32_t page) { return provenance_.data() + ProvenanceOffset(page); }
  const uint8_t* provenance(int32_t page) const {
    return provenance_.data() + ProvenanceOffset(page);
  }

  // Prefix cache of full pages, keyed by HashPageTokens chains (prefix_hash.h).
  // On a hit, adds a reference to the page (reviving it when cached) and returns it.
  std::optional<int32_t> LookupPrefix(uint64_t hash);
  // Registers an in-use, full page under `hash`; from then on its contents must not change.
  // No-op when `hash` already names a page (the first registration wins) or when `page` is
  // already registered. Aborts for a page with no reference.
  void RegisterPrefix(uint64_t hash, int32_t page);
  // Forgets every registration: cached pages go to the free list, in-use pages go there when
  // released.
  void ClearPrefixCache();
  int64_t prefix_hits() const;
  int64_t prefix_misses() const;
  // One lookup of a prompt of `queried_tokens` tokens, `hit_tokens` of them cached (SequenceKv).
  void RecordPrefixQuery(int64_t queried_tokens, int64_t hit_tokens);

 private:
  struct LayerRegion {
    float* data = nullptr;
    size_t bytes = 0;            // of the mapping
    std::shared_ptr<void> owner;  // set when an allocator supplied the memory (else: munmap)
  };

  KvPool(const KvLayout& layout, int32_t num_pages, int num_shards);

  float* HeadSlice(int layer, int32_t page, int kv_head, int k_or_v, int shard) const {
    return regions_[static_cast<size_t>(shard * layout_.n_layers + layer)].data +
           static_cast<int64_t>(page) * page_floats_ +
           (int64_t{k_or_v} * layout_.n_kv_heads + kv_head) * layout_.head_floats();
  }
  size_t ProvenanceOffset(int32_t page) const {
    return static_cast<size_t>(page) * static_cast<size_t>(layout_.block_size);
  }

  void CheckPageId(int32_t page, const char* op) const;
  // Intrusive LRU list of cached pages; head = least recently released.
  void LruPushBack(int32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruRemove(int32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the registration of the least recently released cached page and frees it.
  void EvictOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvLayout layout_;
  const int32_t num_pages_;
  const int num_shards_;
  const int64_t page_floats_;         // layout_.page_floats_per_layer()
  std::vector<LayerRegion> regions_;  // [shard][layer]; owned mappings, unmapped in the destructor
  std::vector<uint8_t> provenance_;   // [page][slot]; written lock-free by the page's writer

  mutable absl::Mutex mu_;
  std::vector<int32_t> free_list_ ABSL_GUARDED_BY(mu_);   // a stack; lowest ids handed out first
  std::vector<int32_t> ref_counts_ ABSL_GUARDED_BY(mu_);  // [page]
  // Prefix map and the inverse per-page registration.
  absl::flat_hash_map<uint64_t, int32_t> prefix_map_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> page_hash_ ABSL_GUARDED_BY(mu_);  // [page]; valid when registered
  std::vector<uint8_t> registered_ ABSL_GUARDED_BY(mu_);  // [page]; 0 or 1
  std::vector<int32_t> lru_prev_ ABSL_GUARDED_BY(mu_);    // [page]; -1 = none
  std::vector<int32_t> lru_next_ ABSL_GUARDED_BY(mu_);    // [page]; -1 = none
  int32_t lru_head_ ABSL_GUARDED_BY(mu_) = -1;
  int32_t lru_tail_ ABSL_GUARDED_BY(mu_) = -1;
  int32_t lru_size_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_misses_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_query_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_hit_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace estuary
