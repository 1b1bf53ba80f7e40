#pragma once
// Internal: the raw launchers behind decode_step_kernels.h. Compiled by nvcc (C++17) in
// decode_step_kernels.cu and called from decode_step_kernels.cc (C++20), which validates the
// arguments first and turns the returned cudaError_t into an absl::Status. Plain types only (no
// Abseil), so that nvcc never parses Abseil headers. Do not include outside
// core/kernels/cuda/decode_step_kernels*.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/kernels/cuda/elementwise_types.h"

namespace estuary::cuda::decode_step_internal {

// kRowBackbone / kRowRiver of decode_step_kernels.h (the .cc checks they agree).
inline constexpr int32_t kPathBackbone = 0;
inline constexpr int32_t kPathRiver = 1;

// Element type of the dense weight (widened to f32 in registers).
enum class DenseKind : int { kF32 = 0, kBf16 = 1, kF16 = 2 };

// Up to kMaxSegments dense products of the same activations in one launch (DenseSegment of
// decode_step_kernels.h): segment s computes y[t] = W_s a[t] for the rows t with
// row_path[t] == want_path (all rows when row_path is null), where a = x, or silu(x) * x_up
// computed on load when x_up is not null. One segment is DenseMatMulRows. Checked by the caller:
// 1 <= n_segments <= kMaxSegments, every out_features and in_features in [1, 2^30],
// in % 8 == 0, every w, x and x_up 16-byte aligned, n_tokens <= 65535 * 8.
inline constexpr int kMaxSegments = 3;
struct DenseSegmentArgs {
  const void* w = nullptr;
  int64_t out_features = 0;
  float* y = nullptr;
};
cudaError_t LaunchDenseMatMulRowsMulti(const DenseSegmentArgs* segments, int n_segments,
                                       DenseKind kind, int64_t in_features, const float* x,
                                       const float* x_up, int64_t n_tokens,
                                       const int32_t* row_path, int32_t want_path,
                                       cudaStream_t stream);

// See WriteKvRows. Checked by the caller: shape positive, page_table_stride >= 1,
// n_rows < 2^31, num_pages < 2^31.
cudaError_t LaunchWriteKvRows(const float* k, const float* v, int64_t n_rows,
                              const int32_t* positions, const int32_t* page_table,
                              int page_table_stride, float* kv_layer, int64_t num_pages,
                              const PageShape& shape, int32_t* error_flag, cudaStream_t stream);

// See RopeWriteKvRows: ApplyRope then WriteKvRows in one launch, one block per row. Checked by
// the caller as both (head_dim even, at most 8192; shape.n_kv_heads == n_kv_heads and
// shape.head_dim == head_dim; n_q_heads >= 0).
cudaError_t LaunchRopeWriteKvRows(float* q, int n_q_heads, float* k, const float* v,
                                  const int32_t* positions, int64_t n_rows, const float* inv_freq,
                                  bool interleaved, const int32_t* page_table,
                                  int page_table_stride, float* kv_layer, int64_t num_pages,
                                  const PageShape& shape, int32_t* error_flag,
                                  cudaStream_t stream);

// The fields of ExitDecisionArgs (decode_step_kernels.h), checked by the caller: 1 <= n_rows
// <= 1024, dim in [1, 2^31), rule 0 or 1, every pointer but `similarity` non-null.
struct ExitKernelArgs {
  const float* layer_in = nullptr;
  const float* layer_out = nullptr;
  int64_t dim = 0;
  int n_rows = 0;
  const int32_t* row_group = nullptr;
  const float* thresholds = nullptr;
  int32_t* row_path = nullptr;
  int32_t* backbone_layers = nullptr;
  float* similarity = nullptr;
  int next_layer = 0;
  int rule = 0;
  int may_exit = 0;
  int forced = 0;
};
cudaError_t LaunchExitDecision(const ExitKernelArgs& args, cudaStream_t stream);

}  // namespace estuary::cuda::decode_step_internal
