// The kernels behind decode_step_kernels.h (launchers in decode_step_kernels_launch.h).
// Arguments were validated by decode_step_kernels.cc; these functions only size grids and launch.
// Launch shapes depend on sizes only (never on device data), so the calls can be captured in a
// CUDA graph and replayed with new row paths, positions and page tables.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/kernels/cuda/activation_load.cuh"
#include "core/kernels/cuda/decode_step_kernels_launch.h"
#include "core/kernels/cuda/elementwise_math.cuh"
#include "core/kernels/cuda/int4_matmul_kernel.h"

namespace estuary::cuda::decode_step_internal {
namespace {

using kernel_math::F32Activations;
using kernel_math::SwiGluActivations;
using matmul_internal::PickSegment;
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
// A row group = 4 output rows of one segment × one tile of up to T wanted tokens; its W warps
// split the input dimension in 8-element chunks (thread i of the group takes chunks i,
// i + 32W, ...: the group's loads of one row are contiguous). Per chunk each thread loads 8
// weights of each of its 4 rows (16-byte loads) and, per token of the tile, 8 activations through
// the load policy, and accumulates with fmaf. Lanes are reduced with shuffles, the group's warps
// through shared memory in warp order. W depends only on the segment's (out_features,
// in_features) (DenseWarps), so a row's reduction order is the same whether its segment is
// launched alone or with others. A block has max_s W_s warps and holds max / W_s row groups of
// its segment (one when launched alone): every warp has work.

constexpr int kDenseRows = 4;
constexpr int kDenseMaxWarps = 8;
constexpr int64_t kDenseTargetWarps = 2048;  // about 16 resident warps on each of 132 SMs

// Warps per row group: split the input dimension over more warps while the segment's grid is
// small, as long as every lane keeps at least one chunk. Depends on the shape only: results are
// reproducible, and the same in a multi-segment launch.
int DenseWarps(int64_t out_features, int64_t in_features) {
  const int64_t groups = (out_features + kDenseRows - 1) / kDenseRows;
  const int64_t chunks = in_features / 8;
  int warps = 1;
  while (warps < kDenseMaxWarps && groups * warps < kDenseTargetWarps &&
         int64_t{warps} * 2 * kWarpSize <= chunks) {
    warps *= 2;
  }
  return warps;
}

// Eight weights starting at element `elem` (a multiple of 8) as f32.
template <DenseKind kKind>
__device__ __forceinline__ void LoadW8(const void* w, int64_t elem, float (&out)[8]) {
  if constexpr (kKind == DenseKind::kF32) {
    kernel_math::LoadF32x8(static_cast<const float*>(w) + elem, out);
  } else if constexpr (kKind == DenseKind::kBf16) {
    kernel_math::LoadBf16x8(static_cast<const uint16_t*>(w) + elem, out);
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w) + elem));
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Little-endian: element 2i is the low half of word i.
      const auto lo = static_cast<unsigned short>(words[i] & 0xffffu);
      const auto hi = static_cast<unsigned short>(words[i] >> 16);
      out[2 * i] = __half2float(__ushort_as_half(lo));
      out[2 * i + 1] = __half2float(__ushort_as_half(hi));
    }
  }
}

// The segments of one launch, passed by value. Segment s owns blocks [first_block[s],
// first_block[s + 1]) of grid.x, each holding blockDim.x / 32 / warps[s] row groups.
struct DenseTable {
  const void* w[kMaxSegments];
  float* y[kMaxSegments];
  int out_features[kMaxSegments];
  int warps[kMaxSegments];
  int first_block[kMaxSegments + 1];
  int n_segments;
};

