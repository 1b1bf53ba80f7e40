#pragma once
// Causal grouped-query attention over a paged KV cache on the CPU: the same math as
// kernels::cpu::CausalAttention (scale 1/sqrt(head_dim), f32 softmax, query head h reads KV head
// h / (n_heads / n_kv_heads)), reading K/V through a page table instead of a contiguous cache.

#include <cstdint>

#include "absl/types/span.h"
#include "core/common/worker_pool.h"
#include "core/kvcache/kv_pool.h"

namespace estuary {

// Attention for `n_queries` consecutive positions starting at `start_pos`:
//   q:   [n_queries][n_heads][head_dim]
//   out: [n_queries][n_heads][head_dim]   (must not alias q)
// Query t attends to positions [0, start_pos + t], whose K/V lie at `layer` of `pages`
// (position p in pages[p / block_size], slot p % block_size). Covers decode (n_queries = 1) and
// prefill chunks. Preconditions: pages cover start_pos + n_queries positions, n_heads is a
// multiple of the pool's n_kv_heads; K/V are read from TP shard `shard` of the pool (whose
// n_kv_heads are that rank's heads, and n_heads the rank's query heads). Pure function of its
// arguments; thread-safe (scratch is thread-local) as long as nobody writes the positions read.
// `workers`: the rank's pool (null: the caller's thread alone). The (query, KV head) pairs are
// spread over it when the call is long enough to pay (a batch-1 decode step's 8 KV heads
// included); each pair's arithmetic is the same on any thread, so the output is the same bits
// whatever the pool. Must not be called from inside a ParallelFor of `workers`.
void PagedAttention(const float* q, int n_queries, int start_pos, const KvPool& pool,
                    absl::Span<const int32_t> pages, int layer, int n_heads, float* out,
                    int shard = 0, WorkerPool* workers = nullptr);

}  // namespace estuary
