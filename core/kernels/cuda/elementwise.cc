// Host side of elementwise.h: argument checks, then the launchers of elementwise.cu.

#include "core/kernels/cuda/elementwise.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kernels/cuda/cuda_status.h"
#include "core/kernels/cuda/elementwise_launch.h"

namespace estuary::cuda {
namespace {

using internal::WeightKind;
using kernels_internal::CudaStatus;
using kernels_internal::Invalid;
using kernels_internal::ToFloatWeightKind;

// Grid x of the one-block-per-row kernels, and the largest head range the page copy's grid y
// holds (2 * heads <= 65535).
constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();
constexpr int kMaxPageHeads = 32767;
constexpr int kMaxHeadDim = 8192;  // RoPE keeps head_dim floats of cos/sin in shared memory

absl::Status CheckRows(const char* what, int64_t n_rows, int64_t row_length) {
  if (n_rows < 0 || n_rows > kMaxRows) {
    return Invalid(what, "row count ", n_rows, " outside [0, ", kMaxRows, "]");
  }
  if (row_length <= 0 || row_length > kMaxRows) {
    return Invalid(what, "row length ", row_length, " outside [1, ", kMaxRows, "]");
  }
  return absl::OkStatus();
}

absl::Status CheckNorm(const char* what, const float* x, const void* weight, DType weight_dtype,
                       int64_t n_tokens, int64_t dim, float eps, const float* out,
                       WeightKind* kind) {
  if (absl::Status s = ToFloatWeightKind(what, weight_dtype, kind); !s.ok()) return s;
  if (absl::Status s = CheckRows(what, n_tokens, dim); !s.ok()) return s;
  if (!(eps >= 0.0f) || !std::isfinite(eps)) return Invalid(what, "eps ", eps, " must be >= 0");
  if (n_tokens > 0 && (x == nullptr || weight == nullptr || out == nullptr)) {
    return Invalid(what, "null pointer");
  }
  return absl::OkStatus();
}

absl::Status CheckPageShape(const char* what, const PageShape& shape, int64_t num_pages) {
  if (shape.n_kv_heads <= 0 || shape.block_size <= 0 || shape.head_dim <= 0) {
    return Invalid(what, "page shape needs positive n_kv_heads, block_size and head_dim, got ",
                   shape.n_kv_heads, ", ", shape.block_size, ", ", shape.head_dim);
  }
  if (shape.n_kv_heads > kMaxPageHeads) {
    return Invalid(what, "n_kv_heads ", shape.n_kv_heads, " above ", kMaxPageHeads);
  }
  if (num_pages < 0 || num_pages > std::numeric_limits<int32_t>::max()) {
    return Invalid(what, "page count ", num_pages, " outside [0, 2^31)");
  }
  // Offsets are computed in int64: bound the region size well below overflow.
  if (shape.page_floats() > (int64_t{1} << 40) / (num_pages + 1)) {
    return Invalid(what, "region of ", num_pages, " pages of ", shape.page_floats(),
                   " floats is too large");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResidualRmsNormSimilarity(float* residual, const float* delta, const void* weight,
                                       DType weight_dtype, int64_t n_tokens, int64_t dim,
                                       float eps, float* normed, float* similarity,
                                       cudaStream_t stream) {
  constexpr const char* kWhat = "ResidualRmsNormSimilarity";
  WeightKind kind = WeightKind::kF32;
  if (absl::Status s =
          CheckNorm(kWhat, residual, weight, weight_dtype, n_tokens, dim, eps, normed, &kind);
      !s.ok()) {
    return s;
  }
  if (n_tokens > 0 && delta == nullptr) return Invalid(kWhat, "null delta");
  if (n_tokens > 0 && (normed == residual || normed == delta)) {
    return Invalid(kWhat, "normed must not alias residual or delta");
  }
  return CudaStatus(internal::LaunchResidualRmsNorm(residual, delta, weight, kind, n_tokens, dim,
                                                    eps, normed, similarity, stream),
                    "cuda ", kWhat);
}

absl::Status RmsNorm(const float* x, const void* weight, DType weight_dtype, int64_t n_tokens,
                     int64_t dim, float eps, float* out, cudaStream_t stream) {
  constexpr const char* kWhat = "RmsNorm";
  WeightKind kind = WeightKind::kF32;
  if (absl::Status s = CheckNorm(kWhat, x, weight, weight_dtype, n_tokens, dim, eps, out, &kind);
      !s.ok()) {
    return s;
  }
  // Without a delta the kernel only reads `x` (through a non-const pointer it never writes).
  return CudaStatus(internal::LaunchResidualRmsNorm(const_cast<float*>(x), nullptr, weight, kind,
                                                    n_tokens, dim, eps, out, nullptr, stream),
                    "cuda ", kWhat);
}

absl::Status ApplyRope(float* q, int n_q_heads, float* k, int n_kv_heads, int head_dim,
                       const int32_t* positions, int64_t n_tokens, const float* inv_freq,
                       RopeStyle style, cudaStream_t stream) {
  constexpr const char* kWhat = "ApplyRope";
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim) {
    return Invalid(kWhat, "head_dim ", head_dim, " must be even and in [2, ", kMaxHeadDim, "]");
  }
  if (n_q_heads < 0 || n_kv_heads < 0) {
    return Invalid(kWhat, "negative head count ", n_q_heads, " / ", n_kv_heads);
  }
  // (heads * head_dim / 2) indexes an int loop in the kernel.
  if ((int64_t{n_q_heads} + n_kv_heads) * (head_dim / 2) > std::numeric_limits<int32_t>::max()) {
    return Invalid(kWhat, "too many heads: ", n_q_heads, " + ", n_kv_heads);
  }
  if (n_tokens < 0 || n_tokens > kMaxRows) return Invalid(kWhat, "token count ", n_tokens);
  if (style != RopeStyle::kInterleaved && style != RopeStyle::kHalves) {
    return Invalid(kWhat, "unknown RoPE style ", static_cast<int>(style));
  }
  if (n_tokens > 0 && n_q_heads + n_kv_heads > 0) {
    if (positions == nullptr || inv_freq == nullptr) return Invalid(kWhat, "null pointer");
    if ((n_q_heads > 0 && q == nullptr) || (n_kv_heads > 0 && k == nullptr)) {
      return Invalid(kWhat, "null q or k with a nonzero head count");
    }
  }
  return CudaStatus(internal::LaunchRope(q, n_q_heads, k, n_kv_heads, head_dim, positions,
                                         n_tokens, inv_freq, style == RopeStyle::kInterleaved,
                                         stream),
                    "cuda ", kWhat);
}

absl::Status SwiGlu(const float* gate, const float* up, int64_t n, float* out,
                    cudaStream_t stream) {
  constexpr const char* kWhat = "SwiGlu";
  if (n < 0) return Invalid(kWhat, "negative length ", n);
  if (n > 0 && (gate == nullptr || up == nullptr || out == nullptr)) {
    return Invalid(kWhat, "null pointer");
  }
  return CudaStatus(internal::LaunchSwiGlu(gate, up, n, out, stream), "cuda ", kWhat);
}

absl::Status Embedding(const void* table, DType table_dtype, int64_t vocab, int64_t dim,
                       const int32_t* ids, int64_t n_tokens, float* out, int32_t* error_flag,
                       cudaStream_t stream) {
  constexpr const char* kWhat = "Embedding";
  WeightKind kind = WeightKind::kF32;
  if (absl::Status s = ToFloatWeightKind(kWhat, table_dtype, &kind); !s.ok()) return s;
  if (absl::Status s = CheckRows(kWhat, n_tokens, dim); !s.ok()) return s;
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    return Invalid(kWhat, "vocabulary size ", vocab, " outside [1, 2^31)");
  }
  if (n_tokens > 0 && (table == nullptr || ids == nullptr || out == nullptr)) {
    return Invalid(kWhat, "null pointer");
  }
  return CudaStatus(
      internal::LaunchEmbedding(table, kind, vocab, dim, ids, n_tokens, out, error_flag, stream),
      "cuda ", kWhat);
}

absl::Status ArgmaxRows(const float* logits, int64_t n_rows, int64_t vocab, int32_t* out_ids,
                        cudaStream_t stream) {
  constexpr const char* kWhat = "ArgmaxRows";
  if (absl::Status s = CheckRows(kWhat, n_rows, vocab); !s.ok()) return s;
  if (n_rows > 0 && (logits == nullptr || out_ids == nullptr)) {
    return Invalid(kWhat, "null pointer");
  }
  return CudaStatus(internal::LaunchArgmaxRows(logits, n_rows, vocab, out_ids, stream), "cuda ",
                    kWhat);
}

absl::Status SampleRows(const float* logits, int64_t n_rows, int64_t vocab,
                        absl::Span<const DeviceSamplingRow> rows,
                        DeviceSamplingRow* device_rows_scratch, int32_t* out_ids,
                        cudaStream_t stream) {
  constexpr const char* kWhat = "SampleRows";
  if (absl::Status s = CheckRows(kWhat, n_rows, vocab); !s.ok()) return s;
  if (static_cast<int64_t>(rows.size()) != n_rows) {
    return Invalid(kWhat, rows.size(), " parameter rows for ", n_rows, " logit rows");
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const DeviceSamplingRow& p = rows[r];
    if (!(p.temperature >= 0.0f && p.temperature <= 100.0f)) {
      return Invalid(kWhat, "row ", r, ": temperature = ", p.temperature, " must be in [0, 100]");
    }
    if (p.top_k < 0) return Invalid(kWhat, "row ", r, ": top_k = ", p.top_k, " must be >= 0");
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
      return Invalid(kWhat, "row ", r, ": top_p = ", p.top_p, " must be in (0, 1]");
    }
  }
  if (n_rows == 0) return absl::OkStatus();
  if (logits == nullptr || device_rows_scratch == nullptr || out_ids == nullptr) {
    return Invalid(kWhat, "null pointer");
  }
  if (absl::Status s = CudaStatus(
          cudaMemcpyAsync(device_rows_scratch, rows.data(), rows.size() * sizeof(DeviceSamplingRow),
                          cudaMemcpyHostToDevice, stream),
          "cuda SampleRows (parameter copy)");
      !s.ok()) {
    return s;
  }
  return CudaStatus(
      internal::LaunchSampleRows(logits, n_rows, vocab, device_rows_scratch, out_ids, stream),
      "cuda ", kWhat);
}

absl::Status CopyPages(const float* src, int64_t src_num_pages, const int32_t* src_pages,
                       float* dst, int64_t dst_num_pages, const int32_t* dst_pages, int64_t n,
                       const PageShape& shape, int32_t* error_flag, cudaStream_t stream) {
  constexpr const char* kWhat = "CopyPages";
  if (absl::Status s = CheckPageShape(kWhat, shape, src_num_pages); !s.ok()) return s;
  if (absl::Status s = CheckPageShape(kWhat, shape, dst_num_pages); !s.ok()) return s;
  if (n < 0 || n > kMaxRows) return Invalid(kWhat, "entry count ", n);
  if (n > 0 && (src == nullptr || dst == nullptr || src_pages == nullptr || dst_pages == nullptr)) {
    return Invalid(kWhat, "null pointer");
  }
  internal::PageCopyArgs args;
  args.src = src;
  args.src_pages = src_pages;
  args.src_num_pages = src_num_pages;
  args.src_kv_heads = shape.n_kv_heads;
  args.dst = dst;
  args.dst_pages = dst_pages;
  args.dst_num_pages = dst_num_pages;
  args.dst_kv_heads = shape.n_kv_heads;
  args.n_heads = shape.n_kv_heads;
  args.head_floats = shape.head_floats();
  args.n_entries = n;
  args.error_flag = error_flag;
  return CudaStatus(internal::LaunchPageCopy(args, stream), "cuda ", kWhat);
}

namespace {
absl::Status CheckHeadRange(const char* what, const PageShape& shape, int first_head,
                            int n_heads) {
  if (first_head < 0 || n_heads <= 0 || int64_t{first_head} + n_heads > shape.n_kv_heads) {
    return Invalid(what, "head range [", first_head, ", +", n_heads, ") outside [0, ",
                   shape.n_kv_heads, ")");
  }
  return absl::OkStatus();
}

// Gather (pool -> staging) and scatter (staging -> pool) are one copy seen from either end: the
// pool side addresses page ids with all of the shape's heads, from `first_head`; the staging side
// addresses entry e with only the `n_heads` moved heads, from 0.
absl::Status StagedCopy(const char* what, const float* src, float* dst, bool gather,
                        int64_t num_pages, const PageShape& shape, const int32_t* pages,
                        int64_t n, int first_head, int n_heads, int32_t* error_flag,
                        cudaStream_t stream) {
  if (absl::Status s = CheckPageShape(what, shape, num_pages); !s.ok()) return s;
  if (absl::Status s = CheckHeadRange(what, shape, first_head, n_heads); !s.ok()) return s;
  if (n < 0 || n > kMaxRows) return Invalid(what, "entry count ", n);
  if (n > 0 && (src == nullptr || dst == nullptr || pages == nullptr)) {
    return Invalid(what, "null pointer");
  }
  struct Side {
    const int32_t* pages;
    int64_t num_pages;
    int kv_heads;
    int first_head;
  };
  const Side pool{pages, num_pages, shape.n_kv_heads, first_head};
  const Side staging{nullptr, n, n_heads, 0};  // entry e is staging slot e
  const Side& from = gather ? pool : staging;
  const Side& to = gather ? staging : pool;
  internal::PageCopyArgs args;
  args.src = src;
  args.src_pages = from.pages;
  args.src_num_pages = from.num_pages;
  args.src_kv_heads = from.kv_heads;
  args.src_first_head = from.first_head;
  args.dst = dst;
  args.dst_pages = to.pages;
  args.dst_num_pages = to.num_pages;
  args.dst_kv_heads = to.kv_heads;
  args.dst_first_head = to.first_head;
  args.n_heads = n_heads;
  args.head_floats = shape.head_floats();
  args.n_entries = n;
  args.error_flag = error_flag;
  return CudaStatus(internal::LaunchPageCopy(args, stream), "cuda ", what);
}

}  // namespace

absl::Status GatherPages(const float* region, int64_t num_pages, const PageShape& shape,
                         const int32_t* pages, int64_t n, int first_head, int n_heads,
                         float* staging, int32_t* error_flag, cudaStream_t stream) {
  return StagedCopy("GatherPages", region, staging, /*gather=*/true, num_pages, shape, pages, n,
                    first_head, n_heads, error_flag, stream);
}

absl::Status ScatterPages(const float* staging, int64_t n, float* region, int64_t num_pages,
                          const PageShape& shape, const int32_t* pages, int first_head,
                          int n_heads, int32_t* error_flag, cudaStream_t stream) {
  return StagedCopy("ScatterPages", staging, region, /*gather=*/false, num_pages, shape, pages,
                    n, first_head, n_heads, error_flag, stream);
}

}  // namespace estuary::cuda