template <DenseKind kKind, int T, typename Load>
__global__ void __launch_bounds__(kDenseMaxWarps * kWarpSize)
    DenseRowsKernel(DenseTable table, int in_features, Load load, int n_tokens,
                    const int32_t* __restrict__ row_path, int32_t want_path) {
  __shared__ int tile_rows[T];
  __shared__ int warp_counts[kWarpSize];
  __shared__ float partial[kDenseMaxWarps][kDenseRows][T];
  const int nt = SelectRowTile<T>(row_path, want_path, n_tokens, static_cast<int>(blockIdx.y),
                                  tile_rows, warp_counts);
  if (nt == 0) return;  // the whole block, before any weight is read

  // This block's segment (first_block[s] is the block count for s >= n_segments). Its fields are
  // read where they are used (y only at the end), to keep register pressure low.
  static_assert(kMaxSegments == 3, "the segment search below");
  const int block = static_cast<int>(blockIdx.x);
  const int seg = block >= table.first_block[2] ? 2 : block >= table.first_block[1] ? 1 : 0;
  const void* __restrict__ w = PickSegment(table.w, seg);
  const int out_features = PickSegment(table.out_features, seg);
  const int seg_warps = PickSegment(table.warps, seg);
  const int first_block = PickSegment(table.first_block, seg);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int groups_per_block = static_cast<int>(blockDim.x) / kWarpSize / seg_warps;
  const int sub = warp / seg_warps;  // row group within the block
  const int group_thread = (warp % seg_warps) * kWarpSize + lane;
  const int group_threads = seg_warps * kWarpSize;
  const int block_row0 = (block - first_block) * groups_per_block * kDenseRows;
  const int row0 = block_row0 + sub * kDenseRows;
  // Rows past out_features repeat the last row: computed, never written. A group entirely past
  // the end (the segment's last block) skips the loop.
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

  const int chunks = row0 < out_features ? in_features / 8 : 0;
#pragma unroll 2
  for (int c = group_thread; c < chunks; c += group_threads) {
    const int64_t col = static_cast<int64_t>(c) * 8;
    float wv[kDenseRows][8];
#pragma unroll
    for (int r = 0; r < kDenseRows; ++r) LoadW8<kKind>(w, w_base[r] + col, wv[r]);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < nt) {  // uniform over the block
        float xv[8];
        load.Load8(x_base[t] + col, xv);
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
  // Thread i sums (group i / (4T), row (i / T) % 4, token i % T) over the group's warps in order.
  for (int i = static_cast<int>(threadIdx.x); i < groups_per_block * kDenseRows * T;
       i += static_cast<int>(blockDim.x)) {
    const int g = i / (kDenseRows * T);
    const int r = i / T % kDenseRows;
    const int t = i % T;
    const int row = block_row0 + g * kDenseRows + r;
    if (t < nt && row < out_features) {
      const int first_warp = g * seg_warps;
      float sum = partial[first_warp][r][t];
      for (int wi = 1; wi < seg_warps; ++wi) sum += partial[first_warp + wi][r][t];
      PickSegment(table.y, seg)[static_cast<int64_t>(tile_rows[t]) * out_features + row] = sum;
    }
  }
}

template <DenseKind kKind, int T, typename Load>
cudaError_t LaunchDense(const DenseTable& table, int block_warps, int in_features, Load load,
                        int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(table.first_block[table.n_segments]),
                  static_cast<unsigned>((n_tokens + T - 1) / T));
  DenseRowsKernel<kKind, T, Load><<<grid, block_warps * kWarpSize, 0, stream>>>(
      table, in_features, load, static_cast<int>(n_tokens), row_path, want_path);
  return cudaGetLastError();
}

// The token tile size depends on n_tokens only.
template <DenseKind kKind, typename Load>
cudaError_t LaunchDenseTiled(const DenseTable& table, int block_warps, int in_features, Load load,
                             int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                             cudaStream_t stream) {
  if (n_tokens <= 1) {
    return LaunchDense<kKind, 1>(table, block_warps, in_features, load, n_tokens, row_path,
                                 want_path, stream);
  }
  if (n_tokens <= 2) {
    return LaunchDense<kKind, 2>(table, block_warps, in_features, load, n_tokens, row_path,
                                 want_path, stream);
  }
  if (n_tokens <= 4) {
    return LaunchDense<kKind, 4>(table, block_warps, in_features, load, n_tokens, row_path,
                                 want_path, stream);
  }
  return LaunchDense<kKind, 8>(table, block_warps, in_features, load, n_tokens, row_path,
                               want_path, stream);
}

