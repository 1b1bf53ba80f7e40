// Host side of decode_step_kernels.h: argument checks, then the launchers of
// decode_step_kernels.cu (and the masked int4 product of int4_matmul.cc).

#include "core/kernels/cuda/decode_step_kernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kernels/cuda/decode_step_kernels_launch.h"
#include "core/kernels/cuda/int4_matmul.h"

namespace estuary::cuda {
namespace {

namespace ds = decode_step_internal;

static_assert(kRowBackbone == ds::kPathBackbone && kRowRiver == ds::kPathRiver,
              "the kernels' path ids must match the header's");

constexpr int64_t kMaxFeatures = int64_t{1} << 30;
constexpr int64_t kMaxDenseTokens = int64_t{65535} * 8;  // grid.y of 8-token tiles
constexpr int64_t kMaxGridX = std::numeric_limits<int32_t>::max();
constexpr int kMaxExitRows = 1024;

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cuda ", what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

absl::Status Invalid(const char* what, auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat("cuda ", what, ": ", parts...));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status ToDenseKind(DType dtype, ds::DenseKind* kind) {
  switch (dtype) {
    case DType::kF32:
      *kind = ds::DenseKind::kF32;
      return absl::OkStatus();
    case DType::kBF16:
      *kind = ds::DenseKind::kBf16;
      return absl::OkStatus();
    case DType::kF16:
      *kind = ds::DenseKind::kF16;
      return absl::OkStatus();
    case DType::kInt4:
      break;
  }
  return Invalid("DenseMatMulRows", "weights must be f32, bf16 or f16, got ", DTypeName(dtype));
}

}  // namespace

absl::Status DenseMatMulRows(const void* w, DType w_dtype, int64_t out_features,
                             int64_t in_features, const float* x, int64_t n_tokens,
                             const int32_t* row_path, int32_t want_path, float* y,
                             cudaStream_t stream) {
  constexpr const char* kWhat = "DenseMatMulRows";
  ds::DenseKind kind = ds::DenseKind::kF32;
  if (absl::Status s = ToDenseKind(w_dtype, &kind); !s.ok()) return s;
  if (out_features <= 0 || out_features > kMaxFeatures) {
    return Invalid(kWhat, "out_features ", out_features, " outside [1, 2^30]");
  }
  if (in_features <= 0 || in_features > kMaxFeatures || in_features % 8 != 0) {
    return Invalid(kWhat, "in_features ", in_features,
                   " must be a positive multiple of 8 (16 bytes of bf16), at most 2^30");
  }
  if (n_tokens < 0 || n_tokens > kMaxDenseTokens) {
    return Invalid(kWhat, "n_tokens ", n_tokens, " outside [0, ", kMaxDenseTokens, "]");
  }
  if (n_tokens == 0) return absl::OkStatus();
  if (w == nullptr || x == nullptr || y == nullptr) return Invalid(kWhat, "null pointer");
  if (!Aligned16(w) || !Aligned16(x)) {
    return Invalid(kWhat, "w and x must be 16-byte aligned");
  }
  return CudaStatus(ds::LaunchDenseMatMulRows(w, kind, out_features, in_features, x, n_tokens,
                                              row_path, want_path, y, stream),
                    kWhat);
}

absl::Status Int4MatMulRows(const Int4GpuView& w, const float* x, int64_t n_tokens,
                            const int32_t* row_path, int32_t want_path, float* y,
                            cudaStream_t stream) {
  return Int4MatMul(w, x, n_tokens, row_path, want_path, y, stream);
}

absl::Status WriteKvRows(const float* k, const float* v, int64_t n_rows, const int32_t* positions,
                         const int32_t* page_table, int page_table_stride, float* kv_layer,
                         int64_t num_pages, const PageShape& shape, int32_t* error_flag,
                         cudaStream_t stream) {
  constexpr const char* kWhat = "WriteKvRows";
  if (shape.n_kv_heads <= 0 || shape.block_size <= 0 || shape.head_dim <= 0) {
    return Invalid(kWhat, "page shape needs positive n_kv_heads, block_size and head_dim, got ",
                   shape.n_kv_heads, ", ", shape.block_size, ", ", shape.head_dim);
  }
  if (num_pages < 0 || num_pages > kMaxGridX) {
    return Invalid(kWhat, "page count ", num_pages, " outside [0, 2^31)");
  }
  // Offsets are int64: keep the region far from overflow.
  if (shape.page_floats() > (int64_t{1} << 40) / (num_pages + 1)) {
    return Invalid(kWhat, "region of ", num_pages, " pages of ", shape.page_floats(),
                   " floats is too large");
  }
  if (page_table_stride <= 0) {
    return Invalid(kWhat, "page_table_stride ", page_table_stride, " must be positive");
  }
  if (n_rows < 0 || n_rows > kMaxGridX) {
    return Invalid(kWhat, "row count ", n_rows, " outside [0, 2^31)");
  }
  if (n_rows == 0) return absl::OkStatus();
  if (k == nullptr || v == nullptr || positions == nullptr || page_table == nullptr ||
      kv_layer == nullptr) {
    return Invalid(kWhat, "null pointer");
  }
  return CudaStatus(ds::LaunchWriteKvRows(k, v, n_rows, positions, page_table, page_table_stride,
                                          kv_layer, num_pages, shape, error_flag, stream),
                    kWhat);
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
  return CudaStatus(ds::LaunchExitDecision(launch, stream), kWhat);
}

}  // namespace estuary::cuda
