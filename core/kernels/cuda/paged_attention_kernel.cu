// Paged-attention decode. One block of kWarps warps per (query head, sequence, split); warp w
// takes positions begin + w, begin + w + kWarps, ... and keeps an online softmax (running max m,
// running sum l, unnormalized output acc) with lane j holding dims j, j + 32, ... of the head.
// The warps are merged in shared memory; with one split the block writes acc / l, otherwise it
// writes (acc, m, l) of its split to the workspace and MergeSplitsKernel combines the splits.
// Each query head reads its KV head's rows itself (GQA groups share them through L2).

#include <cuda_runtime.h>

#include <climits>

#include "core/kernels/cuda/paged_attention_kernel.h"

namespace estuary::cuda::matmul_internal {
namespace {

constexpr int kWarps = 4;

template <int P>  // dims per lane: ceil(head_dim / 32)
__global__ void __launch_bounds__(kWarps * 32)
    PagedDecodeKernel(const float* __restrict__ q, const float* __restrict__ kv,
                      int64_t page_stride, const int32_t* __restrict__ page_table,
                      int page_table_stride, const int32_t* __restrict__ seq_lens, int n_heads,
                      int n_kv_heads, int head_dim, int block_size, float scale,
                      int split_positions, int n_splits, float* __restrict__ out,
                      float* __restrict__ part_o, float* __restrict__ part_ml) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int split = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int len = seq_lens[seq];
  const int begin = split * split_positions;
  const int end = min(len, begin + split_positions);
  const int kvh = head / (n_heads / n_kv_heads);

  const float* qh = q + (static_cast<int64_t>(seq) * n_heads + head) * head_dim;
  float qv[P];
  float acc[P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int d = lane + 32 * i;
    qv[i] = d < head_dim ? qh[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  const int32_t* pages = page_table + static_cast<int64_t>(seq) * page_table_stride;
  const int64_t k_off = static_cast<int64_t>(kvh) * block_size * head_dim;
  const int64_t v_off = static_cast<int64_t>(n_kv_heads + kvh) * block_size * head_dim;

  for (int p = begin + warp; p < end; p += kWarps) {
    const float* base = kv + static_cast<int64_t>(pages[p / block_size]) * page_stride +
                        static_cast<int64_t>(p % block_size) * head_dim;
    const float* krow = base + k_off;
    const float* vrow = base + v_off;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) dot = fmaf(qv[i], krow[d], dot);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = dot * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first position (m = -inf)
    const float e = expf(s - m_new);
    l = l * corr + e;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < head_dim ? e * vrow[d] : 0.0f);
    }
    m = m_new;
  }

  __shared__ float sm[kWarps];
  __shared__ float sl[kWarps];
  __shared__ float sacc[kWarps][P * 32];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < P; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();

  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w]);
  float weight[kWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - mx);
    total += sl[w] * weight[w];
  }
  const int64_t row = static_cast<int64_t>(seq) * n_heads + head;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += sacc[w][d] * weight[w];
    if (part_o == nullptr) {
      out[row * head_dim + d] = total > 0.0f ? o / total : 0.0f;
    } else {
      part_o[(row * n_splits + split) * head_dim + d] = o;
    }
  }
  if (part_o != nullptr && threadIdx.x == 0) {
    part_ml[(row * n_splits + split) * 2] = mx;
    part_ml[(row * n_splits + split) * 2 + 1] = total;
  }
}

// One block per (query head, sequence): out = Σ_s o_s e^{m_s - M} / Σ_s l_s e^{m_s - M}.
__global__ void MergeSplitsKernel(const float* __restrict__ part_o,
                                  const float* __restrict__ part_ml, int n_heads, int head_dim,
                                  int n_splits, float* __restrict__ out) {
  const int64_t row = static_cast<int64_t>(blockIdx.y) * n_heads + blockIdx.x;
  const float* ml = part_ml + row * n_splits * 2;
  float mx = -INFINITY;
  for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, ml[2 * s]);
  float total = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    if (ml[2 * s] != -INFINITY) total += ml[2 * s + 1] * expf(ml[2 * s] - mx);
  }
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      if (ml[2 * s] != -INFINITY) {
        o += part_o[(row * n_splits + s) * head_dim + d] * expf(ml[2 * s] - mx);
      }
    }
    out[row * head_dim + d] = total > 0.0f ? o / total : 0.0f;
  }
}

template <int P>
cudaError_t LaunchP(const PagedAttentionDecodeArgs& a, int n_splits, int split_positions,
                    float* part_o, float* part_ml, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.n_seq),
                  static_cast<unsigned>(n_splits));
  PagedDecodeKernel<P><<<grid, kWarps * 32, 0, stream>>>(
      a.q, a.kv_layer, a.page_stride, a.page_table, a.page_table_stride, a.seq_lens, a.n_heads,
      a.n_kv_heads, a.head_dim, a.block_size, a.scale, split_positions, n_splits, a.out, part_o,
      part_ml);
  return cudaGetLastError();
}

}  // namespace

int PagedAttentionSplits(const PagedAttentionDecodeArgs& a) {
  if (a.split_positions <= 0 || a.split_positions >= a.max_seq_len) return 1;
  return (a.max_seq_len + a.split_positions - 1) / a.split_positions;
}

cudaError_t LaunchPagedAttentionDecode(const PagedAttentionDecodeArgs& a, cudaStream_t stream) {
  if (a.n_seq <= 0 || a.n_heads <= 0) return cudaSuccess;
  const int n_splits = PagedAttentionSplits(a);
  const int split_positions = n_splits == 1 ? INT_MAX / 2 : a.split_positions;
  float* part_o = nullptr;
  float* part_ml = nullptr;
  if (n_splits > 1) {
    part_o = static_cast<float*>(a.workspace);
    part_ml = part_o + static_cast<int64_t>(a.n_seq) * a.n_heads * n_splits * a.head_dim;
  }
  cudaError_t err = cudaSuccess;
  switch ((a.head_dim + 31) / 32) {
    case 1: err = LaunchP<1>(a, n_splits, split_positions, part_o, part_ml, stream); break;
    case 2: err = LaunchP<2>(a, n_splits, split_positions, part_o, part_ml, stream); break;
    case 3: err = LaunchP<3>(a, n_splits, split_positions, part_o, part_ml, stream); break;
    case 4: err = LaunchP<4>(a, n_splits, split_positions, part_o, part_ml, stream); break;
    case 5: err = LaunchP<5>(a, n_splits, split_positions, part_o, part_ml, stream); break;
    case 6: err = LaunchP<6>(a, n_splits, split_positions, part_o, part_ml, stream); break;
    case 7: err = LaunchP<7>(a, n_splits, split_positions, part_o, part_ml, stream); break;
    case 8: err = LaunchP<8>(a, n_splits, split_positions, part_o, part_ml, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || n_splits == 1) return err;
  const dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.n_seq));
  MergeSplitsKernel<<<grid, 128, 0, stream>>>(part_o, part_ml, a.n_heads, a.head_dim, n_splits,
                                              a.out);
  return cudaGetLastError();
}

}  // namespace estuary::cuda::matmul_internal
