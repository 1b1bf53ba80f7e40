// Host side of decode_step_kernels.h: argument checks, then the launchers of
// decode_step_kernels.cu (and the int4 products of int4_matmul.cc / int4_matmul_kernel.cu).

#include "core/kernels/cuda/decode_step_kernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/kernels/cuda/cuda_status.h"
#include "core/kernels/cuda/decode_step_kernels_launch.h"
#include "core/kernels/cuda/int4_matmul.h"

namespace estuary::cuda {
namespace {

namespace ds = decode_step_internal;
using kernels_internal::CudaStatus;
using kernels_internal::Invalid;
using kernels_internal::ToFloatWeightKind;

static_assert(kRowBackbone == ds::kPathBackbone && kRowRiver == ds::kPathRiver,
              "the kernels' path ids must match the header's");

constexpr int64_t kMaxFeatures = int64_t{1} << 30;
constexpr int64_t kMaxDenseTokens = int64_t{65535} * 8;  // grid.y of 8-token tiles
constexpr int64_t kMaxGridX = std::numeric_limits<int32_t>::max();
constexpr int kMaxExitRows = 1024;
constexpr int kMaxHeadDim = 8192;  // RoPE keeps head_dim floats of cos/sin in shared memory

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The checks the dense and int4 products share: 1 to `max` segments; n_tokens in
// [0, kMaxDenseTokens] and, when there are tokens, a 16-byte aligned x (and `up`, when set).
absl::Status CheckSegmentCount(const char* what, size_t n_segments, int max) {
  if (n_segments == 0 || n_segments > static_cast<size_t>(max)) {
    return Invalid(what, n_segments, " segments, expected 1 to ", max);
  }
  return absl::OkStatus();
}

absl::Status CheckActivations(const char* what, const float* x, const float* up,
                              int64_t n_tokens) {
  if (n_tokens < 0 || n_tokens > kMaxDenseTokens) {
    return Invalid(what, "n_tokens ", n_tokens, " outside [0, ", kMaxDenseTokens, "]");
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (x == nullptr) return Invalid(what, "null pointer");
  if (!Aligned16(x) || (up != nullptr && !Aligned16(up))) {
    return Invalid(what, "the activations must be 16-byte aligned");
  }
  return absl::OkStatus();
}

// The sizes and pointers of a (multi-segment) dense product; `up` non-null: SwiGLU on load with
// x the gate. One segment is DenseMatMulRows.
absl::Status DenseProduct(const char* what, absl::Span<const DenseSegment> segments,
                          DType w_dtype, int64_t in_features, const float* x, const float* up,
                          int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                          cudaStream_t stream) {
  ds::DenseKind kind = ds::DenseKind::kF32;
  if (absl::Status s = ToFloatWeightKind(what, w_dtype, &kind); !s.ok()) return s;
  if (absl::Status s = CheckSegmentCount(what, segments.size(), ds::kMaxSegments); !s.ok()) {
    return s;
  }
  for (const DenseSegment& segment : segments) {
    if (segment.out_features <= 0 || segment.out_features > kMaxFeatures) {
      return Invalid(what, "out_features ", segment.out_features, " outside [1, 2^30]");
    }
  }
  if (in_features <= 0 || in_features > kMaxFeatures || in_features % 8 != 0) {
    return Invalid(what, "in_features ", in_features,
                   " must be a positive multiple of 8 (16 bytes of bf16), at most 2^30");
  }
  if (absl::Status s = CheckActivations(what, x, up, n_tokens); !s.ok()) return s;
  if (n_tokens == 0) return absl::OkStatus();
  ds::DenseSegmentArgs args[ds::kMaxSegments];
  for (size_t s = 0; s < segments.size(); ++s) {
    const DenseSegment& segment = segments[s];
    if (segment.w == nullptr || segment.y == nullptr) return Invalid(what, "null pointer");
    if (!Aligned16(segment.w)) return Invalid(what, "w must be 16-byte aligned");
    args[s] = {segment.w, segment.out_features, segment.y};
  }
  return CudaStatus(ds::LaunchDenseMatMulRowsMulti(args, static_cast<int>(segments.size()), kind,
                                                   in_features, x, up, n_tokens, row_path,
                                                   want_path, stream),
                    "cuda ", what);
}

// The same for int4 views (Int4MatMul's checks for each); `up` non-null: SwiGLU on load.
absl::Status Int4Product(const char* what, absl::Span<const Int4Segment> segments,
                         const float* x, const float* up, int64_t n_tokens,
                         const int32_t* row_path, int32_t want_path, cudaStream_t stream) {
  constexpr int kMaxSegments = matmul_internal::kMaxInt4Segments;
  if (absl::Status s = CheckSegmentCount(what, segments.size(), kMaxSegments); !s.ok()) return s;
  const std::string view_what = absl::StrCat("cuda ", what);
  const Int4GpuView& first = segments[0].w;
  for (const Int4Segment& segment : segments) {
    if (absl::Status s = CheckInt4GpuView(segment.w, view_what, /*check_pointers=*/false);
        !s.ok()) {
      return s;
    }
    if (segment.w.cols != first.cols || segment.w.group_size != first.group_size) {
      return Invalid(what, "every segment needs cols ", first.cols, " and group_size ",
                     first.group_size, ", got ", segment.w.cols, " and ", segment.w.group_size);
    }
  }
  if (absl::Status s = CheckActivations(what, x, up, n_tokens); !s.ok()) return s;
  if (n_tokens == 0) return absl::OkStatus();
  Int4GpuView views[kMaxSegments];
  float* ys[kMaxSegments] = {};
  for (size_t s = 0; s < segments.size(); ++s) {
    if (absl::Status st = CheckInt4GpuView(segments[s].w, view_what, /*check_pointers=*/true);
        !st.ok()) {
      return st;
    }
    if (segments[s].y == nullptr) return Invalid(what, "null pointer");
    views[s] = segments[s].w;
    ys[s] = segments[s].y;
  }
  const auto input = up != nullptr ? matmul_internal::Int4Input::kSwiGluF32
                                   : matmul_internal::Int4Input::kF32;
  return CudaStatus(
      matmul_internal::LaunchInt4MatMulMulti(views, ys, static_cast<int>(segments.size()), x, up,
                                             input, n_tokens, row_path, want_path, stream),
      "cuda ", what);
}

// The page-region arguments shared by WriteKvRows and RopeWriteKvRows.
absl::Status CheckKvArgs(const char* what, int64_t n_rows, int page_table_stride,
                         int64_t num_pages, const PageShape& shape) {
  if (shape.n_kv_heads <= 0 || shape.block_size <= 0 || shape.head_dim <= 0) {
    return Invalid(what, "page shape needs positive n_kv_heads, block_size and head_dim, got ",
                   shape.n_kv_heads, ", ", shape.block_size, ", ", shape.head_dim);
  }
  if (num_pages < 0 || num_pages > kMaxGridX) {
    return Invalid(what, "page count ", num_pages, " outside [0, 2^31)");
  }
  // Offsets are int64: keep the region far from overflow.
  if (shape.page_floats() > (int64_t{1} << 40) / (num_pages + 1)) {
    return Invalid(what, "region of ", num_pages, " pages of ", shape.page_floats(),
                   " floats is too large");
  }
  if (page_table_stride <= 0) {
    return Invalid(what, "page_table_stride ", page_table_stride, " must be positive");
  }
  if (n_rows < 0 || n_rows > kMaxGridX) {
    return Invalid(what, "row count ", n_rows, " outside [0, 2^31)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DenseMatMulRowsMulti(absl::Span<const DenseSegment> segments, DType w_dtype,
                                  int64_t in_features, const float* x, int64_t n_tokens,
                                  const int32_t* row_path, int32_t want_path,
                                  cudaStream_t stream) {
  return DenseProduct("DenseMatMulRowsMulti", segments, w_dtype, in_features, x, /*up=*/nullptr,
                      n_tokens, row_path, want_path, stream);
}

absl::Status DenseMatMulRows(const void* w, DType w_dtype, int64_t out_features,
                             int64_t in_features, const float* x, int64_t n_tokens,
                             const int32_t* row_path, int32_t want_path, float* y,
                             cudaStream_t stream) {
  const DenseSegment segment{w, out_features, y};
  return DenseProduct("DenseMatMulRows", absl::MakeConstSpan(&segment, 1), w_dtype, in_features,
                      x, /*up=*/nullptr, n_tokens, row_path, want_path, stream);
}

absl::Status DenseMatMulRowsSwiGlu(const void* w, DType w_dtype, int64_t out_features,
                                   int64_t in_features, const float* gate, const float* up,
                                   int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                                   float* y, cudaStream_t stream) {
  const DenseSegment segment{w, out_features, y};
  // A null `up` is reported by the pointer check, not taken for "no SwiGLU".
  if (n_tokens > 0 && up == nullptr) return Invalid("DenseMatMulRowsSwiGlu", "null pointer");
  return DenseProduct("DenseMatMulRowsSwiGlu", absl::MakeConstSpan(&segment, 1), w_dtype,
                      in_features, gate, up, n_tokens, row_path, want_path, stream);
}

absl::Status Int4MatMulRows(const Int4GpuView& w, const float* x, int64_t n_tokens,
                            const int32_t* row_path, int32_t want_path, float* y,
                            cudaStream_t stream) {
  return Int4MatMul(w, x, n_tokens, row_path, want_path, y, stream);
}

absl::Status Int4MatMulRowsMulti(absl::Span<const Int4Segment> segments, const float* x,
                                 int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                                 cudaStream_t stream) {
  return Int4Product("Int4MatMulRowsMulti", segments, x, /*up=*/nullptr, n_tokens, row_path,
                     want_path, stream);
}

absl::Status Int4MatMulRowsSwiGlu(const Int4GpuView& w, const float* gate, const float* up,
                                  int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                                  float* y, cudaStream_t stream) {
  const Int4Segment segment{w, y};
  if (n_tokens > 0 && up == nullptr) return Invalid("Int4MatMulRowsSwiGlu", "null pointer");
  return Int4Product("Int4MatMulRowsSwiGlu", absl::MakeConstSpan(&segment, 1), gate, up,
                     n_tokens, row_path, want_path, stream);
}

absl::Status RopeWriteKvRows(float* q, int n_q_heads, float* k, const float* v, int n_kv_heads,
                             int head_dim, const int32_t* positions, int64_t n_rows,
                             const float* inv_freq, RopeStyle style, const int32_t* page_table,
                             int page_table_stride, float* kv_layer, int64_t num_pages,
                             const PageShape& shape, int32_t* error_flag, cudaStream_t stream) {
  constexpr const char* kWhat = "RopeWriteKvRows";
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim) {
    return Invalid(kWhat, "head_dim ", head_dim, " must be even and in [2, ", kMaxHeadDim, "]");
  }
  if (n_q_heads < 0 || n_kv_heads <= 0) {
    return Invalid(kWhat, "head counts ", n_q_heads, " / ", n_kv_heads,
                   " (query heads >= 0, kv heads >= 1)");
  }
  if (shape.n_kv_heads != n_kv_heads || shape.head_dim != head_dim) {
    return Invalid(kWhat, "page shape (", shape.n_kv_heads, " kv heads, head_dim ",
                   shape.head_dim, ") does not match the rows (", n_kv_heads, ", ", head_dim, ")");
  }
  // (heads * head_dim / 2) indexes an int loop in the kernel.
  if ((int64_t{n_q_heads} + n_kv_heads) * (head_dim / 2) > std::numeric_limits<int32_t>::max()) {
    return Invalid(kWhat, "too many heads: ", n_q_heads, " + ", n_kv_heads);
  }
  if (style != RopeStyle::kInterleaved && style != RopeStyle::kHalves) {
    return Invalid(kWhat, "unknown RoPE style ", static_cast<int>(style));
  }
  if (absl::Status s = CheckKvArgs(kWhat, n_rows, page_table_stride, num_pages, shape); !s.ok()) {
    return s;
  }
  if (n_rows == 0) return absl::OkStatus();
  if ((n_q_heads > 0 && q == nullptr) || k == nullptr || v == nullptr || positions == nullptr ||
      inv_freq == nullptr || page_table == nullptr || kv_layer == nullptr) {
    return Invalid(kWhat, "null pointer");
  }
  return CudaStatus(ds::LaunchRopeWriteKvRows(q, n_q_heads, k, v, positions, n_rows, inv_freq,
                                              style == RopeStyle::kInterleaved, page_table,
                                              page_table_stride, kv_layer, num_pages, shape,
                                              error_flag, stream),
                    "cuda ", kWhat);
}

absl::Status WriteKvRows(const float* k, const float* v, int64_t n_rows, const int32_t* positions,
                         const int32_t* page_table, int page_table_stride, float* kv_layer,
                         int64_t num_pages, const PageShape& shape, int32_t* error_flag,
                         cudaStream_t stream) {
  constexpr const char* kWhat = "WriteKvRows";
  if (absl::Status s = CheckKvArgs(kWhat, n_rows, page_table_stride, num_pages, shape); !s.ok()) {
    return s;
  }
  if (n_rows == 0) return absl::OkStatus();
  if (k == nullptr || v == nullptr || positions == nullptr || page_table == nullptr ||
      kv_layer == nullptr) {
    return Invalid(kWhat, "null pointer");
  }
  return CudaStatus(ds::LaunchWriteKvRows(k, v, n_rows, positions, page_table, page_table_stride,
                                          kv_layer, num_pages, shape, error_flag, stream),
                    "cuda ", kWhat);
}

absl::Status ExitDecision(const ExitDecisionArgs& args, cudaStream_t stream) {
  constexpr const char* kWhat = "ExitDecision";
  if (args.n_rows < 0 || args.n_rows > kMaxExitRows) {
    return Invalid(kWhat, "n_rows ", args.n_rows, " outside [0, ", kMaxExitRows, "]");
  }
  if (args.dim <= 0 || args.dim > kMaxGridX) {
    return Invalid(kWhat, "dim ", args.dim, " outside [1, 2^31)");
  }
  if (args.rule != 0 && args.rule != 1) {
    return Invalid(kWhat, "rule ", args.rule, " is neither 0 (batch-min) nor 1 (split)");
  }
  if (args.n_rows == 0) return absl::OkStatus();
  if (args.layer_in == nullptr || args.layer_out == nullptr || args.row_group == nullptr ||
      args.thresholds == nullptr || args.row_path == nullptr || args.backbone_layers == nullptr) {
    return Invalid(kWhat, "null pointer (only `similarity` is optional)");
  }
  ds::ExitKernelArgs launch;
  launch.layer_in = args.layer_in;
  launch.layer_out = args.layer_out;
  launch.dim = args.dim;
  launch.n_rows = args.n_rows;
  launch.row_group = args.row_group;
  launch.thresholds = args.thresholds;
  launch.row_path = args.row_path;
  launch.backbone_layers = args.backbone_layers;
  launch.similarity = args.similarity;
  launch.next_layer = args.next_layer;
  launch.rule = args.rule;
  launch.may_exit = args.may_exit;
  launch.forced = args.forced;
  return CudaStatus(ds::LaunchExitDecision(launch, stream), "cuda ", kWhat);
}

}  // namespace estuary::cuda
