#pragma once
// CPU kernels of the Llama forward pass. Activations are f32; weights are f32, bf16 or f16
// Tensors laid out [out][in] row-major; accumulation is always f32.
// Thread-safety: kernels are pure functions of their arguments. Multi-threading inside a kernel
// (GEMM through OpenBLAS) is set once per process with SetCpuThreads().

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/common/worker_pool.h"
#include "core/tensor/rope_types.h"
#include "core/tensor/tensor.h"

namespace estuary::kernels::cpu {

// Number of threads the GEMM library may use (0: the library's default).
void SetCpuThreads(int threads);

// y[t][o] = sum_i x[t][i] * W[o][i] for t < n_tokens. `weight` is [out][in] in f32/bf16/f16,
// x is [n_tokens][in], y is [n_tokens][out]. One token runs the SIMD GEMV (GemvBf16 & co.,
// runtime-dispatched: AVX2, AVX-512, ...); 2 to 64 tokens (a batched decode step) the batched
// GEMV (GemvBatchBf16 & co.), which reads the weight once for all of them; larger batches
// (prefill) a GEMM through OpenBLAS (bf16/f16 weights are widened to f32 a panel at a time),
// whose per-call packing of the weight costs more than it saves for a few tokens. The GEMV and
// batched GEMV split the weight's rows over MatMulOptions::pool when the call is big enough
// (blocks start at multiples of 16 rows, so each row sits where it would in one call): the
// output is bitwise the same with or without a pool, at any pool size (kernels_test).
// INVALID_ARGUMENT when shapes or dtypes do not fit (weight must be a rank-2 host tensor).
//
// With MatMulPath::kBatchInvariant every token's row of y is bitwise the same whatever n_tokens
// is and whichever other tokens share the call: all sizes run the batched GEMV (whose
// accumulation order per output element does not depend on the token count, unlike OpenBLAS,
// whose small-matrix kernels and blocking change with the shape), its rows split over
// the pool's threads. Prefill uses it so that a prompt gives the same KV whatever its chunking.
enum class MatMulPath {
  kFastest,         // GEMV / batched GEMV / sgemm by token count, as above
  kBatchInvariant,  // batched GEMV at every size, row blocks on the pool
};
struct MatMulOptions {
  MatMulPath path = MatMulPath::kFastest;
  // The rank's worker threads (core/common/worker_pool.h); null: the caller's thread alone.
  // Both paths' (batched) GEMV split rows over it; kFastest's sgemm uses SetCpuThreads(). Not
  // reentrant: MatMul must not be called from inside a ParallelFor of the same pool.
  WorkerPool* pool = nullptr;
};
[[nodiscard]] absl::Status MatMul(const Tensor& weight, const float* x, int64_t n_tokens,
                                  float* y, const MatMulOptions& options = {});

// The decode GEMV over bf16 weights: y[o] = sum_i w[o*cols + i] * x[i]. Highway dynamic dispatch.
void GemvBf16(const uint16_t* w, const float* x, int64_t rows, int64_t cols, float* y);
// Same over f32 weights.
void GemvF32(const float* w, const float* x, int64_t rows, int64_t cols, float* y);
// Same over IEEE f16 weights (raw bits; F16C conversion where the target has it).
void GemvF16(const uint16_t* w, const float* x, int64_t rows, int64_t cols, float* y);
// Multi-token GEMV for batched decode: y[t*rows + o] = sum_i w[o*cols + i] * x[t*cols + i] for
// t < n_tokens, o < rows. Layouts: w [rows][cols], x [n_tokens][cols], y [n_tokens][rows] (as
// MatMul). The token loop runs inside the row loop (4 rows x 4 tokens of accumulators in
// registers on AVX-512), so each weight element is read from memory once per call for as many
// tokens as fit 256 KiB of x (32 at 2048 columns, 8 at 8192; then once per such group). Beyond
// ~4 tokens the cost is f32 FMA throughput, one FMA per weight element and token. Highway dynamic
// dispatch; f32 accumulation; single thread. n_tokens == 1 works, but GemvBf16 & co. are tuned
// for it. No-op when n_tokens or rows is 0.
void GemvBatchBf16(const uint16_t* w, const float* x, int64_t n_tokens, int64_t rows, int64_t cols,
                   float* y);
// Same over f32 weights.
void GemvBatchF32(const float* w, const float* x, int64_t n_tokens, int64_t rows, int64_t cols,
                  float* y);
// Same over IEEE f16 weights (raw bits).
void GemvBatchF16(const uint16_t* w, const float* x, int64_t n_tokens, int64_t rows, int64_t cols,
                  float* y);
// Name of the SIMD target GemvBf16 dispatches to on this machine ("AVX3", "AVX2", ...).
const char* GemvTargetName();

// out[t] = x[t] / rms(x[t]) * weight, rms over `dim` with epsilon `eps`; weight f32/bf16/f16.
void RmsNorm(const float* x, const Tensor& weight, int64_t n_tokens, int64_t dim, float eps,
             float* out);

// Per-dimension-pair inverse frequencies for one head, with Llama 3 scaling when enabled.
std::vector<float> RopeInverseFrequencies(int head_dim, float theta, const RopeScaling& scaling);
// Rotates `n_heads` heads of `head_dim` in place for position `pos`.
// kInterleaved rotates (2i, 2i+1); kHalves rotates (i, i + head_dim/2).
void ApplyRope(float* x, int n_heads, int head_dim, int pos, absl::Span<const float> inv_freq,
               RopeStyle style);

// out[i] = silu(gate[i]) * up[i]. `out` may be `gate` or `up` (in place).
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

// Dot product with eight independent partial sums (vectorizes; the additions do not form one
// dependency chain). The attention kernels' score, so paged and contiguous attention agree.
float Dot(const float* a, const float* b, int64_t n);

// cos(a, b) accumulated in double; 0 when either vector is zero. The exit river's state
// transition similarity and its KV fidelity measure.
double CosineSimilarity(const float* a, const float* b, int64_t n);

// Numerically stable softmax in place.
void Softmax(float* x, int64_t n);

// Causal grouped-query attention for `n_queries` consecutive positions starting at `start_pos`,
// against a contiguous cache holding positions [0, start_pos + n_queries):
//   q:   [n_queries][n_heads][head_dim]
//   k,v: [position][n_kv_heads][head_dim]   (position stride = n_kv_heads * head_dim)
//   out: [n_queries][n_heads][head_dim]
// Query t attends to positions [0, start_pos + t]. Scale 1/sqrt(head_dim).
void CausalAttention(const float* q, int n_queries, int start_pos, const float* k, const float* v,
                     int n_heads, int n_kv_heads, int head_dim, float* out);

// out[t] = table[ids[t]] as f32. INVALID_ARGUMENT for an id outside the table.
[[nodiscard]] absl::Status Embedding(const Tensor& table, absl::Span<const int32_t> ids,
                                     float* out);

// Which path GemvBatchBf16 (and so MatMul's bf16 batches and kBatchInvariant prefill) takes:
// kFma (the default) = the Highway f32-FMA path (GemvBatchBf16Fma: exact f32 products); kDot =
// the AVX512-BF16 dot path (bf16_dot.h: activations rounded to bf16, error up to 2^-9 of
// sum |w x|, about 1.4-1.9x the multiply-adds per second from 16 tokens up), where the CPU has
// it (else kFma). Rounding activations to bf16 changes greedy tokens of bf16 models now and then
// (stories12L as bf16: 83.6% of the f32 golden tokens against 100% on kFma), so it is opt-in:
// `--bf16-kernel dot` (cli/kernel_flags.h). Process-wide: set it before concurrent calls, not
// during them, and not in the middle of a prompt (a prompt's chunks must share one path to stay
// batch-invariant). Defined in gemv_batch.cc.
enum class Bf16BatchPath { kFma, kDot };
void SetBf16BatchPath(Bf16BatchPath path);
Bf16BatchPath GetBf16BatchPath();
// True when GemvBatchBf16 runs the dot path now (the setting above and the CPU).
bool Bf16BatchUsesDot();

}  // namespace estuary::kernels::cpu
