// The kernels behind decode_step_kernels.h (launchers in decode_step_kernels_launch.h).
// Arguments were validated by decode_step_kernels.cc; these functions only size grids and launch.
// Launch shapes depend on sizes only (never on device data), so the calls can be captured in a
// CUDA graph and replayed with new row paths, positions and page tables.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/kernels/cuda/decode_step_kernels_launch.h"
#include "core/kernels/cuda/int4_matmul_kernel.h"

namespace estuary::cuda::decode_step_internal {
namespace {

using matmul_internal::SelectRowTile;

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

__device__ __forceinline__ float WarpMin(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fminf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// --- Dense row-masked product -----------------------------------------------------------------
//
// Block = 4 output rows × one tile of up to T wanted tokens; its warps split the input dimension
// in 8-element chunks (thread i takes chunks i, i + blockDim.x, ...: a block's loads of one row
// are contiguous). Per chunk each thread loads 8 weights of each of its 4 rows (16-byte loads)
// and, per token of the tile, 8 activations, and accumulates with fmaf. Lanes are reduced with
// shuffles, warps through shared memory in warp order.

constexpr int kDenseRows = 4;
constexpr int kDenseMaxWarps = 8;
constexpr int64_t kDenseTargetWarps = 2048;  // about 16 resident warps on each of 132 SMs

// Eight f32 activations from 16-byte aligned memory.
__device__ __forceinline__ void LoadX8(const float* p, float (&out)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// Eight weights starting at element `elem` (a multiple of 8) as f32.
template <DenseKind kKind>
__device__ __forceinline__ void LoadW8(const void* w, int64_t elem, float (&out)[8]) {
  if constexpr (kKind == DenseKind::kF32) {
    LoadX8(static_cast<const float*>(w) + elem, out);
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w) + elem));
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Little-endian: element 2i is the low half of word i.
      if constexpr (kKind == DenseKind::kBf16) {
        out[2 * i] = __uint_as_float(words[i] << 16);
        out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      } else {
        const auto lo = static_cast<unsigned short>(words[i] & 0xffffu);
        const auto hi = static_cast<unsigned short>(words[i] >> 16);
        out[2 * i] = __half2float(__ushort_as_half(lo));
        out[2 * i + 1] = __half2float(__ushort_as_half(hi));
      }
    }
  }
}

template <DenseKind kKind, int T>
__global__ void __launch_bounds__(kDenseMaxWarps * kWarpSize)
    DenseRowsKernel(const void* __restrict__ w, int out_features, int in_features,
                    const float* __restrict__ x, int n_tokens, const int32_t* __restrict__ row_path,
                    int32_t want_path, float* __restrict__ y) {
  __shared__ int tile_rows[T];
  __shared__ int warp_counts[kWarpSize];
  __shared__ float partial[kDenseMaxWarps][kDenseRows][T];
  const int nt = SelectRowTile<T>(row_path, want_path, n_tokens, static_cast<int>(blockIdx.y),
                                  tile_rows, warp_counts);
  if (nt == 0) return;  // the whole block, before any weight is read

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
  const int row0 = static_cast<int>(blockIdx.x) * kDenseRows;
  // Rows past out_features repeat the last row: computed, never written.
  int64_t w_base[kDenseRows];
#pragma unroll
  for (int r = 0; r < kDenseRows; ++r) {
    w_base[r] = static_cast<int64_t>(min(row0 + r, out_features - 1)) * in_features;
  }
  int64_t x_base[T];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    x_base[t] = static_cast<int64_t>(tile_rows[t < nt ? t : nt - 1]) * in_features;
  }

  float acc[kDenseRows][T];
