#pragma once
// The kernels a CUDA-graph-captured decode step needs beyond elementwise.h and int4_matmul.h
// (built with ESTUARY_CUDA only): projections restricted to the rows of one path (backbone or
// exit river), the KV write into a paged layer region, and the exit river's decision taken on the
// device, so that a whole step (all layers, both paths) can be captured once and replayed; and
// fused forms of them that cut the kernel nodes per layer (q/k/v or gate/up in one product,
// SwiGLU computed inside the down projection, RoPE + KV write in one launch), each bitwise equal
// to the separate calls it replaces.
//
// Every function here:
//   - takes device pointers (except the argument structs themselves) and enqueues its work on
//     `stream` (nullptr = the legacy default stream); it never synchronizes and never allocates,
//     so it may be called while `stream` is being captured into a CUDA graph. Everything a kernel
//     decides per row (row_path, positions, page ids, group ids) is read on the device at run time:
//     the launch configuration depends only on the sizes passed here, so a captured graph stays
//     valid when those device arrays change between replays;
//   - returns INVALID_ARGUMENT for bad sizes, dtypes, alignment or null pointers, checked on the
//     host before any CUDA call, and INTERNAL with the CUDA error name when a launch fails. Errors
//     raised by a kernel while it runs surface at the next synchronizing call, as usual in CUDA;
//   - is a no-op returning OK for zero tokens / rows.
// Thread-safety: no state is kept; concurrent calls on different streams are fine.
// Status: compiled (nvcc 13, sm_90), never run on a GPU; see README.md, "decode step".

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/kernels/cuda/elementwise_types.h"
#include "core/kernels/cuda/int4_matmul_kernel.h"
#include "core/tensor/rope_types.h"
#include "core/tensor/dtype.h"

