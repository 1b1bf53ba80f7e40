#include "core/kernels/cuda/paged_attention.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/kernels/cuda/cuda_status.h"

namespace estuary::cuda {

size_t PagedAttentionDecodeWorkspaceBytes(const PagedAttentionDecodeArgs& args) {
  const int splits = matmul_internal::PagedAttentionSplits(args);
  if (splits <= 1 || args.n_seq <= 0 || args.n_heads <= 0 || args.head_dim <= 0) return 0;
  return static_cast<size_t>(args.n_seq) * static_cast<size_t>(args.n_heads) *
         static_cast<size_t>(splits) * (static_cast<size_t>(args.head_dim) + 2) * sizeof(float);
}

absl::Status PagedAttentionDecode(const PagedAttentionDecodeArgs& args, cudaStream_t stream) {
  PagedAttentionDecodeArgs a = args;
  if (a.n_seq < 0 || a.n_heads < 0 || a.max_seq_len < 0) {
    return absl::InvalidArgumentError("PagedAttentionDecode: negative size");
  }
  if (a.n_seq == 0 || a.n_heads == 0) return absl::OkStatus();
  if (a.head_dim < 1 || a.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionDecode: head_dim ", a.head_dim, " not in 1..256"));
  }
  if (a.n_kv_heads < 1 || a.n_heads % a.n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionDecode: n_heads ", a.n_heads,
                                                   " not a multiple of n_kv_heads ",
                                                   a.n_kv_heads));
  }
  if (a.block_size < 1) return absl::InvalidArgumentError("PagedAttentionDecode: block_size < 1");
  if (a.n_seq > 65535) {
    return absl::InvalidArgumentError("PagedAttentionDecode: n_seq above 65535");
  }
  const int64_t pages_needed = (int64_t{a.max_seq_len} + a.block_size - 1) / a.block_size;
  if (a.page_table_stride < pages_needed) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionDecode: page_table_stride ",
                                                   a.page_table_stride, " below ", pages_needed,
                                                   " pages of max_seq_len"));
  }
  if (a.q == nullptr || a.kv_layer == nullptr || a.page_table == nullptr ||
      a.seq_lens == nullptr || a.out == nullptr) {
    return absl::InvalidArgumentError("PagedAttentionDecode: null pointer");
  }
  const int64_t min_stride = int64_t{2} * a.n_kv_heads * a.block_size * a.head_dim;
  if (a.page_stride == 0) a.page_stride = min_stride;
  if (a.page_stride < min_stride) {
    return absl::InvalidArgumentError("PagedAttentionDecode: page_stride below one page");
  }
  if (a.scale == 0.0f) a.scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  const int splits = matmul_internal::PagedAttentionSplits(a);
  if (splits > 65535) {
    return absl::InvalidArgumentError("PagedAttentionDecode: more than 65535 splits");
  }
  if (splits > 1) {
    const size_t need = PagedAttentionDecodeWorkspaceBytes(a);
    if (a.workspace == nullptr || a.workspace_bytes < need ||
        reinterpret_cast<uintptr_t>(a.workspace) % alignof(float) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PagedAttentionDecode: splitting needs a workspace of ", need, " bytes"));
    }
  }
  return kernels_internal::CudaStatus(matmul_internal::LaunchPagedAttentionDecode(a, stream),
                                      "PagedAttentionDecode launch");
}

}  // namespace estuary::cuda
