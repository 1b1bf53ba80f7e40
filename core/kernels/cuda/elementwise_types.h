#pragma once
// Plain structs shared by the public elementwise.h (C++20, host) and the kernels in
// elementwise.cu (nvcc, C++17). No CUDA or Abseil types.

#include <cstdint>

namespace estuary::cuda {

// Per-row parameters of SampleRows. A trivially copyable 32-byte struct: SampleRows copies the
// host array of these into a device buffer the caller provides.
//
// Mapping from SamplingParams (core/sampling/sampler.h): temperature, top_k and top_p have the
// same meaning and ranges; min_p, repetition_penalty and stop ids are not handled on the device
// (apply the penalty to the logits first, or sample on the CPU). `seed` is the request's seed and
// `step` a counter the caller advances once per generated token: the random numbers are a pure
// function of (seed, step, token index), so the same (logits, seed, step) always give the same
// token on the device.
struct DeviceSamplingRow {
  float temperature = 1.0f;  // 0 = greedy (argmax)
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint32_t reserved = 0;
  uint64_t seed = 0;
  uint64_t step = 0;
};
static_assert(sizeof(DeviceSamplingRow) == 32, "DeviceSamplingRow is copied as raw bytes");

// The page shape of one layer of a KV pool region (the fields of KvLayout, core/kvcache/
// kv_layout.h, that the page copies need). One page-layer is [K|V][n_kv_heads][block_size]
// [head_dim] f32, i.e. 2 * n_kv_heads * block_size * head_dim floats; pages follow each other.
struct PageShape {
  int n_kv_heads = 0;
  int block_size = 0;
  int head_dim = 0;

  int64_t head_floats() const { return int64_t{block_size} * head_dim; }
  int64_t page_floats() const { return 2 * int64_t{n_kv_heads} * head_floats(); }
};

}  // namespace estuary::cuda
