// The W4A16 kernel. One warp computes kRowsPerWarp output rows for a tile of T tokens: lane l
// walks the 32-column chunks l, l + 32, ... of its rows, so that a warp's 16-byte loads of one
// row are 512 contiguous bytes. Per chunk (one group: 32 | group_size) it sums Σ q·x and Σ x in
// f32 and adds s·Σqx + m·Σx to the row's accumulator; lanes are reduced with shuffles at the
// end. Token tiles beyond the first re-read the weights (from L2 for the 1B shapes). With a row
// mask, tiles hold only the wanted rows (SelectRowTile) and blocks of empty tiles return first.
// One launch may hold up to three matrices with the same columns (a table of segments passed by
// value, grid.x split between them; a segment's rows are computed exactly as when it is alone),
// and the activations are read through a load policy (activation_load.cuh: f32, bf16, or
// silu(gate) * up computed on load).

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/kernels/cuda/activation_load.cuh"
#include "core/kernels/cuda/int4_matmul_kernel.h"

namespace estuary::cuda::matmul_internal {
namespace {

using kernel_math::Bf16Activations;
using kernel_math::F32Activations;
using kernel_math::SwiGluActivations;

constexpr int kRowsPerWarp = 4;
constexpr int kWarpsPerBlock = 4;
constexpr int kRowsPerBlock = kRowsPerWarp * kWarpsPerBlock;

__device__ __forceinline__ unsigned Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The weights of up to kMaxInt4Segments matrices of the same cols / group_size, passed by value.
// Segment s owns blocks [first_block[s], first_block[s + 1]) of grid.x, kRowsPerBlock rows each.
struct Int4Table {
  const uint4* nibbles[kMaxInt4Segments];
  const __half* scales[kMaxInt4Segments];
  const __half* offsets[kMaxInt4Segments];
  float multiplier[kMaxInt4Segments];
  int rows[kMaxInt4Segments];
  float* y[kMaxInt4Segments];
  int first_block[kMaxInt4Segments + 1];
  int n_segments;
};

template <int T, typename Load>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    Int4MatMulKernel(Int4Table table, int cols, int group_size, int n_groups, Load load,
                     int n_tokens, const int32_t* __restrict__ row_path, int32_t want_path) {
  __shared__ int tile_rows[T];
  __shared__ int warp_counts[32];
  const int nt = SelectRowTile<T>(row_path, want_path, n_tokens, static_cast<int>(blockIdx.y),
                                  tile_rows, warp_counts);
  if (nt == 0) return;  // the whole block: no wanted row in this tile
  // The block's segment (first_block[s] is the block count for s >= n_segments). Its fields are
  // read where they are used (y only at the end), to keep register pressure low.
  static_assert(kMaxInt4Segments == 3, "the segment search below");
  const int block = static_cast<int>(blockIdx.x);
  const int seg = block >= table.first_block[2] ? 2 : block >= table.first_block[1] ? 1 : 0;
  const uint4* __restrict__ nibbles = PickSegment(table.nibbles, seg);
  const __half* __restrict__ scales = PickSegment(table.scales, seg);
  const __half* __restrict__ offsets = PickSegment(table.offsets, seg);
  const float multiplier = PickSegment(table.multiplier, seg);
  const int rows = PickSegment(table.rows, seg);
  const int local_block = block - PickSegment(table.first_block, seg);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row0 = (local_block * kWarpsPerBlock + warp) * kRowsPerWarp;
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
        s[r] = __fmul_rn(__half2float(scales[pi]), multiplier);
        m[r] = __fmul_rn(__half2float(offsets[pi]), multiplier);
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
          load.Load8(static_cast<int64_t>(tile_rows[t]) * cols + k * 32 + w * 8, xv[t]);
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
      for (int t = 0; t < T; ++t) {
        // Explicit rounding steps (never contracted differently by the compiler): the same
        // arithmetic in every instantiation, whatever the load policy.
        acc[r][t] = __fadd_rn(acc[r][t], __fmaf_rn(s[r], qx[r][t], __fmul_rn(m[r], sx[t])));
      }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = acc[r][t];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && row0 + r < rows && t < nt) {
        PickSegment(table.y, seg)[static_cast<int64_t>(tile_rows[t]) * rows + row0 + r] = v;
      }
    }
  }
}

