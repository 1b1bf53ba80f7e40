// Element-wise activations: SwiGLU and softmax (llama2.c formulas, f32).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/kernels/cpu/kernels.h"

namespace estuary::kernels::cpu {

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  // `out` may alias `gate` or `up`: every element is read before it is written.
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
  }
}

double CosineSimilarity(const float* a, const float* b, int64_t n) {
  double dot = 0.0, norm_a = 0.0, norm_b = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    norm_a += static_cast<double>(a[i]) * a[i];
    norm_b += static_cast<double>(b[i]) * b[i];
  }
  if (norm_a == 0.0 || norm_b == 0.0) return 0.0;
  return dot / std::sqrt(norm_a * norm_b);
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const float max_value = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += x[i];
  }
  const float inv_sum = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv_sum;
}

}  // namespace estuary::kernels::cpu
