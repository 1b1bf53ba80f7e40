#include "core/kvcache/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/kernels/cpu/attention_rows.h"
#include "core/kernels/cpu/kernels.h"

namespace estuary {

using kernels::cpu::AccumulateRows;
using kernels::cpu::ScoreRows;
using kernels::cpu::Softmax;

namespace {

// The shapes PagedAttention works on, fixed for one call.
struct AttentionShape {
  int start_pos, n_heads, n_kv_heads, head_dim, block, group;
  int64_t q_stride;
  float scale;
};

// One work item: query t against KV head kvh, i.e. the `group` query heads that read it (every
// item's arithmetic is the same whichever thread runs it, so the split changes no bit of the
// output). Scores live in thread-local scratch.
void AttendOne(const float* q, const AttentionShape& a, int t, int kvh, const KvPool& pool,
               absl::Span<const int32_t> pages, int layer, float* out, int shard) {
  const int n_pos = a.start_pos + t + 1;  // positions [0, start_pos + t]
  const int n_pages = (n_pos + a.block - 1) / a.block;
  const int h0 = kvh * a.group;
  const int n_group = std::min(a.group, a.n_heads - h0);
  const int head_dim = a.head_dim;
  const float* q0 = q + t * a.q_stride + static_cast<int64_t>(h0) * head_dim;
  float* o0 = out + t * a.q_stride + static_cast<int64_t>(h0) * head_dim;

  // scores[g][p]: the attention row of the g-th query head of this KV head.
  thread_local std::vector<float> scores;
  scores.resize(static_cast<size_t>(n_group) * static_cast<size_t>(n_pos));

  // Scores: a page's K rows are read once per head of the group (from L1 after the first).
  for (int pi = 0; pi < n_pages; ++pi) {
    const float* kp = pool.k(layer, pages[static_cast<size_t>(pi)], kvh, shard);
    const int p0 = pi * a.block;
    const int slots = std::min(a.block, n_pos - p0);
    for (int g = 0; g < n_group; ++g) {
      ScoreRows(q0 + static_cast<int64_t>(g) * head_dim, kp, slots, head_dim, a.scale,
                scores.data() + static_cast<size_t>(g) * n_pos + p0);
    }
  }
  for (int g = 0; g < n_group; ++g) Softmax(scores.data() + static_cast<size_t>(g) * n_pos, n_pos);

  // Weighted sum of V, positions in ascending order.
  std::fill_n(o0, static_cast<int64_t>(n_group) * head_dim, 0.0f);
  for (int pi = 0; pi < n_pages; ++pi) {
    const float* vp = pool.v(layer, pages[static_cast<size_t>(pi)], kvh, shard);
    const int p0 = pi * a.block;
    const int slots = std::min(a.block, n_pos - p0);
    for (int g = 0; g < n_group; ++g) {
      AccumulateRows(scores.data() + static_cast<size_t>(g) * n_pos + p0, vp, slots, head_dim,
                     o0 + static_cast<int64_t>(g) * head_dim);
    }
  }
}

// Below this many multiply-adds (q.k and weighted V, summed over the call) a part of the pool
// is not worth waking: its helpers spin between a decode step's kernels, so a hand-off costs
// about a microsecond, and 2^16 FMAs are several microseconds of one core.
constexpr int64_t kMinFmasPerPart = int64_t{1} << 16;

}  // namespace

void PagedAttention(const float* q, int n_queries, int start_pos, const KvPool& pool,
                    absl::Span<const int32_t> pages, int layer, int n_heads, float* out,
                    int shard, WorkerPool* workers) {
  const KvLayout& layout = pool.layout();
  if (n_queries <= 0 || n_heads <= 0 || start_pos < 0) return;
  AttentionShape a{};
  a.start_pos = start_pos;
  a.n_heads = n_heads;
  a.n_kv_heads = layout.n_kv_heads;
  a.head_dim = layout.head_dim;
  a.block = layout.block_size;
  a.group = std::max(1, n_heads / a.n_kv_heads);  // query heads per kv head
  a.q_stride = static_cast<int64_t>(n_heads) * a.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  // KV heads that some query head reads (all of them when n_heads is a multiple, as required).
  const int kv_used = std::min(a.n_kv_heads, (n_heads + a.group - 1) / a.group);
  // Item i: query i / kv_used against KV head i % kv_used.
  const int64_t items = int64_t{n_queries} * kv_used;
  auto run_item = [&](int64_t i) {
    AttendOne(q, a, static_cast<int>(i / kv_used), static_cast<int>(i % kv_used), pool, pages,
              layer, out, shard);
  };

  // Work of the call: every query head dots and accumulates head_dim per position it sees.
  const int64_t positions =
      int64_t{n_queries} * start_pos + int64_t{n_queries} * (n_queries + 1) / 2;
  const int64_t fmas = 2 * positions * n_heads * a.head_dim;
  WorkerPool& threads = workers != nullptr ? *workers : WorkerPool::Serial();
  const int64_t parts =
      std::min<int64_t>({threads.size(), std::max<int64_t>(1, fmas / kMinFmasPerPart), items});
  if (parts <= 1) {
    for (int64_t i = 0; i < items; ++i) run_item(i);
    return;
  }
  // Part p runs items p, p + parts, p + 2 * parts, ...: interleaving balances the causal
  // triangle of a prefill chunk (later queries see more positions) and a decode step's heads.
  threads.ParallelFor(
      parts,
      [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          for (int64_t i = p; i < items; i += parts) run_item(i);
        }
      },
      static_cast<int>(parts));
}

}  // namespace estuary
