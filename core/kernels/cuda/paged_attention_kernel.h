#pragma once
// Internal: arguments and launcher of the paged-attention decode kernel
// (paged_attention_kernel.cu). Plain types only; see paged_attention.h for the public API.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace estuary::cuda {

// All pointers are device pointers. See paged_attention.h for the meaning of each field.
struct PagedAttentionDecodeArgs {
  const float* q = nullptr;           // [n_seq][n_heads][head_dim]
  const float* kv_layer = nullptr;    // one layer: page p at kv_layer + p * page_stride
  int64_t page_stride = 0;            // floats; 0: 2 * n_kv_heads * block_size * head_dim
  const int32_t* page_table = nullptr;  // [n_seq][page_table_stride] page ids
  int page_table_stride = 0;            // entries per sequence (>= pages of the longest one)
  const int32_t* seq_lens = nullptr;    // [n_seq] positions each query attends (0..max_seq_len)
  int n_seq = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;    // 1..256
  int block_size = 0;  // token slots per page
  int max_seq_len = 0;  // upper bound of seq_lens (host-known)
  float scale = 0.0f;   // 0: 1 / sqrt(head_dim)
  float* out = nullptr;  // [n_seq][n_heads][head_dim]
  // Flash-decoding split: > 0 cuts each sequence into chunks of this many positions, run as
  // separate blocks and merged by a second kernel; needs `workspace` of
  // PagedAttentionDecodeWorkspaceBytes() bytes. 0 (or >= max_seq_len): one pass, no workspace.
  int split_positions = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

namespace matmul_internal {

// Number of splits per sequence the launch uses (1 when not splitting).
int PagedAttentionSplits(const PagedAttentionDecodeArgs& args);
// Arguments already validated by the caller (scale and page_stride filled in).
cudaError_t LaunchPagedAttentionDecode(const PagedAttentionDecodeArgs& args,
                                       cudaStream_t stream);

}  // namespace matmul_internal
}  // namespace estuary::cuda