template <int T, typename Load>
cudaError_t Launch(const Int4Table& table, const Int4GpuView& shape, Load load, int64_t n_tokens,
                   const int32_t* row_path, int32_t want_path, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(table.first_block[table.n_segments]),
                  static_cast<unsigned>((n_tokens + T - 1) / T));
  Int4MatMulKernel<T, Load><<<grid, kWarpsPerBlock * 32, 0, stream>>>(
      table, static_cast<int>(shape.cols), static_cast<int>(shape.group_size),
      static_cast<int>(shape.n_groups), load, static_cast<int>(n_tokens), row_path, want_path);
  return cudaGetLastError();
}

// The token tile size depends on n_tokens only.
template <typename Load>
cudaError_t LaunchTiled(const Int4Table& table, const Int4GpuView& shape, Load load,
                        int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                        cudaStream_t stream) {
  if (n_tokens <= 1) return Launch<1>(table, shape, load, n_tokens, row_path, want_path, stream);
  if (n_tokens <= 2) return Launch<2>(table, shape, load, n_tokens, row_path, want_path, stream);
  if (n_tokens <= 4) return Launch<4>(table, shape, load, n_tokens, row_path, want_path, stream);
  return Launch<8>(table, shape, load, n_tokens, row_path, want_path, stream);
}

}  // namespace

cudaError_t LaunchInt4MatMulMulti(const Int4GpuView* w, float* const* y, int n_segments,
                                  const void* x, const float* x_up, Int4Input input,
                                  int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                                  cudaStream_t stream) {
  if (n_tokens <= 0) return cudaSuccess;
  if (n_segments < 1 || n_segments > kMaxInt4Segments) return cudaErrorInvalidValue;
  Int4Table table{};
  table.n_segments = n_segments;
  int blocks = 0;
  for (int s = 0; s < n_segments; ++s) {
    table.nibbles[s] = static_cast<const uint4*>(w[s].nibbles);
    table.scales[s] = reinterpret_cast<const __half*>(w[s].scales);
    table.offsets[s] = reinterpret_cast<const __half*>(w[s].offsets);
    table.multiplier[s] = w[s].multiplier;
    table.rows[s] = static_cast<int>(w[s].rows);
    table.y[s] = y[s];
    table.first_block[s] = blocks;
    blocks += static_cast<int>((w[s].rows + kRowsPerBlock - 1) / kRowsPerBlock);
  }
  for (int s = n_segments; s <= kMaxInt4Segments; ++s) table.first_block[s] = blocks;
  if (blocks == 0) return cudaSuccess;
  switch (input) {
    case Int4Input::kF32:
      return LaunchTiled(table, w[0], F32Activations{static_cast<const float*>(x)}, n_tokens,
                         row_path, want_path, stream);
    case Int4Input::kBf16:
      return LaunchTiled(table, w[0], Bf16Activations{static_cast<const uint16_t*>(x)}, n_tokens,
                         row_path, want_path, stream);
    case Int4Input::kSwiGluF32:
      return LaunchTiled(table, w[0], SwiGluActivations{static_cast<const float*>(x), x_up},
                         n_tokens, row_path, want_path, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchInt4MatMulRows(const Int4GpuView& w, const void* x, bool x_is_bf16,
                                 int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                                 float* y, cudaStream_t stream) {
  return LaunchInt4MatMulMulti(&w, &y, /*n_segments=*/1, x, /*x_up=*/nullptr,
                               x_is_bf16 ? Int4Input::kBf16 : Int4Input::kF32, n_tokens,
                               row_path, want_path, stream);
}

cudaError_t LaunchInt4MatMul(const Int4GpuView& w, const void* x, bool x_is_bf16,
                             int64_t n_tokens, float* y, cudaStream_t stream) {
  return LaunchInt4MatMulRows(w, x, x_is_bf16, n_tokens, /*row_path=*/nullptr, /*want_path=*/0, y,
                              stream);
}

}  // namespace estuary::cuda::matmul_internal