namespace estuary::cuda {

// Path of each row of a decode step (device int32 per row).
inline constexpr int32_t kRowIdle = -1;      // padding row: no projection computes it
inline constexpr int32_t kRowBackbone = 0;   // full-precision backbone
inline constexpr int32_t kRowRiver = 1;      // int4 exit river

// y[t] = W x[t] for rows t with row_path[t] == want_path (every row when row_path == nullptr);
// other rows of y are left untouched. W dense [out][in] on the device, dtype kF32, kBF16 or kF16
// (core/tensor/dtype.h); x f32 [n_tokens][in]; y f32 [n_tokens][out]; f32 accumulation.
// A block that finds no wanted row returns before reading W, so the path no row takes costs
// only its launch. Meant for decode batches (n_tokens 1..256): rows of W are read with 16-byte
// loads and applied to tiles of up to 8 tokens held in registers; must reach near memory
// bandwidth at n_tokens = 1 (one or more warps per output row group, enough blocks for 132 SMs).
// in_features must be a multiple of 8 (16 bytes of bf16) — INVALID_ARGUMENT otherwise.
//
// Kernel: a block computes 4 output rows for one tile of up to 8 wanted tokens (the wanted rows
// are packed into tiles in order, so the tiles past the last wanted row are empty); its 1..8 warps
// split the input dimension (consecutive lanes on consecutive 8-element chunks, coalesced), and
// the per-warp sums are added in shared memory in a fixed order. The warp count depends only on
// (out_features, in_features), so results are deterministic, and a wanted row's y is bitwise the
// same whatever the mask and the other rows are. Also required: w and x 16-byte aligned
// (cudaMalloc memory is), out_features and in_features at most 2^30, n_tokens <= 524280.
// Tolerance (decode_step_kernels_test, vs kernels::cpu::MatMul on the same rounded weights):
// |y - y_cpu| <= 2e-5 · Σ_i |x_i · W_oi| + 1e-6.
[[nodiscard]] absl::Status DenseMatMulRows(const void* w, DType w_dtype, int64_t out_features,
                                           int64_t in_features, const float* x, int64_t n_tokens,
                                           const int32_t* row_path, int32_t want_path, float* y,
                                           cudaStream_t stream);

// The int4 W4A16 product (int4_matmul.h) restricted to rows with row_path[t] == want_path,
// with the same early return. x f32. (The masked Int4MatMul overload of int4_matmul.h, with its
// checks: cols % 32 == 0, group_size % 32 == 0, x 16-byte aligned.)
[[nodiscard]] absl::Status Int4MatMulRows(const Int4GpuView& w, const float* x, int64_t n_tokens,
                                          const int32_t* row_path, int32_t want_path, float* y,
                                          cudaStream_t stream);

// Writes each row's K and V ([n_kv_heads * head_dim] each, RoPE already applied) into a paged
// layer region laid out like KvPool: page p at kv_layer + p * page_stride floats, inside a page
// [K|V][kv_head][slot][head_dim] (PageShape from elementwise_types.h: n_kv_heads, block_size,
// head_dim; page_stride = 2*n_kv_heads*block_size*head_dim). Row t goes to page
// page_table[t * page_table_stride + positions[t] / block_size], slot positions[t] % block_size.
// Rows with positions[t] < 0 are skipped (padding). A page id outside [0, num_pages) or a
// position beyond page_table_stride * block_size skips the row and sets *error_flag = 1.
//
// k and v are [n_rows][n_kv_heads * head_dim] f32; page_table is device int32
// [n_rows][page_table_stride] (one page-table row per row of the step). error_flag is a device
// int32 that may be null; the kernel only ever sets it: zero it first, read it after the stream
// synchronizes. Two rows writing the same (page, slot) race (the caller's positions are unique).
// Exact copy (no arithmetic).
[[nodiscard]] absl::Status WriteKvRows(const float* k, const float* v, int64_t n_rows,
                                       const int32_t* positions, const int32_t* page_table,
                                       int page_table_stride, float* kv_layer, int64_t num_pages,
                                       const PageShape& shape, int32_t* error_flag,
                                       cudaStream_t stream);

// --- Fused launches (fewer nodes per layer in a captured decode step) -----------------------
//
// Each is numerically the same as the separate calls it replaces: the fused products run the
// same kernel bodies as DenseMatMulRows / Int4MatMulRows (generalized to a table of segments and
// a policy for reading the activations), and RoPE uses the same device code as ApplyRope.

// Up to 3 products of the same input in one launch (q/k/v, or gate/up): segment s computes
// y_s[t] = W_s x[t] for the wanted rows (row_path, want_path as DenseMatMulRows), exactly as
// DenseMatMulRows would for that segment alone: bitwise, because a segment's warps per row
// group, and so its per-row reduction order, depend only on its own (out_features, in_features);
// a block holds one or more row groups of one segment. Every W_s has dtype w_dtype and
// in_features columns, is 16-byte aligned, and has its own y_s [n_tokens][out_features_s] (the
// y_s must not overlap each other or x). DenseMatMulRows is the one-segment case. Checks as
// DenseMatMulRows for every segment, plus INVALID_ARGUMENT for 0 or more than 3 segments.
struct DenseSegment {
  const void* w = nullptr;
  int64_t out_features = 0;
  float* y = nullptr;
};
[[nodiscard]] absl::Status DenseMatMulRowsMulti(absl::Span<const DenseSegment> segments,
                                                DType w_dtype, int64_t in_features,
                                                const float* x, int64_t n_tokens,
                                                const int32_t* row_path, int32_t want_path,
                                                cudaStream_t stream);

// The same for the int4 river kernel (Int4MatMulRows; x f32): every view has the same cols and
// group_size (INVALID_ARGUMENT otherwise), each segment its own y [n_tokens][rows_s]. Bitwise
// equal to one Int4MatMulRows per segment (a warp's 4 rows and their reduction never depend on
// the other segments). Int4MatMulRows is the one-segment case.
struct Int4Segment {
  Int4GpuView w;
  float* y = nullptr;
};
[[nodiscard]] absl::Status Int4MatMulRowsMulti(absl::Span<const Int4Segment> segments,
                                               const float* x, int64_t n_tokens,
                                               const int32_t* row_path, int32_t want_path,
                                               cudaStream_t stream);

// The MLP's down projection reading its input as silu(gate) * up, computed on load with the
// same silu formula as SwiGlu in elementwise.cu (kernel_math::SiluMul), so the result equals
// SwiGlu followed by DenseMatMulRows / Int4MatMulRows bitwise: the same f32 values go into the
// same reduction. gate, up f32 [n_tokens][in_features] (16-byte aligned; y must not overlap
// them). silu is recomputed by every block that reads a token's activations (once per 4 output
// rows and tile): cheap next to the weight reads at decode batch sizes. Same checks as the
// plain products.
[[nodiscard]] absl::Status DenseMatMulRowsSwiGlu(const void* w, DType w_dtype,
                                                 int64_t out_features, int64_t in_features,
                                                 const float* gate, const float* up,
                                                 int64_t n_tokens, const int32_t* row_path,
                                                 int32_t want_path, float* y,
                                                 cudaStream_t stream);
[[nodiscard]] absl::Status Int4MatMulRowsSwiGlu(const Int4GpuView& w, const float* gate,
                                                const float* up, int64_t n_tokens,
                                                const int32_t* row_path, int32_t want_path,
                                                float* y, cudaStream_t stream);

// ApplyRope (elementwise.h: q [n_rows][n_q_heads][head_dim] and k [n_rows][n_kv_heads][head_dim]
// rotated in place, same angle math through the same device code, both RopeStyle values)
// followed by WriteKvRows (the rotated k and v into the pages), in one launch of one block per
// row: each rotated key element is stored to k and to its page slot by the thread that computed
// it. Bitwise equal to ApplyRope + WriteKvRows on every row with positions[t] >= 0. Rows with
// positions[t] < 0 are left alone entirely (padding: q and k not rotated, nothing written).
// Same error-flag rules as WriteKvRows: a bad page id or a position past the table skips the
// row's KV write and sets *error_flag = 1, but its q and k are still rotated (as ApplyRope
// would). shape.n_kv_heads and shape.head_dim must equal n_kv_heads and head_dim; head_dim even,
// at most 8192; n_q_heads >= 0, n_kv_heads >= 1. Otherwise the checks of both functions.
[[nodiscard]] absl::Status RopeWriteKvRows(float* q, int n_q_heads, float* k, const float* v,
                                           int n_kv_heads, int head_dim,
                                           const int32_t* positions, int64_t n_rows,
                                           const float* inv_freq, RopeStyle style,
                                           const int32_t* page_table, int page_table_stride,
                                           float* kv_layer, int64_t num_pages,
                                           const PageShape& shape, int32_t* error_flag,
                                           cudaStream_t stream);

// --- Exit decision --------------------------------------------------------------------------

// The exit river's decision (design: /work/shared/docs/river-llm.md; CPU reference is the loop
// at the top of the layer loop in core/model/forward_batch.cc — read it), taken on the device
// after backbone layer `next_layer - 1` for layer `next_layer`:
//  - for each row with row_path == kRowBackbone: s = cos(layer_in[t], layer_out[t]) in f32 (0 for a
//    zero vector), written to similarity[t] when similarity != nullptr;
//  - a group (row_group[t], values in [0, n_rows)) takes the MIN of s over its backbone rows
//    (a prefill chunk exits only when all its tokens would);
//  - rule kBatchMin (0): margin = min over backbone groups of (s_group - tau_group) where tau is
//    thresholds[t] of the group's rows; every backbone row leaves when margin > 0.
//    rule kSplit (1): each group leaves when s_group - tau_group > 0.
//  - forced != 0: every backbone row leaves; may_exit == 0 (and not forced): nobody leaves.
//  - a row that leaves gets row_path[t] = kRowRiver and backbone_layers[t] = next_layer.
// Rows with kRowIdle or kRowRiver are untouched. n_rows <= 1024. Deterministic (no atomics on
// floats). One or two small launches.
//
// Details, as the CPU loop does them: a group's margin is the min over its backbone rows of
// (s_group - thresholds[t]), i.e. its rows normally share one tau and a group whose rows disagree
// uses the largest. NaN follows std::min with the running value first: a NaN s is ignored by the
// group min (all NaN: s_group = +inf), a NaN margin is ignored by the batch min and keeps its
// group on the backbone under kSplit. A row whose group id is outside [0, n_rows) (device data,
// so it cannot be checked on the host) behaves as a group of its own. Group minima use integer
// atomicMin in shared memory on an order-preserving encoding of the f32 value (exact, so
// deterministic); the batch minimum is a fixed-shape block reduction.
// Launches: with `similarity` given, one block of 256 threads per row computes the cosines (f32
// block sums) into it, then one block takes the decision; with similarity == nullptr a single
// block of 1024 threads does both (max(1, 32 / n_rows) warps per row: fine for a few rows,
// slower for large batches — pass a scratch `similarity` buffer of n_rows floats there). The two
// paths sum in different orders, so s may differ in the last bits between them; both are within
// 1e-5 of the CPU's CosineSimilarity (double) for |values| <= 1 and dim <= 8192. Requires dim in
// [1, 2^31).
struct ExitDecisionArgs {
  const float* layer_in = nullptr;   // [n_rows][dim] the layer's input (residual stream)
  const float* layer_out = nullptr;  // [n_rows][dim] its output
  int64_t dim = 0;
  int n_rows = 0;
  const int32_t* row_group = nullptr;
  const float* thresholds = nullptr;
  int32_t* row_path = nullptr;
  int32_t* backbone_layers = nullptr;
  float* similarity = nullptr;       // optional
  int next_layer = 0;
  int rule = 0;                      // 0 = batch-min, 1 = split (ExitRule order)
  int may_exit = 0;
  int forced = 0;
};
[[nodiscard]] absl::Status ExitDecision(const ExitDecisionArgs& args, cudaStream_t stream);

}  // namespace estuary::cuda
