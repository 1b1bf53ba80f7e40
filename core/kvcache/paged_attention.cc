#include "core/kvcache/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "core/kernels/cpu/kernels.h"

namespace estuary {

using kernels::cpu::Dot;
using kernels::cpu::Softmax;

namespace {

// Queries t = first, first + stride, ... of PagedAttention (every query's arithmetic is the same
// whichever thread runs it, so the split changes no bit of the output).
void AttendQueries(const float* q, int n_queries, int first, int stride, int start_pos,
                   const KvPool& pool, absl::Span<const int32_t> pages, int layer, int n_heads,
                   float* out, int shard) {
  const KvLayout& layout = pool.layout();
  const int n_kv_heads = layout.n_kv_heads;
  const int head_dim = layout.head_dim;
  const int block = layout.block_size;
  if (n_queries <= 0 || n_heads <= 0 || start_pos < 0) return;
  const int group = std::max(1, n_heads / n_kv_heads);  // query heads per kv head
  const int64_t q_stride = static_cast<int64_t>(n_heads) * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int max_pos = start_pos + n_queries;

  // scores[g][p]: the attention row of the g-th query head of the current KV head.
  thread_local std::vector<float> scores;
  scores.resize(static_cast<size_t>(group) * static_cast<size_t>(max_pos));

  for (int t = first; t < n_queries; t += stride) {
    const int n_pos = start_pos + t + 1;  // positions [0, start_pos + t]
    const int n_pages = (n_pos + block - 1) / block;
    for (int kvh = 0; kvh * group < n_heads && kvh < n_kv_heads; ++kvh) {
      const int h0 = kvh * group;
      const int n_group = std::min(group, n_heads - h0);
      const float* q0 = q + t * q_stride + static_cast<int64_t>(h0) * head_dim;
      float* o0 = out + t * q_stride + static_cast<int64_t>(h0) * head_dim;

      // Scores: each K row (one slot of one page) is read once for all heads of the group.
      for (int pi = 0; pi < n_pages; ++pi) {
        const float* kp = pool.k(layer, pages[static_cast<size_t>(pi)], kvh, shard);
        const int p0 = pi * block;
        const int slots = std::min(block, n_pos - p0);
        for (int s = 0; s < slots; ++s) {
          const float* krow = kp + static_cast<int64_t>(s) * head_dim;
          for (int g = 0; g < n_group; ++g) {
            scores[static_cast<size_t>(g) * max_pos + p0 + s] =
                Dot(q0 + static_cast<int64_t>(g) * head_dim, krow, head_dim) * scale;
          }
        }
      }
      for (int g = 0; g < n_group; ++g) {
        Softmax(scores.data() + static_cast<size_t>(g) * max_pos, n_pos);
      }

      // Weighted sum of V, positions in ascending order.
      std::fill_n(o0, static_cast<int64_t>(n_group) * head_dim, 0.0f);
      for (int pi = 0; pi < n_pages; ++pi) {
        const float* vp = pool.v(layer, pages[static_cast<size_t>(pi)], kvh, shard);
        const int p0 = pi * block;
        const int slots = std::min(block, n_pos - p0);
        for (int s = 0; s < slots; ++s) {
          const float* vrow = vp + static_cast<int64_t>(s) * head_dim;
          for (int g = 0; g < n_group; ++g) {
            const float a = scores[static_cast<size_t>(g) * max_pos + p0 + s];
            float* oh = o0 + static_cast<int64_t>(g) * head_dim;
            for (int i = 0; i < head_dim; ++i) oh[i] += a * vrow[i];
          }
        }
      }
    }
  }
}

}  // namespace

void PagedAttention(const float* q, int n_queries, int start_pos, const KvPool& pool,
                    absl::Span<const int32_t> pages, int layer, int n_heads, float* out,
                    int shard, int threads) {
  // Below this many (query, position) pairs a second thread costs more than it saves.
  constexpr int64_t kMinPairsPerThread = 1 << 16;
  const int64_t pairs = int64_t{n_queries} * (start_pos + n_queries);
  const int workers = static_cast<int>(
      std::clamp<int64_t>(pairs / kMinPairsPerThread, 1, std::min(threads, n_queries)));
  if (workers <= 1) {
    AttendQueries(q, n_queries, 0, 1, start_pos, pool, pages, layer, n_heads, out, shard);
    return;
  }
  // Interleaved queries balance the causal triangle (later queries see more positions).
  std::vector<std::thread> helpers;
  for (int w = 1; w < workers; ++w) {
    helpers.emplace_back(AttendQueries, q, n_queries, w, workers, start_pos, std::cref(pool),
                         pages, layer, n_heads, out, shard);
  }
  AttendQueries(q, n_queries, 0, workers, start_pos, pool, pages, layer, n_heads, out, shard);
  for (std::thread& t : helpers) t.join();
}

}  // namespace estuary
