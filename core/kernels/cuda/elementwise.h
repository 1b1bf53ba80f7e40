#pragma once
// CUDA element-wise kernels of the Llama forward pass, the exit river's similarity, device
// sampling and KV page copies (built with ESTUARY_CUDA only). Each mirrors a CPU kernel of
// core/kernels/cpu/kernels.h (or core/sampling/sampler.h) and is tested against it in
// elementwise_test.cc (label `gpu`; see README.md, section "elementwise", for tolerances).
//
// Conventions of every launcher:
//   - pointers named `device ...` below are device memory (cudaMalloc or managed); host spans are
//     host memory;
//   - the work is enqueued on `stream` (nullptr = the legacy default stream) and the call
//     returns without waiting for it;
//   - INVALID_ARGUMENT for bad sizes or null pointers, checked on the host before any launch;
//     INTERNAL with the CUDA error name and string when a launch or copy fails. Errors raised by
//     the kernels while they run surface, as usual in CUDA, at the next synchronizing call;
//   - zero tokens / rows / entries is a no-op returning OK.
// Thread-safety: the launchers keep no state; concurrent calls on different streams are fine.
// All arithmetic is f32; no fast-math intrinsics (expf, cosf, sinf, sqrtf are the precise ones).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/kernels/cuda/elementwise_types.h"
#include "core/tensor/rope_types.h"
#include "core/tensor/dtype.h"

