#pragma once
// Paged-attention decode on the GPU: one query token per sequence attends to positions
// [0, seq_lens[i]) of its K/V, read through a page table from a pool laid out per layer as
// [page][K|V][kv_head][slot][head_dim] f32 (KvPool's layout, kv_layout.h). The math is the CPU
// PagedAttention's (core/kvcache/paged_attention.h) for n_queries = 1, start_pos = seq_len - 1:
// scale 1/sqrt(head_dim), f32 softmax, query head h reads KV head h / (n_heads / n_kv_heads).
//
//   q:   [n_seq][n_heads][head_dim]     out: [n_seq][n_heads][head_dim]  (must not alias q)
//   position p of sequence i: page page_table[i * page_table_stride + p / block_size], slot
//   p % block_size; K of KV head h at kv_layer + page * page_stride + (h * block_size + slot) *
//   head_dim, V at the same plus n_kv_heads * block_size * head_dim.
//
// Kernel (paged_attention_kernel.cu): one block of 4 warps per (query head, sequence, split),
// online softmax per warp (expf, f32), merged in shared memory. With split_positions > 0 each
// sequence is cut into chunks of that many positions (flash-decoding) and a second kernel merges
// the chunks' (output, max, sum); this pays off when n_seq · n_heads is below the GPU's SM count
// and contexts are long. A sequence of length 0 gets zeros. Not tuned; never run on a GPU.
//
// Tolerance (paged_attention_test, K/V/q uniform in [-1, 1]): |out - out_cpu| <= 1e-4 absolute.
//
// Thread-safety: asynchronous on `stream`; the caller keeps the inputs alive and unchanged until
// the stream has run it, and a workspace serves one call at a time.

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "core/kernels/cuda/paged_attention_kernel.h"

namespace estuary::cuda {

// Workspace bytes PagedAttentionDecode needs for `args` (0 when it does not split). Depends on
// n_seq, n_heads, head_dim, max_seq_len and split_positions only.
size_t PagedAttentionDecodeWorkspaceBytes(const PagedAttentionDecodeArgs& args);

// Launches the decode attention. INVALID_ARGUMENT for null pointers, head_dim outside 1..256,
// n_heads not a multiple of n_kv_heads, non-positive block_size, a page_table_stride below
// ceil(max_seq_len / block_size), grid dimensions beyond CUDA's limits, or a workspace that is
// missing or too small when splitting; INTERNAL with the CUDA error name when a launch fails.
// Preconditions not checked (device data): 0 <= seq_lens[i] <= max_seq_len, and the page ids
// of the first ceil(seq_lens[i] / block_size) entries of each row are valid pages of kv_layer.
[[nodiscard]] absl::Status PagedAttentionDecode(const PagedAttentionDecodeArgs& args,
                                                cudaStream_t stream);

}  // namespace estuary::cuda
