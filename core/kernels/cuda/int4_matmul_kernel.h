#pragma once
// Internal: the device view of GPU int4 weights and the W4A16 kernel launcher
// (int4_matmul_kernel.cu). Plain types only; see int4_matmul.h for the layout and the public API.
// Under nvcc it also defines SelectRowTile, the row-mask tiling shared with the dense kernel of
// decode_step_kernels.cu, and PickSegment, for both kernels' segment tables.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace estuary::cuda {

// Device pointers of one int4 weight matrix W[rows][cols] in the GPU layout (int4_matmul.h).
struct Int4GpuView {
  const void* nibbles = nullptr;    // [rows][cols / 32] 16-byte chunks
  const uint16_t* scales = nullptr;   // f16 bits [rows][n_groups]
  const uint16_t* offsets = nullptr;  // f16 bits [rows][n_groups]
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;
  int64_t n_groups = 0;
  float multiplier = 1.0f;  // s = f16(scale) * multiplier, m = f16(offset) * multiplier
};

namespace matmul_internal {

// y[t][o] = Σ_i x[t][i] Ŵ[o][i] for t < n_tokens. x is f32 (x_is_bf16 false) or bf16 bits,
// [n_tokens][cols], 16-byte aligned; y f32 [n_tokens][rows]. Shapes are checked by the caller
// (cols % 32 == 0, group_size % 32 == 0, rows and cols < 2^31, n_tokens <= 65535 * 8).
cudaError_t LaunchInt4MatMul(const Int4GpuView& w, const void* x, bool x_is_bf16,
                             int64_t n_tokens, float* y, cudaStream_t stream);

// The same restricted to the rows t with row_path[t] == want_path (row_path: device int32
// [n_tokens]; nullptr = every row); the other rows of y are not written. Token tiles hold wanted
// rows only (see SelectRowTile), and a block whose tile is empty returns before reading weights.
cudaError_t LaunchInt4MatMulRows(const Int4GpuView& w, const void* x, bool x_is_bf16,
                                 int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                                 float* y, cudaStream_t stream);

// How the kernel reads its activations (activation_load.cuh): x f32, x bf16 bits, or
// silu(x) * x_up computed on load (x is the gate, both f32 [n_tokens][cols]).
enum class Int4Input : int { kF32 = 0, kBf16 = 1, kSwiGluF32 = 2 };
inline constexpr int kMaxInt4Segments = 3;

// Up to kMaxInt4Segments row-masked products of the same activations in one launch: segment s
// computes y[s] = w[s] x for the wanted rows, bitwise as LaunchInt4MatMulRows would for it alone
// (the per-row work and reduction order do not depend on the other segments). Every w[s] has the
// same cols, group_size and n_groups; x_up is null unless input is kSwiGluF32. Checked by the
// caller as LaunchInt4MatMul, plus 1 <= n_segments <= kMaxInt4Segments. LaunchInt4MatMulRows is
// the one-segment case.
cudaError_t LaunchInt4MatMulMulti(const Int4GpuView* w, float* const* y, int n_segments,
                                  const void* x, const float* x_up, Int4Input input,
                                  int64_t n_tokens, const int32_t* row_path, int32_t want_path,
                                  cudaStream_t stream);

#if defined(__CUDACC__)
// Token rows of tile `tile` of a row-masked product with tiles of kTile rows. Without a mask
// (row_path == nullptr) the tile is rows [tile * kTile, tile * kTile + kTile) ∩ [0, n_tokens).
// With one, it is the wanted rows (row_path[t] == want_path) of ranks [tile * kTile,
// tile * kTile + kTile) in increasing t, so the wanted rows are packed into the first tiles and
// the later tiles are empty. Writes the rows to `rows` (shared, kTile entries) and returns their
// count (0..kTile), the same in every thread. Every thread of the block must call it (it uses
// __syncthreads and full-warp ballots; blockDim.x a multiple of 32, at most 1024); `warp_counts`
// is shared scratch of 32 ints. Cost: reads row_path[0 .. last needed rank] once per block.
template <int kTile>
__device__ __forceinline__ int SelectRowTile(const int32_t* row_path, int32_t want_path,
                                             int n_tokens, int tile, int* rows,
                                             int* warp_counts) {
  const int first = tile * kTile;
  if (row_path == nullptr) {
    if (threadIdx.x < kTile) rows[threadIdx.x] = first + static_cast<int>(threadIdx.x);
    __syncthreads();
    const int count = n_tokens - first;
    return count < 0 ? 0 : (count > kTile ? kTile : count);
  }
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int n_warps = static_cast<int>(blockDim.x) / 32;
  int seen = 0;  // wanted rows before `start`; the same in every thread
  for (int start = 0; start < n_tokens && seen < first + kTile; start += blockDim.x) {
    const int t = start + static_cast<int>(threadIdx.x);
    const bool want = t < n_tokens && row_path[t] == want_path;
    const unsigned ballot = __ballot_sync(0xffffffffu, want);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = seen;
    int total = seen;
    for (int w = 0; w < n_warps; ++w) {
      const int c = warp_counts[w];
      before += w < warp ? c : 0;
      total += c;
    }
    const int rank = before + __popc(ballot & ((1u << lane) - 1u));
    if (want && rank >= first && rank < first + kTile) rows[rank - first] = t;
    __syncthreads();  // rows[] complete; warp_counts free for the next round
    seen = total;
  }
  const int count = seen - first;
  return count < 0 ? 0 : (count > kTile ? kTile : count);
}

// a[seg] for the segment tables of the multi-segment launches (seg in [0, 3)), with static
// indices only: a dynamic index into a kernel-parameter array makes the compiler copy the whole
// table to local memory.
template <typename V, int kN>
__device__ __forceinline__ V PickSegment(const V (&a)[kN], int seg) {
  static_assert(kN >= 3, "three segments");
  return seg == 2 ? a[2] : seg == 1 ? a[1] : a[0];
}
#endif  // __CUDACC__

}  // namespace matmul_internal
}  // namespace estuary::cuda
