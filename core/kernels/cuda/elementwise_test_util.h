#pragma once
// Helpers shared by the tests of the element-wise kernels (elementwise_test.cc) and of the fused
// decode-step launches compared against them (decode_step_fused_test.cc).

#include <vector>

#include "core/kernels/cpu/kernels.h"

namespace estuary::cuda::elementwise_test {

// The RoPE inverse frequencies of the tests (kernels::cpu::RopeInverseFrequencies): theta 10000
// unscaled, or with `llama3_scaling` theta 500000 and Llama 3.2's scaling (factor 32, low/high
// frequency factors 1 and 4, 8192 original positions).
inline std::vector<float> TestRopeInverseFrequencies(int head_dim, bool llama3_scaling) {
  RopeScaling scaling;
  float theta = 10000.0f;
  if (llama3_scaling) {
    theta = 500000.0f;
    scaling.enabled = true;
    scaling.factor = 32.0f;
    scaling.low_freq_factor = 1.0f;
    scaling.high_freq_factor = 4.0f;
    scaling.original_max_position_embeddings = 8192;
  }
  return kernels::cpu::RopeInverseFrequencies(head_dim, theta, scaling);
}

}  // namespace estuary::cuda::elementwise_test