template <typename Load>
cudaError_t LaunchDenseLoad(const DenseTable& table, int block_warps, DenseKind kind,
                            int in_features, Load load, int64_t n_tokens,
                            const int32_t* row_path, int32_t want_path, cudaStream_t stream) {
  switch (kind) {
    case DenseKind::kF32:
      return LaunchDenseTiled<DenseKind::kF32>(table, block_warps, in_features, load, n_tokens,
                                               row_path, want_path, stream);
    case DenseKind::kBf16:
      return LaunchDenseTiled<DenseKind::kBf16>(table, block_warps, in_features, load, n_tokens,
                                                row_path, want_path, stream);
    case DenseKind::kF16:
      return LaunchDenseTiled<DenseKind::kF16>(table, block_warps, in_features, load, n_tokens,
                                               row_path, want_path, stream);
  }
  return cudaErrorInvalidValue;
}

// --- KV rows into pages -----------------------------------------------------------------------

constexpr int kKvThreads = 128;

// Where row t (position pos >= 0) goes: the K element (kv head 0, d 0) of its (page, slot); head
// h's K row is at + h * block_size * head_dim and its V row n_kv_heads heads further. nullptr
// (and *error_flag = 1, from thread 0) when the position is past the page table or the page id
// is outside [0, num_pages). The same in every thread.
__device__ __forceinline__ float* KvSlot(int64_t t, int pos, const int32_t* page_table,
                                         int page_table_stride, float* kv_layer, int64_t num_pages,
                                         int n_kv_heads, int block_size, int head_dim,
                                         int32_t* error_flag) {
  const int logical = pos / block_size;
  const int64_t page =
      logical < page_table_stride ? page_table[t * page_table_stride + logical] : int64_t{-1};
  if (page < 0 || page >= num_pages) {
    if (error_flag != nullptr && threadIdx.x == 0) *error_flag = 1;
    return nullptr;
  }
  const int64_t head_floats = static_cast<int64_t>(block_size) * head_dim;
  return kv_layer + page * 2 * n_kv_heads * head_floats +
         static_cast<int64_t>(pos % block_size) * head_dim;
}

// Copies rows of n_kv_heads * head_dim floats (head h, element d at h * head_dim + d) into the
// slot's K (or V) rows, the block's threads striding over the elements.
__device__ __forceinline__ void CopyToSlot(const float* __restrict__ row, float* slot,
                                           int n_kv_heads, int block_size, int head_dim) {
  const int64_t row_floats = static_cast<int64_t>(n_kv_heads) * head_dim;
  const int64_t head_floats = static_cast<int64_t>(block_size) * head_dim;
  for (int64_t i = threadIdx.x; i < row_floats; i += blockDim.x) {
    slot[i / head_dim * head_floats + i % head_dim] = row[i];
  }
}

__global__ void WriteKvRowsKernel(const float* __restrict__ k, const float* __restrict__ v,
                                  const int32_t* __restrict__ positions,
                                  const int32_t* __restrict__ page_table, int page_table_stride,
                                  float* __restrict__ kv_layer, int64_t num_pages, int n_kv_heads,
                                  int block_size, int head_dim, int32_t* error_flag) {
  const int64_t t = blockIdx.x;
  const int pos = positions[t];
  if (pos < 0) return;  // padding row
  float* slot = KvSlot(t, pos, page_table, page_table_stride, kv_layer, num_pages, n_kv_heads,
                       block_size, head_dim, error_flag);
  if (slot == nullptr) return;
  const int64_t row_floats = static_cast<int64_t>(n_kv_heads) * head_dim;
  const int64_t v_offset = static_cast<int64_t>(n_kv_heads) * block_size * head_dim;
  CopyToSlot(k + t * row_floats, slot, n_kv_heads, block_size, head_dim);
  CopyToSlot(v + t * row_floats, slot + v_offset, n_kv_heads, block_size, head_dim);
}