namespace estuary::cuda {

// --- Norms and the state-transition similarity (design §5) ---------------------------------

// For each token t < n_tokens (rows of `dim` floats), one thread block per token:
//   h_in = residual[t];  h_out = h_in + delta[t];  residual[t] = h_out        (in place)
//   normed[t] = h_out / sqrt(mean(h_out^2) + eps) * weight                    (RmsNorm)
//   similarity[t] = cos(h_in, h_out), 0 when either vector is zero            (if not null)
// `weight` is `dim` elements of `weight_dtype` (kF32, kBF16 or kF16). The sums are f32 (block
// reductions with warp shuffles); the CPU reference (CosineSimilarity) accumulates in double:
// they agree within 1e-5 absolute for dim <= 8192 (see README.md). `normed` must not alias
// `residual` or `delta`.
absl::Status ResidualRmsNormSimilarity(float* residual, const float* delta, const void* weight,
                                       DType weight_dtype, int64_t n_tokens, int64_t dim,
                                       float eps, float* normed, float* similarity,
                                       cudaStream_t stream);

// Plain RMSNorm (kernels::cpu::RmsNorm): out[t] = x[t] / rms(x[t]) * weight. `out` may be `x`.
absl::Status RmsNorm(const float* x, const void* weight, DType weight_dtype, int64_t n_tokens,
                     int64_t dim, float eps, float* out, cudaStream_t stream);

// --- RoPE ---------------------------------------------------------------------------------

// Rotates q ([n_tokens][n_q_heads][head_dim]) and k ([n_tokens][n_kv_heads][head_dim]) in place,
// token t at position positions[t] (device int32, >= 0), as kernels::cpu::ApplyRope does for one
// token: kInterleaved rotates (2i, 2i+1), kHalves (i, i + head_dim/2), by angle
// positions[t] * inv_freq[i] (rounded to f32, as on the CPU). `inv_freq` is the device copy of
// kernels::cpu::RopeInverseFrequencies(head_dim, theta, scaling) and must hold head_dim / 2
// floats. k may be null when n_kv_heads is 0 (and q null when n_q_heads is 0). head_dim even.
absl::Status ApplyRope(float* q, int n_q_heads, float* k, int n_kv_heads, int head_dim,
                       const int32_t* positions, int64_t n_tokens, const float* inv_freq,
                       RopeStyle style, cudaStream_t stream);

// --- Activations and embedding -----------------------------------------------------------

// out[i] = silu(gate[i]) * up[i] for i < n. `out` may be `gate` or `up`.
absl::Status SwiGlu(const float* gate, const float* up, int64_t n, float* out,
                    cudaStream_t stream);

// out[t] = table[ids[t]] widened to f32, for a [vocab][dim] table of `table_dtype` (kF32, kBF16
// or kF16) in device memory and device `ids`. The ids live on the device (they usually come
// straight from SampleRows), so they are not validated on the host: an id outside [0, vocab)
// writes a row of zeros and sets *error_flag (a device int32, may be null) to 1. The flag is
// never cleared by the kernel: zero it before the call and read it after the stream
// synchronizes; a set flag is the CPU Embedding's INVALID_ARGUMENT.
absl::Status Embedding(const void* table, DType table_dtype, int64_t vocab, int64_t dim,
                       const int32_t* ids, int64_t n_tokens, float* out, int32_t* error_flag,
                       cudaStream_t stream);

// --- Sampling ----------------------------------------------------------------------------

// out_ids[r] = index of the largest logits[r][.] (rows of `vocab` floats), the lowest index among
// equal maxima, as estuary::Argmax. -0.0 equals +0.0; NaN never wins (Argmax on the CPU returns
// 0 when logits[0] is NaN; the device returns the largest non-NaN value's index, and 0 when the
// whole row is NaN).
absl::Status ArgmaxRows(const float* logits, int64_t n_rows, int64_t vocab, int32_t* out_ids,
                        cudaStream_t stream);

// One sampled token per row: temperature, then top-k, then top-p, as Sampler::Sample (without
// min_p and the repetition penalty, see DeviceSamplingRow). `rows` is a host span of n_rows
// parameters (validated like SamplingParams::Validate: temperature in [0, 100], top_k >= 0,
// top_p in (0, 1]), copied with cudaMemcpyAsync into `device_rows_scratch` (n_rows entries of
// device memory the caller owns; it must stay valid until the stream passes this kernel), so
// the span may be freed when the call returns.
//
// A row with temperature 0 is greedy and gives exactly ArgmaxRows' (and the CPU's) token. With
// temperature > 0 the kept set is the CPU's (sorted by logit descending, ties by index; top-k
// keeps exactly k; top-p keeps the shortest prefix whose probability reaches top_p, probabilities
// in f32 rather than double, so a token sitting exactly on the top-p boundary may differ) and the
// draw is a Gumbel-max over the kept set with Philox-4x32-10 noise keyed by (seed, step, index).
// Seeded device sampling is therefore reproducible on the device (same logits, seed and step:
// same token, whatever batch the row is in) and samples the same distribution as the CPU
// Sampler, but does NOT reproduce the CPU Sampler's random stream (std::mt19937_64): the same
// seed picks different tokens on the CPU and the GPU.
//
// Cost: one block per row; the top-k and top-p thresholds are found by bisection over the
// (logit, index) order, about 50 passes over the row each (none when top_k and top_p are off),
// then one pass for the draw. A first version: fine for batched decode, not tuned.
absl::Status SampleRows(const float* logits, int64_t n_rows, int64_t vocab,
                        absl::Span<const DeviceSamplingRow> rows,
                        DeviceSamplingRow* device_rows_scratch, int32_t* out_ids,
                        cudaStream_t stream);

// --- KV page copies for the transport ----------------------------------------------------
//
// A layer region is num_pages page-layers of `shape` (PageShape: [K|V][kv_head][slot][head_dim]
// f32), as KvPool lays out each layer. Page ids are device int32 arrays (the transport stages
// them); an id outside [0, num_pages) skips that entry and sets *error_flag (device int32, may be
// null) to 1 — zero it first, read it after the stream synchronizes. Copies must not overlap.

// For e < n: page-layer dst_pages[e] of `dst` = page-layer src_pages[e] of `src` (both regions
// of one layer, same shape; device to device, within one GPU or across peers with access).
absl::Status CopyPages(const float* src, int64_t src_num_pages, const int32_t* src_pages,
                       float* dst, int64_t dst_num_pages, const int32_t* dst_pages, int64_t n,
                       const PageShape& shape, int32_t* error_flag, cudaStream_t stream);

// Packs K and V of KV heads [first_head, first_head + n_heads) of pages[e], e < n, into the
// contiguous `staging` buffer laid out [e][K|V][n_heads][block_size][head_dim]
// (n * 2 * n_heads * block_size * head_dim floats). With the whole head range the staging buffer
// is the pages' bytes back to back; a sub-range slices pages by KV head for a peer with another
// tensor-parallel size (design §6).
absl::Status GatherPages(const float* region, int64_t num_pages, const PageShape& shape,
                         const int32_t* pages, int64_t n, int first_head, int n_heads,
                         float* staging, int32_t* error_flag, cudaStream_t stream);

// The reverse of GatherPages: unpacks `staging` into heads [first_head, first_head + n_heads)
// of pages[e] of `region`.
absl::Status ScatterPages(const float* staging, int64_t n, float* region, int64_t num_pages,
                          const PageShape& shape, const int32_t* pages, int first_head,
                          int n_heads, int32_t* error_flag, cudaStream_t stream);

}  // namespace estuary::cuda
