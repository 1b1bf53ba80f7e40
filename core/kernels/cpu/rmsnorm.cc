// RmsNorm, as llama2.c computes it: ss = sum(x^2) / n + eps; out = weight * (x / sqrt(ss)).

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/kernels/cpu/kernels.h"
#include "core/kernels/cpu/widen.h"

namespace estuary::kernels::cpu {

void RmsNorm(const float* x, const Tensor& weight, int64_t n_tokens, int64_t dim, float eps,
             float* out) {
  if (n_tokens <= 0 || dim <= 0) return;
  // Norm weights are tiny (dim elements): widen them once per call unless already f32.
  thread_local std::vector<float> widened;
  const float* w = weight.data<float>();
  if (weight.dtype() != DType::kF32) {
    widened.resize(static_cast<size_t>(dim));
    internal::WidenToF32(weight.dtype(), weight.raw(), dim, widened.data());
    w = widened.data();
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * dim;
    float* ot = out + t * dim;
    float ss = 0.0f;
    for (int64_t i = 0; i < dim; ++i) ss += xt[i] * xt[i];
    ss /= static_cast<float>(dim);
    ss += eps;
    const float scale = 1.0f / std::sqrt(ss);
    for (int64_t i = 0; i < dim; ++i) ot[i] = w[i] * (scale * xt[i]);
  }
}

}  // namespace estuary::kernels::cpu
