#pragma once
// SequenceKv: one sequence's page table over a KvPool (design §4).
//
// Ownership: holds one reference on each page in pages(); move-only RAII, releasing them in the
// destructor or on Release(). The pool must outlive it.
// Thread-safety: not thread-safe; one owner (the engine thread that schedules the sequence) at a
// time. The pool calls it makes are thread-safe.
//
// Positions: token position `pos` lives in page pages()[pos / block_size], slot pos % block_size.
// Positions [0, frozen_tokens()) lie in pages adopted from, or registered in, the prefix cache:
// they may be shared and are read-only. The caller writes K/V only at positions >= frozen_tokens().

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/kvcache/kv_pool.h"

namespace estuary {

class SequenceKv {
 public:
  // `pool` must be non-null for anything but destruction and Release().
  explicit SequenceKv(KvPool* pool);
  ~SequenceKv();
  SequenceKv(SequenceKv&& other) noexcept;
  SequenceKv& operator=(SequenceKv&& other) noexcept;
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  // Allocates pages so that capacity() >= num_tokens. RESOURCE_EXHAUSTED (nothing allocated)
  // when the pool cannot supply them all; INVALID_ARGUMENT for num_tokens < 0.
  absl::Status Reserve(int num_tokens);

  // For a new, empty sequence: adopts the longest chain of cached full pages matching the
  // prompt's leading full blocks, and sets cached_tokens() and length() to the tokens covered.
  // Never adopts the block holding the prompt's last token, so prefill always has at least one
  // token to run (for the logits) and never writes into a shared page.
  // FAILED_PRECONDITION when the sequence already holds pages.
  absl::Status AdoptPrefix(absl::Span<const int32_t> prompt);

  // Registers the sequence's full pages in the pool's prefix map. `tokens` are the sequence's
  // token ids from position 0 (at least the prompt); only pages whose every slot lies below
  // min(tokens.size(), length()) are registered. Incremental: pages registered (or adopted)
  // earlier are skipped, so `tokens` must extend the tokens of earlier calls.
  void RegisterFullPages(absl::Span<const int32_t> tokens);

  // Releases every page and resets the sequence to empty (the pool pointer is kept).
  void Release();
  // Releases the pages past those that hold positions [0, num_tokens), keeping at least the
  // pages below length() (speculative writes past the length roll back this way: a page that
  // holds no kept position goes back to the pool). Shared (frozen) pages are never released.
  void ReleaseBeyond(int num_tokens);

  // Tokens whose K/V is present. Precondition: frozen_tokens() <= n <= capacity() (aborts
  // otherwise: shrinking into shared pages would let the next write corrupt them).
  int length() const { return length_; }
  void set_length(int n);
  int capacity() const { return static_cast<int>(pages_.size()) * block_size_; }
  // Tokens adopted by AdoptPrefix (their KV was already present).
  int cached_tokens() const { return cached_tokens_; }
  // Tokens in the leading pages that are adopted or registered, hence read-only.
  int frozen_tokens() const { return static_cast<int>(page_hashes_.size()) * block_size_; }
  const std::vector<int32_t>& pages() const { return pages_; }
  KvPool* pool() const { return pool_; }

  // K (or V) of `kv_head` at `pos` in TP shard `shard` of the pool: head_dim floats.
  // Precondition: pos < capacity(), shard < pool()->num_shards().
  float* k_slot(int layer, int pos, int kv_head, int shard = 0) {
    return pool_->k(layer, Page(pos), kv_head, shard) + Slot(pos) * head_dim_;
  }
  float* v_slot(int layer, int pos, int kv_head, int shard = 0) {
    return pool_->v(layer, Page(pos), kv_head, shard) + Slot(pos) * head_dim_;
  }
  const float* k_slot(int layer, int pos, int kv_head, int shard = 0) const {
    return static_cast<const KvPool*>(pool_)->k(layer, Page(pos), kv_head, shard) +
           Slot(pos) * head_dim_;
  }
  const float* v_slot(int layer, int pos, int kv_head, int shard = 0) const {
    return static_cast<const KvPool*>(pool_)->v(layer, Page(pos), kv_head, shard) +
           Slot(pos) * head_dim_;
  }
  // Copies one token's K and V, each [n_kv_heads][head_dim] (the shard's heads), into position
  // `pos` of `layer` of `shard`. Precondition: frozen_tokens() <= pos < capacity().
  void WriteKv(int layer, int pos, const float* k, const float* v, int shard = 0);

  // The last backbone layer `pos`'s KV came from (kProvenanceFullDepth: never exited).
  // Precondition: pos < capacity().
  void SetProvenance(int pos, uint8_t layer) { pool_->provenance(Page(pos))[Slot(pos)] = layer; }
  uint8_t provenance(int pos) const {
    return static_cast<const KvPool*>(pool_)->provenance(Page(pos))[Slot(pos)];
  }

 private:
  int32_t Page(int pos) const { return pages_[static_cast<size_t>(pos / block_size_)]; }
  int64_t Slot(int pos) const { return pos % block_size_; }

  KvPool* pool_ = nullptr;  // not owned
  int block_size_ = 1;
  int head_dim_ = 0;
  std::vector<int32_t> pages_;         // one reference held on each
  std::vector<uint64_t> page_hashes_;  // prefix-hash chain of pages_[0, page_hashes_.size())
  int length_ = 0;
  int cached_tokens_ = 0;
};

}  // namespace estuary