#pragma unroll
  for (int r = 0; r < kDenseRows; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;

  const int chunks = in_features / 8;
#pragma unroll 2
  for (int c = static_cast<int>(threadIdx.x); c < chunks; c += static_cast<int>(blockDim.x)) {
    const int64_t col = static_cast<int64_t>(c) * 8;
    float wv[kDenseRows][8];
#pragma unroll
    for (int r = 0; r < kDenseRows; ++r) LoadW8<kKind>(w, w_base[r] + col, wv[r]);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < nt) {  // uniform over the block
        float xv[8];
        LoadX8(x + x_base[t] + col, xv);
#pragma unroll
        for (int r = 0; r < kDenseRows; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(wv[r][j], xv[j], acc[r][t]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kDenseRows; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float v = WarpSum(acc[r][t]);
      if (lane == 0) partial[warp][r][t] = v;
    }
  __syncthreads();
  if (threadIdx.x < kDenseRows * T) {
    const int r = static_cast<int>(threadIdx.x) / T;
    const int t = static_cast<int>(threadIdx.x) % T;
    if (t < nt && row0 + r < out_features) {
      float sum = partial[0][r][t];
      for (int wi = 1; wi < n_warps; ++wi) sum += partial[wi][r][t];
      y[static_cast<int64_t>(tile_rows[t]) * out_features + row0 + r] = sum;
    }
  }
}

template <DenseKind kKind, int T>
cudaError_t LaunchDense(const void* w, int64_t out_features, int64_t in_features, const float* x,
                        int64_t n_tokens, const int32_t* row_path, int32_t want_path, float* y,
                        cudaStream_t stream) {
  const int64_t groups = (out_features + kDenseRows - 1) / kDenseRows;
  const int64_t chunks = in_features / 8;
  // Split the input dimension over more warps while the grid is small, as long as every lane
  // keeps at least one chunk. Depends on the shape only: results are reproducible.
  int warps = 1;
  while (warps < kDenseMaxWarps && groups * warps < kDenseTargetWarps &&
         int64_t{warps} * 2 * kWarpSize <= chunks) {
    warps *= 2;
  }
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>((n_tokens + T - 1) / T));
  DenseRowsKernel<kKind, T><<<grid, warps * kWarpSize, 0, stream>>>(
      w, static_cast<int>(out_features), static_cast<int>(in_features), x,
      static_cast<int>(n_tokens), row_path, want_path, y);
  return cudaGetLastError();
}

template <DenseKind kKind>
cudaError_t LaunchDenseKind(const void* w, int64_t out_features, int64_t in_features,
                            const float* x, int64_t n_tokens, const int32_t* row_path,
                            int32_t want_path, float* y, cudaStream_t stream) {
  if (n_tokens <= 1) {
    return LaunchDense<kKind, 1>(w, out_features, in_features, x, n_tokens, row_path, want_path, y,
                                 stream);
  }
  if (n_tokens <= 2) {
    return LaunchDense<kKind, 2>(w, out_features, in_features, x, n_tokens, row_path, want_path, y,
                                 stream);
  }
  if (n_tokens <= 4) {
    return LaunchDense<kKind, 4>(w, out_features, in_features, x, n_tokens, row_path, want_path, y,
                                 stream);
  }
  return LaunchDense<kKind, 8>(w, out_features, in_features, x, n_tokens, row_path, want_path, y,
                               stream);
}

// --- KV rows into pages -----------------------------------------------------------------------

constexpr int kKvThreads = 128;

__global__ void WriteKvRowsKernel(const float* __restrict__ k, const float* __restrict__ v,
                                  const int32_t* __restrict__ positions,
                                  const int32_t* __restrict__ page_table, int page_table_stride,
                                  float* __restrict__ kv_layer, int64_t num_pages, int n_kv_heads,
                                  int block_size, int head_dim, int32_t* error_flag) {
  const int64_t t = blockIdx.x;
  const int pos = positions[t];
  if (pos < 0) return;  // padding row
  const int logical = pos / block_size;
  const int64_t page =
      logical < page_table_stride ? page_table[t * page_table_stride + logical] : int64_t{-1};
  if (page < 0 || page >= num_pages) {
    if (error_flag != nullptr && threadIdx.x == 0) *error_flag = 1;
    return;
  }
  const int slot = pos % block_size;
  const int64_t row_floats = static_cast<int64_t>(n_kv_heads) * head_dim;
  const int64_t head_floats = static_cast<int64_t>(block_size) * head_dim;
  float* page_base = kv_layer + page * 2 * n_kv_heads * head_floats;
  const float* k_row = k + t * row_floats;
  const float* v_row = v + t * row_floats;
  for (int64_t i = threadIdx.x; i < 2 * row_floats; i += blockDim.x) {
    const bool is_v = i >= row_floats;
    const int64_t j = is_v ? i - row_floats : i;
    const int64_t head = j / head_dim;
    const int64_t d = j % head_dim;
    const int64_t dst = ((is_v ? n_kv_heads : 0) + head) * head_floats +
                        static_cast<int64_t>(slot) * head_dim + d;
    page_base[dst] = is_v ? v_row[j] : k_row[j];
  }
}

// --- Exit decision ----------------------------------------------------------------------------

constexpr int kMaxExitRows = 1024;
constexpr int kSimThreads = 256;

// An unsigned key with the order of the floats (NaN must be replaced first): integer atomicMin
// on keys is an exact, order-independent float min.
__device__ __forceinline__ unsigned OrderedKey(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float FromOrderedKey(unsigned key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? (key & 0x7fffffffu) : ~key);
}
__device__ __forceinline__ float NanTo(float f, float replacement) {
  return f != f ? replacement : f;
}

// This thread's share of (a·b, a·a, b·b) over elements first, first + stride, ... (in float4
// units when kVec4; dim % 4 == 0 and both rows 16-byte aligned then).
template <bool kVec4>
__device__ __forceinline__ void CosineSums(const float* __restrict__ a, const float* __restrict__ b,
                                           int64_t dim, int64_t first, int64_t stride,
                                           float (&sums)[3]) {
  if constexpr (kVec4) {
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
#pragma unroll 4
    for (int64_t i = first; i < dim / 4; i += stride) {
      const float4 p = __ldg(a4 + i);
      const float4 q = __ldg(b4 + i);
      const float pa[4] = {p.x, p.y, p.z, p.w};
      const float qa[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sums[0] = fmaf(pa[j], qa[j], sums[0]);
        sums[1] = fmaf(pa[j], pa[j], sums[1]);
        sums[2] = fmaf(qa[j], qa[j], sums[2]);
      }
    }
  } else {
#pragma unroll 4
    for (int64_t i = first; i < dim; i += stride) {
      const float p = __ldg(a + i);
      const float q = __ldg(b + i);
      sums[0] = fmaf(p, q, sums[0]);
      sums[1] = fmaf(p, p, sums[1]);
      sums[2] = fmaf(q, q, sums[2]);
    }
  }
}

// cos from the sums; 0 when either vector is zero (kernels::cpu::CosineSimilarity). The square
// roots are separate so that the product of two large sums cannot overflow.
__device__ __forceinline__ float CosineFromSums(const float (&sums)[3]) {
  if (sums[1] == 0.0f || sums[2] == 0.0f) return 0.0f;
  return sums[0] / (sqrtf(sums[1]) * sqrtf(sums[2]));
}

// One block of kSimThreads per row: similarity[t] = cos(layer_in[t], layer_out[t]) for the
// backbone rows.
template <bool kVec4>
__global__ void __launch_bounds__(kSimThreads) RowSimilarityKernel(ExitKernelArgs a) {
  __shared__ float scratch[3][kWarpSize];
  const int64_t t = blockIdx.x;
  if (a.row_path[t] != kPathBackbone) return;  // uniform over the block
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  float sums[3] = {0.0f, 0.0f, 0.0f};
  CosineSums<kVec4>(a.layer_in + t * a.dim, a.layer_out + t * a.dim, a.dim, threadIdx.x,
                    blockDim.x, sums);
#pragma unroll
  for (int q = 0; q < 3; ++q) {
    sums[q] = WarpSum(sums[q]);
    if (lane == 0) scratch[q][warp] = sums[q];
  }
  __syncthreads();
  if (warp == 0) {
    const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
#pragma unroll
    for (int q = 0; q < 3; ++q) sums[q] = WarpSum(lane < n_warps ? scratch[q][lane] : 0.0f);
    if (lane == 0) a.similarity[t] = CosineFromSums(sums);
  }
}

// One block, blockDim.x >= n_rows (thread t owns row t). kFused: the block also computes the
// cosines (into shared memory), with max(1, warps / n_rows) warps per row.
template <bool kFused, bool kVec4>
__global__ void ExitDecisionKernel(ExitKernelArgs a) {
  __shared__ float sim[kMaxExitRows];
  __shared__ unsigned group_s[kMaxExitRows];       // OrderedKey of min s (NaN ignored)
  __shared__ unsigned group_margin[kMaxExitRows];  // OrderedKey of min margin (NaN = -inf)
  __shared__ float partial[kMaxExitRows / kWarpSize][3];
  __shared__ float warp_min[kWarpSize];
  const int n = a.n_rows;
  const int t = static_cast<int>(threadIdx.x);
  const int warp = t / kWarpSize;
  const int lane = t % kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
  const float inf = __uint_as_float(0x7f800000u);

  if constexpr (kFused) {
    const int per_row = n_warps / n > 1 ? n_warps / n : 1;
    const int slots = n_warps / per_row;
    const int slot = warp / per_row;
    const int sub = warp % per_row;
    for (int row = slot; row < n && slot < slots; row += slots) {
      if (a.row_path[row] != kPathBackbone) continue;  // uniform over the warp
      float sums[3] = {0.0f, 0.0f, 0.0f};
      CosineSums<kVec4>(a.layer_in + row * a.dim, a.layer_out + row * a.dim, a.dim,
                        int64_t{sub} * kWarpSize + lane, int64_t{per_row} * kWarpSize, sums);
#pragma unroll
      for (int q = 0; q < 3; ++q) sums[q] = WarpSum(sums[q]);
      if (lane == 0) {
        if (per_row == 1) {
          sim[row] = CosineFromSums(sums);
        } else {
#pragma unroll
          for (int q = 0; q < 3; ++q) partial[warp][q] = sums[q];
        }
      }
    }
    if (per_row > 1) {
      __syncthreads();
      if (t < n && a.row_path[t] == kPathBackbone) {
        float sums[3] = {0.0f, 0.0f, 0.0f};
        for (int j = 0; j < per_row; ++j) {
#pragma unroll
          for (int q = 0; q < 3; ++q) sums[q] += partial[t * per_row + j][q];
        }
        sim[t] = CosineFromSums(sums);
      }
    }
  }

  const bool backbone = t < n && a.row_path[t] == kPathBackbone;
  int group = -1;  // -1: a group of its own (id out of range) or not a backbone row
  float tau = 0.0f;
  if (t < n) {
    group_s[t] = OrderedKey(inf);
    group_margin[t] = OrderedKey(inf);
  }
  if (backbone) {
    const int32_t g = a.row_group[t];
    group = g >= 0 && g < n ? g : -1;
    tau = a.thresholds[t];
  }
  __syncthreads();  // sim[] (fused) and the group minima's initial values
  float s = 0.0f;
  if (backbone) {
    if constexpr (kFused) {
      s = sim[t];
    } else {
      s = a.similarity[t];
    }
    if (group >= 0) atomicMin(&group_s[group], OrderedKey(NanTo(s, inf)));
  }
  __syncthreads();
  float margin = inf;  // s_group - tau of this row (NaN possible)
  if (backbone) {
    const float s_group = group >= 0 ? FromOrderedKey(group_s[group]) : NanTo(s, inf);
    margin = s_group - tau;
    if (group >= 0) atomicMin(&group_margin[group], OrderedKey(NanTo(margin, -inf)));
  }
  __syncthreads();

  bool leave = false;
  if (a.forced != 0) {
    leave = true;
  } else if (a.may_exit != 0) {
    if (a.rule == 0) {
      // Batch-min over the backbone rows' margins; a NaN margin is ignored, as std::min with
      // the running value first does on the CPU (so all-NaN leaves the minimum at +inf).
      float m = WarpMin(NanTo(margin, inf));
      if (lane == 0) warp_min[warp] = m;
      __syncthreads();
      m = WarpMin(lane < n_warps ? warp_min[lane] : inf);
      leave = m > 0.0f;
    } else {
      const float group_min =
          group >= 0 ? FromOrderedKey(group_margin[group]) : NanTo(margin, -inf);
      leave = group_min > 0.0f;
    }
  }
  if (backbone && leave) {
    a.row_path[t] = kPathRiver;
    a.backbone_layers[t] = a.next_layer;
  }
}

template <bool kVec4>
cudaError_t LaunchExit(const ExitKernelArgs& args, cudaStream_t stream) {
  if (args.similarity != nullptr) {
    RowSimilarityKernel<kVec4><<<static_cast<unsigned>(args.n_rows), kSimThreads, 0, stream>>>(
        args);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    const int threads = (args.n_rows + kWarpSize - 1) / kWarpSize * kWarpSize;
    ExitDecisionKernel<false, kVec4><<<1, threads, 0, stream>>>(args);
  } else {
    ExitDecisionKernel<true, kVec4><<<1, kMaxExitRows, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchDenseMatMulRows(const void* w, DenseKind kind, int64_t out_features,
                                  int64_t in_features, const float* x, int64_t n_tokens,
                                  const int32_t* row_path, int32_t want_path, float* y,
                                  cudaStream_t stream) {
  if (n_tokens <= 0 || out_features <= 0) return cudaSuccess;
  switch (kind) {
    case DenseKind::kF32:
      return LaunchDenseKind<DenseKind::kF32>(w, out_features, in_features, x, n_tokens,
                                              row_path, want_path, y, stream);
    case DenseKind::kBf16:
      return LaunchDenseKind<DenseKind::kBf16>(w, out_features, in_features, x, n_tokens,
                                               row_path, want_path, y, stream);
    case DenseKind::kF16:
      return LaunchDenseKind<DenseKind::kF16>(w, out_features, in_features, x, n_tokens,
                                              row_path, want_path, y, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchWriteKvRows(const float* k, const float* v, int64_t n_rows,
                              const int32_t* positions, const int32_t* page_table,
                              int page_table_stride, float* kv_layer, int64_t num_pages,
                              const PageShape& shape, int32_t* error_flag, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  WriteKvRowsKernel<<<static_cast<unsigned>(n_rows), kKvThreads, 0, stream>>>(
      k, v, positions, page_table, page_table_stride, kv_layer, num_pages, shape.n_kv_heads,
      shape.block_size, shape.head_dim, error_flag);
  return cudaGetLastError();
}

cudaError_t LaunchExitDecision(const ExitKernelArgs& args, cudaStream_t stream) {
  if (args.n_rows <= 0) return cudaSuccess;
  // Row t starts t * dim floats from each base: float4 loads need dim % 4 == 0 and 16-byte bases.
  const bool vec4 = args.dim % 4 == 0 && reinterpret_cast<uintptr_t>(args.layer_in) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(args.layer_out) % 16 == 0;
  return vec4 ? LaunchExit<true>(args, stream) : LaunchExit<false>(args, stream);
}

}  // namespace estuary::cuda::decode_step_internal
