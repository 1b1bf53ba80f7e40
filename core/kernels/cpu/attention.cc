// Causal grouped-query attention over a contiguous KV cache (see kernels.h for the layouts).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/kernels/cpu/kernels.h"

namespace estuary::kernels::cpu {
float Dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += a[i + j] * b[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (float p : partial) sum += p;
  return sum;
}

void CausalAttention(const float* q, int n_queries, int start_pos, const float* k, const float* v,
                     int n_heads, int n_kv_heads, int head_dim, float* out) {
  if (n_queries <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0) return;
  const int group = std::max(1, n_heads / n_kv_heads);  // query heads per kv head
  const int64_t q_stride = static_cast<int64_t>(n_heads) * head_dim;
  const int64_t kv_stride = static_cast<int64_t>(n_kv_heads) * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  thread_local std::vector<float> scores;
  scores.resize(static_cast<size_t>(start_pos + n_queries));

  for (int t = 0; t < n_queries; ++t) {
    const int n_pos = start_pos + t + 1;  // positions [0, start_pos + t]
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + t * q_stride + static_cast<int64_t>(h) * head_dim;
      const int64_t kv_offset = static_cast<int64_t>(h / group) * head_dim;
      for (int p = 0; p < n_pos; ++p) {
        scores[static_cast<size_t>(p)] = Dot(qh, k + p * kv_stride + kv_offset, head_dim) * scale;
      }
      Softmax(scores.data(), n_pos);
      float* oh = out + t * q_stride + static_cast<int64_t>(h) * head_dim;
      std::fill_n(oh, head_dim, 0.0f);
      for (int p = 0; p < n_pos; ++p) {
        const float a = scores[static_cast<size_t>(p)];
        const float* vp = v + p * kv_stride + kv_offset;
        for (int i = 0; i < head_dim; ++i) oh[i] += a * vp[i];
      }
    }
  }
}

}  // namespace estuary::kernels::cpu
