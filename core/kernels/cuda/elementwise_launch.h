#pragma once
// Internal: the raw kernel launchers behind elementwise.h. Compiled by nvcc (C++17) in
// elementwise.cu and called from elementwise.cc (C++20), which validates arguments first and
// turns the returned cudaError_t into an absl::Status. No Abseil here, so that nvcc never parses
// Abseil headers. Do not include this header outside core/kernels/cuda/elementwise*.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/kernels/cuda/elementwise_types.h"

namespace estuary::cuda::internal {

// Weight / table element types the kernels read (widened to f32 in registers).
enum class WeightKind : int { kF32 = 0, kBf16 = 1, kF16 = 2 };

// delta == nullptr: plain RMSNorm of `residual` (not modified); similarity must then be null.
cudaError_t LaunchResidualRmsNorm(float* residual, const float* delta, const void* weight,
                                  WeightKind weight_kind, int64_t n_tokens, int64_t dim, float eps,
                                  float* normed, float* similarity, cudaStream_t stream);

cudaError_t LaunchRope(float* q, int n_q_heads, float* k, int n_kv_heads, int head_dim,
                       const int32_t* positions, int64_t n_tokens, const float* inv_freq,
                       bool interleaved, cudaStream_t stream);

cudaError_t LaunchSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                         cudaStream_t stream);

cudaError_t LaunchEmbedding(const void* table, WeightKind table_kind, int64_t vocab, int64_t dim,
                            const int32_t* ids, int64_t n_tokens, float* out,
                            int32_t* error_flag, cudaStream_t stream);

cudaError_t LaunchArgmaxRows(const float* logits, int64_t n_rows, int64_t vocab, int32_t* out_ids,
                             cudaStream_t stream);

cudaError_t LaunchSampleRows(const float* logits, int64_t n_rows, int64_t vocab,
                             const DeviceSamplingRow* rows, int32_t* out_ids, cudaStream_t stream);

// One copy of `n_entries` pages, for each page the head slices [src_first_head, +n_heads) of K
// and V from `src` to [dst_first_head, +n_heads) of `dst`. A null page-id array means the
// identity (entry e is page e: a staging buffer). Out-of-range ids skip the entry and set
// *error_flag = 1 (when error_flag is not null).
struct PageCopyArgs {
  const float* src = nullptr;
  const int32_t* src_pages = nullptr;
  int64_t src_num_pages = 0;
  int src_kv_heads = 0;
  int src_first_head = 0;
  float* dst = nullptr;
  const int32_t* dst_pages = nullptr;
  int64_t dst_num_pages = 0;
  int dst_kv_heads = 0;
  int dst_first_head = 0;
  int n_heads = 0;
  int64_t head_floats = 0;  // block_size * head_dim
  int64_t n_entries = 0;
  int32_t* error_flag = nullptr;
};
cudaError_t LaunchPageCopy(const PageCopyArgs& args, cudaStream_t stream);

}  // namespace estuary::cuda::internal
