// The W4A16 kernel. One warp computes kRowsPerWarp output rows for a tile of T tokens: lane l
// walks the 32-column chunks l, l + 32, ... of its rows, so that a warp's 16-byte loads of one
// row are 512 contiguous bytes. Per chunk (one group: 32 | group_size) it sums Σ q·x and Σ x in
// f32 and adds s·Σqx + m·Σx to the row's accumulator; lanes are reduced with shuffles at the
// end. Token tiles beyond the first re-read the weights (from L2 for the 1B shapes). With a row
// mask, tiles hold only the wanted rows (SelectRowTile) and blocks of empty tiles return first.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/kernels/cuda/int4_matmul_kernel.h"

namespace estuary::cuda::matmul_internal {
namespace {

constexpr int kRowsPerWarp = 4;
constexpr int kWarpsPerBlock = 4;

// Eight consecutive activations (16-byte aligned) as f32.
__device__ __forceinline__ void Load8(const float* p, float (&out)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
__device__ __forceinline__ void Load8(const uint16_t* p, float (&out)[8]) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ unsigned Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int T, typename XT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    Int4MatMulKernel(const uint4* __restrict__ nibbles, const __half* __restrict__ scales,
                     const __half* __restrict__ offsets, float multiplier, int rows, int cols,
                     int group_size, int n_groups, const XT* __restrict__ x, int n_tokens,
                     const int32_t* __restrict__ row_path, int32_t want_path,
                     float* __restrict__ y) {
  __shared__ int tile_rows[T];
  __shared__ int warp_counts[32];
  const int nt = SelectRowTile<T>(row_path, want_path, n_tokens, static_cast<int>(blockIdx.y),
                                  tile_rows, warp_counts);
  if (nt == 0) return;  // the whole block: no wanted row in this tile
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWarpsPerBlock + warp) * kRowsPerWarp;
  if (row0 >= rows) return;  // the whole warp
  const int chunks = cols / 32;

  float acc[kRowsPerWarp][T];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;

  for (int k = lane; k < chunks; k += 32) {
    uint4 wq[kRowsPerWarp];
    float s[kRowsPerWarp];
    float m[kRowsPerWarp];
    const int g = k * 32 / group_size;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = row0 + r;
      if (row < rows) {
        wq[r] = __ldg(nibbles + static_cast<int64_t>(row) * chunks + k);
        const int64_t pi = static_cast<int64_t>(row) * n_groups + g;
        s[r] = __half2float(scales[pi]) * multiplier;
        m[r] = __half2float(offsets[pi]) * multiplier;
      } else {
        wq[r] = make_uint4(0, 0, 0, 0);
        s[r] = 0.0f;
        m[r] = 0.0f;
      }
    }
    float qx[kRowsPerWarp][T];
    float sx[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      sx[t] = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) qx[r][t] = 0.0f;
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float xv[T][8];
#pragma unroll
      for (int t = 0; t < T; ++t) {
        if (t < nt) {
          Load8(x + static_cast<int64_t>(tile_rows[t]) * cols + k * 32 + w * 8, xv[t]);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) xv[t][j] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) sx[t] += xv[t][j];
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const unsigned word = Word(wq[r], w);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float q = static_cast<float>((word >> (4 * j)) & 15u);
#pragma unroll
          for (int t = 0; t < T; ++t) qx[r][t] = fmaf(q, xv[t][j], qx[r][t]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] += s[r] * qx[r][t] + m[r] * sx[t];
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = acc[r][t];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && row0 + r < rows && t < nt) {
        y[static_cast<int64_t>(tile_rows[t]) * rows + row0 + r] = v;
      }
    }
  }
}

template <int T, typename XT>
cudaError_t Launch(const Int4GpuView& w, const XT* x, int64_t n_tokens, const int32_t* row_path,
                   int32_t want_path, float* y, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kRowsPerWarp * kWarpsPerBlock;
  const dim3 grid(static_cast<unsigned>((w.rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((n_tokens + T - 1) / T));
  Int4MatMulKernel<T, XT><<<grid, kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const uint4*>(w.nibbles), reinterpret_cast<const __half*>(w.scales),
      reinterpret_cast<const __half*>(w.offsets), w.multiplier, static_cast<int>(w.rows),
      static_cast<int>(w.cols), static_cast<int>(w.group_size), static_cast<int>(w.n_groups), x,
      static_cast<int>(n_tokens), row_path, want_path, y);
  return cudaGetLastError();
}

template <typename XT>
cudaError_t LaunchTyped(const Int4GpuView& w, const XT* x, int64_t n_tokens,
                        const int32_t* row_path, int32_t want_path, float* y,
                        cudaStream_t stream) {
  if (n_tokens <= 1) return Launch<1>(w, x, n_tokens, row_path, want_path, y, stream);
  if (n_tokens <= 2) return Launch<2>(w, x, n_tokens, row_path, want_path, y, stream);
  if (n_tokens <= 4) return Launch<4>(w, x, n_tokens, row_path, want_path, y, stream);
  return Launch<8>(w, x, n_tokens, row_path, want_path, y, stream);
}

}  // namespace

cudaError_t LaunchInt4MatMulRows(const Int4GpuView& w, const void* x, bool x_is_bf16,
                                 int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                                 float* y, cudaStream_t stream) {
  if (n_tokens <= 0 || w.rows <= 0) return cudaSuccess;
  if (x_is_bf16) {
    return LaunchTyped(w, static_cast<const uint16_t*>(x), n_tokens, row_path, want_path, y,
                       stream);
  }
  return LaunchTyped(w, static_cast<const float*>(x), n_tokens, row_path, want_path, y, stream);
}

cudaError_t LaunchInt4MatMul(const Int4GpuView& w, const void* x, bool x_is_bf16,
                             int64_t n_tokens, float* y, cudaStream_t stream) {
  return LaunchInt4MatMulRows(w, x, x_is_bf16, n_tokens, /*row_path=*/nullptr, /*want_path=*/0, y,
                              stream);
}

}  // namespace estuary::cuda::matmul_internal