// ApplyRope on row t's q and k (kernel_math::RopeToken, as elementwise.cu's RopeKernel), each
// rotated key element also stored into the row's page slot by the thread that computed it, then
// V copied as WriteKvRowsKernel does. Padding rows (pos < 0) are not touched at all; a row with
// a bad page id is still rotated (as ApplyRope would) but not written, and flagged.
__global__ void RopeWriteKvKernel(float* q, int n_q_heads, float* k, const float* __restrict__ v,
                                  const int32_t* __restrict__ positions,
                                  const float* __restrict__ inv_freq, bool interleaved,
                                  const int32_t* __restrict__ page_table, int page_table_stride,
                                  float* kv_layer, int64_t num_pages, int n_kv_heads,
                                  int block_size, int head_dim, int32_t* error_flag) {
  extern __shared__ float trig[];  // [head_dim / 2] cos, then [head_dim / 2] sin
  const int64_t t = blockIdx.x;
  const int pos = positions[t];
  if (pos < 0) return;  // padding row: uniform over the block, before any barrier
  float* slot = KvSlot(t, pos, page_table, page_table_stride, kv_layer, num_pages, n_kv_heads,
                       block_size, head_dim, error_flag);
  const int64_t row_floats = static_cast<int64_t>(n_kv_heads) * head_dim;
  const int64_t head_floats = static_cast<int64_t>(block_size) * head_dim;
  kernel_math::RopeToken(q + t * n_q_heads * static_cast<int64_t>(head_dim), n_q_heads,
                         k + t * row_floats, n_kv_heads, head_dim, pos, inv_freq, interleaved,
                         trig, [&](int head, int d, float value) {
                           if (slot != nullptr) slot[head * head_floats + d] = value;
                         });
  if (slot != nullptr) {
    CopyToSlot(v + t * row_floats, slot + n_kv_heads * head_floats, n_kv_heads, block_size,
               head_dim);
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

cudaError_t LaunchDenseMatMulRowsMulti(const DenseSegmentArgs* segments, int n_segments,
                                       DenseKind kind, int64_t in_features, const float* x,
                                       const float* x_up, int64_t n_tokens,
                                       const int32_t* row_path, int32_t want_path,
                                       cudaStream_t stream) {
  if (n_tokens <= 0) return cudaSuccess;
  if (n_segments < 1 || n_segments > kMaxSegments) return cudaErrorInvalidValue;
  DenseTable table{};
  table.n_segments = n_segments;
  int block_warps = 1;
  for (int s = 0; s < n_segments; ++s) {
    table.w[s] = segments[s].w;
    table.y[s] = segments[s].y;
    table.out_features[s] = static_cast<int>(segments[s].out_features);
    table.warps[s] = DenseWarps(segments[s].out_features, in_features);
    if (table.warps[s] > block_warps) block_warps = table.warps[s];
  }
  int blocks = 0;
  for (int s = 0; s < n_segments; ++s) {
    const int64_t groups = (segments[s].out_features + kDenseRows - 1) / kDenseRows;
    const int64_t groups_per_block = block_warps / table.warps[s];
    table.first_block[s] = blocks;
    blocks += static_cast<int>((groups + groups_per_block - 1) / groups_per_block);
  }
  for (int s = n_segments; s <= kMaxSegments; ++s) table.first_block[s] = blocks;
  if (blocks == 0) return cudaSuccess;
  const int in = static_cast<int>(in_features);
  if (x_up != nullptr) {
    return LaunchDenseLoad(table, block_warps, kind, in, SwiGluActivations{x, x_up}, n_tokens,
                           row_path, want_path, stream);
  }
  return LaunchDenseLoad(table, block_warps, kind, in, F32Activations{x}, n_tokens, row_path,
                         want_path, stream);
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

cudaError_t LaunchRopeWriteKvRows(float* q, int n_q_heads, float* k, const float* v,
                                  const int32_t* positions, int64_t n_rows, const float* inv_freq,
                                  bool interleaved, const int32_t* page_table,
                                  int page_table_stride, float* kv_layer, int64_t num_pages,
                                  const PageShape& shape, int32_t* error_flag,
                                  cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  const size_t shared_bytes = sizeof(float) * static_cast<size_t>(shape.head_dim);  // cos + sin
  RopeWriteKvKernel<<<static_cast<unsigned>(n_rows), kKvThreads, shared_bytes, stream>>>(
      q, n_q_heads, k, v, positions, inv_freq, interleaved, page_table, page_table_stride,
      kv_layer, num_pages, shape.n_kv_heads, shape.block_size, shape.head_dim, error_flag);
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
