#pragma once
// RoPE's parameters as the kernels take them (kernels::cpu::ApplyRope, the CUDA RoPE kernels)
// and the model config stores them (core/model/llama_config.h). Here, low in the stack (the
// dtype target), so that kernels need not include the model to rotate a head.

#include <cstdint>

namespace estuary {

// How RoPE pairs the dimensions of a head: llama2.c rotates interleaved pairs (2i, 2i+1);
// Hugging Face checkpoints rotate halves (i, i + head_dim/2).
enum class RopeStyle : uint8_t { kInterleaved, kHalves };

// Llama 3 "rope_scaling": {"rope_type": "llama3", ...}. Disabled when `enabled` is false.
struct RopeScaling {
  bool enabled = false;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

}  // namespace estuary
