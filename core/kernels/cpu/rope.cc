// Rotary position embeddings: inverse frequencies (with Llama 3 scaling) and the rotation.
// All in f32 with powf/cosf/sinf, so that llama2.c checkpoints reproduce its run.c bit for bit.

#include <cmath>
#include <numbers>
#include <vector>

#include "core/kernels/cpu/kernels.h"

namespace estuary::kernels::cpu {

std::vector<float> RopeInverseFrequencies(int head_dim, float theta, const RopeScaling& scaling) {
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    inv_freq[static_cast<size_t>(i)] =
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  }
  if (!scaling.enabled) return inv_freq;

  // Hugging Face _compute_llama3_parameters: long wavelengths are slowed by `factor`, short ones
  // kept, and the band between the two thresholds interpolated smoothly.
  const float old_context = static_cast<float>(scaling.original_max_position_embeddings);
  const float low_freq_wavelen = old_context / scaling.low_freq_factor;
  const float high_freq_wavelen = old_context / scaling.high_freq_factor;
  for (float& freq : inv_freq) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / freq;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      freq /= scaling.factor;
      continue;
    }
    const float smooth = (old_context / wavelen - scaling.low_freq_factor) /
                         (scaling.high_freq_factor - scaling.low_freq_factor);
    freq = (1.0f - smooth) * freq / scaling.factor + smooth * freq;
  }
  return inv_freq;
}

void ApplyRope(float* x, int n_heads, int head_dim, int pos, absl::Span<const float> inv_freq,
               RopeStyle style) {
  const int half = head_dim / 2;
  // Pair i is (2i, 2i+1) interleaved or (i, i + half) in halves.
  const int first_stride = style == RopeStyle::kInterleaved ? 2 : 1;
  const int partner = style == RopeStyle::kInterleaved ? 1 : half;
  for (int i = 0; i < half && i < static_cast<int>(inv_freq.size()); ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[static_cast<size_t>(i)];
    const float c = std::cos(angle);
    const float s = std::sin(angle);
    for (int h = 0; h < n_heads; ++h) {
      float* head = x + static_cast<int64_t>(h) * head_dim;
      const int a = i * first_stride;
      const float v0 = head[a];
      const float v1 = head[a + partner];
      head[a] = v0 * c - v1 * s;
      head[a + partner] = v0 * s + v1 * c;
    }
  }
}

}  // namespace estuary::kernels::cpu
