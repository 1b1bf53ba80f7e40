// The CUDA kernels behind elementwise.h (launchers in elementwise_launch.h). Arguments were
// validated by elementwise.cc; these functions only size the grids and launch.
//
// Reductions: every block reduction below is an all-reduce with a fixed shape (xor-butterfly
// warp shuffles, then every warp reduces the per-warp partials the same way), so every thread
// gets the same value and the result depends only on the inputs and the block size, never on
// scheduling: float sums are deterministic run to run.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/kernels/cuda/elementwise_launch.h"
#include "core/kernels/cuda/elementwise_math.cuh"

namespace estuary::cuda::internal {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kNormThreads = 256;
constexpr int kRopeThreads = 128;
constexpr int kRowThreads = 256;     // embedding rows, page slices
constexpr int kSampleThreads = 512;  // argmax and sampling, one block per row
constexpr int kMaxGridX = 1 << 16;   // grid-stride kernels: enough blocks to fill any GPU

// --- Reductions ----------------------------------------------------------------------------

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

template <typename T, typename Op>
__device__ T WarpAllReduce(T v, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// All threads of the block (blockDim.x a multiple of 32, at most 1024) must call this, with the
// same `scratch` (32 elements of shared memory); all get the reduction of their `v`s.
template <typename T, typename Op>
__device__ T BlockAllReduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  v = WarpAllReduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = lane < n_warps ? scratch[lane] : identity;
  total = WarpAllReduce(total, op);
  __syncthreads();  // `scratch` may be reused by the next call
  return total;
}

// --- Weights of 16-bit types ---------------------------------------------------------------

template <WeightKind kKind>
__device__ float LoadAsF32(const void* data, int64_t i) {
  if constexpr (kKind == WeightKind::kF32) {
    return static_cast<const float*>(data)[i];
  } else if constexpr (kKind == WeightKind::kBf16) {
    const uint32_t bits = static_cast<const uint16_t*>(data)[i];
    return __uint_as_float(bits << 16);
  } else {
    return __half2float(static_cast<const __half*>(data)[i]);
  }
}

// --- Residual add + RMSNorm + similarity ---------------------------------------------------

template <WeightKind kKind, bool kResidual>
__global__ void ResidualRmsNormKernel(float* residual, const float* delta, const void* weight,
                                      int64_t dim, float eps, float* normed, float* similarity) {
  __shared__ float scratch[kWarpSize];
  const int64_t t = blockIdx.x;
  float* h = residual + t * dim;
  float sum_sq_out = 0.0f, dot = 0.0f, sum_sq_in = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float x = h[i];
    if constexpr (kResidual) {
      const float y = x + delta[t * dim + i];
      h[i] = y;  // read back below by this same thread
      sum_sq_out += y * y;
      dot += x * y;
      sum_sq_in += x * x;
    } else {
      sum_sq_out += x * x;
    }
  }
  sum_sq_out = BlockAllReduce(sum_sq_out, SumOp{}, 0.0f, scratch);
  if constexpr (kResidual) {
    dot = BlockAllReduce(dot, SumOp{}, 0.0f, scratch);
    sum_sq_in = BlockAllReduce(sum_sq_in, SumOp{}, 0.0f, scratch);
  }
  // As kernels::cpu::RmsNorm: ss = sum / dim + eps; out = w * (x / sqrt(ss)).
  const float scale = 1.0f / sqrtf(sum_sq_out / static_cast<float>(dim) + eps);
  float* out = normed + t * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    out[i] = LoadAsF32<kKind>(weight, i) * (scale * h[i]);
  }
  if constexpr (kResidual) {
    if (similarity != nullptr && threadIdx.x == 0) {
      // 0 when either vector is zero, as kernels::cpu::CosineSimilarity. The square roots are
      // taken separately so that the product of two large sums cannot overflow.
      similarity[t] = (sum_sq_in == 0.0f || sum_sq_out == 0.0f)
                          ? 0.0f
                          : dot / (sqrtf(sum_sq_in) * sqrtf(sum_sq_out));
    }
  }
}

template <WeightKind kKind>
void LaunchNorm(float* residual, const float* delta, const void* weight, int64_t n_tokens,
                int64_t dim, float eps, float* normed, float* similarity, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_tokens));
  if (delta != nullptr) {
    ResidualRmsNormKernel<kKind, true>
        <<<grid, kNormThreads, 0, stream>>>(residual, delta, weight, dim, eps, normed, similarity);
  } else {
    ResidualRmsNormKernel<kKind, false>
        <<<grid, kNormThreads, 0, stream>>>(residual, delta, weight, dim, eps, normed, nullptr);
  }
}

// --- RoPE -----------------------------------------------------------------------------------

// One block per token; the rotation itself is kernel_math::RopeToken (elementwise_math.cuh),
// shared with the fused RoPE + KV write of decode_step_kernels.cu.
__global__ void RopeKernel(float* q, int n_q_heads, float* k, int n_kv_heads, int head_dim,
                           const int32_t* positions, const float* inv_freq, bool interleaved) {
  extern __shared__ float trig[];  // [head_dim / 2] cos, then [head_dim / 2] sin
  const int64_t t = blockIdx.x;
  kernel_math::RopeToken(q + t * n_q_heads * static_cast<int64_t>(head_dim), n_q_heads,
                         k + t * n_kv_heads * static_cast<int64_t>(head_dim), n_kv_heads, head_dim,
                         positions[t], inv_freq, interleaved, trig, kernel_math::NoKeyHook{});
}

// --- SwiGLU and embedding ------------------------------------------------------------------

__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = kernel_math::SiluMul(gate[i], up[i]);
  }
}

template <WeightKind kKind>
__global__ void EmbeddingKernel(const void* table, int64_t vocab, int64_t dim, const int32_t* ids,
                                float* out, int32_t* error_flag) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* row = out + t * dim;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) row[i] = 0.0f;
    if (error_flag != nullptr && threadIdx.x == 0) *error_flag = 1;
    return;
  }
  const int64_t base = static_cast<int64_t>(id) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    row[i] = LoadAsF32<kKind>(table, base + i);
  }
}

// --- Sampling ---------------------------------------------------------------------------------
//
// The CPU Sampler orders candidates by logit descending, ties by index ascending. Here that order
// is a 64-bit key per element: the high half maps the logit to an unsigned integer with the same
// order (NaN lowest, -0 folded into +0), the low half is ~index, so a larger key comes first.
// "The first n candidates" is then "every key >= c" for some c, and the thresholds of top-k and
// top-p are found by bisection on c.

__device__ uint32_t OrderedBits(float v) {
  if (isnan(v)) return 0u;
  if (v == 0.0f) v = 0.0f;  // -0.0 -> +0.0: equal logits, ties go by index
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) != 0u ? ~bits : (bits | 0x80000000u);
}

__device__ uint64_t OrderKey(float v, int64_t index) {
  return (static_cast<uint64_t>(OrderedBits(v)) << 32) |
         static_cast<uint64_t>(0xffffffffu - static_cast<uint32_t>(index));
}

__device__ int32_t KeyIndex(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu));
}

__device__ uint64_t Compose(uint32_t high, uint32_t low) {
  return (static_cast<uint64_t>(high) << 32) | low;
}

// Largest c in [lo, hi] with pred(c) true, for a predicate that is true at lo, false from some
// point on, and changes value only at element keys (pred(c) depends on the set {key >= c}).
// Bisects the logit half of the key first, then the index half (whose values lie in
// [~(vocab - 1), ~0]): at most 32 + log2(vocab) evaluations. Every thread of the block calls it
// with the same arguments; pred must return the same value in every thread.
template <typename Pred>
__device__ uint64_t LargestTrue(uint64_t lo, uint64_t hi, int64_t vocab, Pred pred) {
  const uint32_t min_low = 0xffffffffu - static_cast<uint32_t>(vocab - 1);
  auto at_high = [&](uint32_t high) {
    const uint64_t c = Compose(high, min_low);
    return c > lo ? c : lo;
  };
  uint32_t high_lo = static_cast<uint32_t>(lo >> 32);
  uint32_t high_hi = static_cast<uint32_t>(hi >> 32);
  while (high_lo < high_hi) {
    const uint32_t mid = high_lo + ((high_hi - high_lo - 1) >> 1) + 1;
    if (pred(at_high(mid))) {
      high_lo = mid;
    } else {
      high_hi = mid - 1;
    }
  }
  uint64_t a = at_high(high_lo);
  uint64_t b = Compose(high_lo, 0xffffffffu);
  if (b > hi) b = hi;
  while (a < b) {
    const uint64_t mid = a + ((b - a - 1) >> 1) + 1;
    if (pred(mid)) {
      a = mid;
    } else {
      b = mid - 1;
    }
  }
  return a;
}

// Philox-4x32-10 (the Random123 constants), first output word: counter (c0..c3), key (k0, k1).
__device__ uint32_t Philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                           uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0);
    const uint32_t lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2);
    const uint32_t lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// Standard Gumbel noise for element `index` of the draw keyed by (seed, step).
__device__ float Gumbel(uint64_t seed, uint64_t step, int64_t index) {
  const uint32_t bits =
      Philox(static_cast<uint32_t>(index), static_cast<uint32_t>(step),
             static_cast<uint32_t>(step >> 32), 0u, static_cast<uint32_t>(seed),
             static_cast<uint32_t>(seed >> 32));
  // u in [2^-24, 1 - 2^-24]: 23 random bits plus one half, exact in f32, never 0 or 1.
  const float u = (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
  return -logf(-logf(u));
}

__device__ uint64_t RowMaxKey(const float* row, int64_t vocab, uint64_t* scratch) {
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const uint64_t key = OrderKey(row[i], i);
    best = key > best ? key : best;
  }
  return BlockAllReduce<uint64_t>(best, MaxOp{}, 0ull, scratch);
}

__global__ void __launch_bounds__(kSampleThreads)
    ArgmaxRowsKernel(const float* logits, int64_t vocab, int32_t* out_ids) {
  __shared__ uint64_t scratch[kWarpSize];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const uint64_t best = RowMaxKey(row, vocab, scratch);
  if (threadIdx.x == 0) out_ids[blockIdx.x] = KeyIndex(best);
}

__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(const float* logits, int64_t vocab, const DeviceSamplingRow* params,
                     int32_t* out_ids) {
  __shared__ uint64_t scratch_key[kWarpSize];
  __shared__ uint32_t scratch_count[kWarpSize];
  __shared__ float scratch_mass[kWarpSize];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const DeviceSamplingRow p = params[blockIdx.x];

  const uint64_t best = RowMaxKey(row, vocab, scratch_key);
  const int32_t best_index = KeyIndex(best);
  const float max_logit = row[best_index];
  // Greedy for temperature 0 (or NaN), and when the largest logit is infinite or NaN (no finite
  // distribution to draw from; the CPU would compute NaN probabilities).
  if (!(p.temperature > 0.0f) || !isfinite(max_logit)) {
    if (threadIdx.x == 0) out_ids[blockIdx.x] = best_index;
    return;
  }
  const float temperature = p.temperature;
  // exp((logit - max) / T), as the CPU's probabilities before normalization (f32 here).
  auto weight = [&](float logit) {
    return isnan(logit) ? 0.0f : expf((logit - max_logit) / temperature);
  };
  auto count_from = [&](uint64_t c) {
    uint32_t n = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) n += OrderKey(row[i], i) >= c;
    return BlockAllReduce<uint32_t>(n, SumOp{}, 0u, scratch_count);
  };
  auto mass_from = [&](uint64_t c) {
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float logit = row[i];
      if (OrderKey(logit, i) >= c) m += weight(logit);
    }
    return BlockAllReduce<float>(m, SumOp{}, 0.0f, scratch_mass);
  };

  uint64_t keep_from = 0;  // the kept candidates are the keys >= keep_from
  if (p.top_k > 0 && static_cast<int64_t>(p.top_k) < vocab) {
    const uint32_t k = static_cast<uint32_t>(p.top_k);
    keep_from = LargestTrue(0, best, vocab, [&](uint64_t c) { return count_from(c) >= k; });
  }
  if (p.top_p < 1.0f) {
    // The shortest prefix whose probability (normalized over the top-k set) reaches top_p.
    const float target = p.top_p * mass_from(keep_from);
    keep_from =
        LargestTrue(keep_from, best, vocab, [&](uint64_t c) { return mass_from(c) >= target; });
  }

  // Gumbel-max: argmax over the kept set of (logit - max) / T + G_i samples index i with
  // probability proportional to its weight. Ties (vanishingly rare) go to the lower index.
  uint64_t winner = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float logit = row[i];
    if (isnan(logit) || OrderKey(logit, i) < keep_from) continue;
    const float score = (logit - max_logit) / temperature + Gumbel(p.seed, p.step, i);
    const uint64_t key = OrderKey(score, i);
    winner = key > winner ? key : winner;
  }
  winner = BlockAllReduce<uint64_t>(winner, MaxOp{}, 0ull, scratch_key);
  if (threadIdx.x == 0) out_ids[blockIdx.x] = winner == 0 ? best_index : KeyIndex(winner);
}

// --- Page copies -------------------------------------------------------------------------------

template <bool kVec4>
__global__ void PageCopyKernel(PageCopyArgs a) {
  const int64_t e = blockIdx.x;
  const int segment = blockIdx.y;  // [K|V][head]
  const int kv = segment / a.n_heads;
  const int head = segment % a.n_heads;
  const int64_t src_page = a.src_pages != nullptr ? a.src_pages[e] : e;
  const int64_t dst_page = a.dst_pages != nullptr ? a.dst_pages[e] : e;
  if (src_page < 0 || src_page >= a.src_num_pages || dst_page < 0 ||
      dst_page >= a.dst_num_pages) {
    if (a.error_flag != nullptr && threadIdx.x == 0) *a.error_flag = 1;
    return;
  }
  const int64_t src_offset =
      (src_page * 2 * a.src_kv_heads + int64_t{kv} * a.src_kv_heads + a.src_first_head + head) *
      a.head_floats;
  const int64_t dst_offset =
      (dst_page * 2 * a.dst_kv_heads + int64_t{kv} * a.dst_kv_heads + a.dst_first_head + head) *
      a.head_floats;
  if constexpr (kVec4) {
    const float4* src = reinterpret_cast<const float4*>(a.src + src_offset);
    float4* dst = reinterpret_cast<float4*>(a.dst + dst_offset);
    for (int64_t i = threadIdx.x; i < a.head_floats / 4; i += blockDim.x) dst[i] = src[i];
  } else {
    const float* src = a.src + src_offset;
    float* dst = a.dst + dst_offset;
    for (int64_t i = threadIdx.x; i < a.head_floats; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

cudaError_t LaunchResidualRmsNorm(float* residual, const float* delta, const void* weight,
                                  WeightKind weight_kind, int64_t n_tokens, int64_t dim, float eps,
                                  float* normed, float* similarity, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  switch (weight_kind) {
    case WeightKind::kF32:
      LaunchNorm<WeightKind::kF32>(residual, delta, weight, n_tokens, dim, eps, normed, similarity,
                                   stream);
      break;
    case WeightKind::kBf16:
      LaunchNorm<WeightKind::kBf16>(residual, delta, weight, n_tokens, dim, eps, normed,
                                    similarity, stream);
      break;
    case WeightKind::kF16:
      LaunchNorm<WeightKind::kF16>(residual, delta, weight, n_tokens, dim, eps, normed, similarity,
                                   stream);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* q, int n_q_heads, float* k, int n_kv_heads, int head_dim,
                       const int32_t* positions, int64_t n_tokens, const float* inv_freq,
                       bool interleaved, cudaStream_t stream) {
  if (n_tokens == 0 || n_q_heads + n_kv_heads == 0) return cudaSuccess;
  const size_t shared_bytes = sizeof(float) * static_cast<size_t>(head_dim);  // cos + sin
  RopeKernel<<<static_cast<unsigned>(n_tokens), kRopeThreads, shared_bytes, stream>>>(
      q, n_q_heads, k, n_kv_heads, head_dim, positions, inv_freq, interleaved);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  SwiGluKernel<<<static_cast<unsigned>(blocks < kMaxGridX ? blocks : kMaxGridX), kThreads, 0,
                 stream>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchEmbedding(const void* table, WeightKind table_kind, int64_t vocab, int64_t dim,
                            const int32_t* ids, int64_t n_tokens, float* out,
                            int32_t* error_flag, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n_tokens));
  switch (table_kind) {
    case WeightKind::kF32:
      EmbeddingKernel<WeightKind::kF32>
          <<<grid, kRowThreads, 0, stream>>>(table, vocab, dim, ids, out, error_flag);
      break;
    case WeightKind::kBf16:
      EmbeddingKernel<WeightKind::kBf16>
          <<<grid, kRowThreads, 0, stream>>>(table, vocab, dim, ids, out, error_flag);
      break;
    case WeightKind::kF16:
      EmbeddingKernel<WeightKind::kF16>
          <<<grid, kRowThreads, 0, stream>>>(table, vocab, dim, ids, out, error_flag);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchArgmaxRows(const float* logits, int64_t n_rows, int64_t vocab, int32_t* out_ids,
                             cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  ArgmaxRowsKernel<<<static_cast<unsigned>(n_rows), kSampleThreads, 0, stream>>>(logits, vocab,
                                                                                 out_ids);
  return cudaGetLastError();
}

cudaError_t LaunchSampleRows(const float* logits, int64_t n_rows, int64_t vocab,
                             const DeviceSamplingRow* rows, int32_t* out_ids,
                             cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  SampleRowsKernel<<<static_cast<unsigned>(n_rows), kSampleThreads, 0, stream>>>(logits, vocab,
                                                                                 rows, out_ids);
  return cudaGetLastError();
}

cudaError_t LaunchPageCopy(const PageCopyArgs& args, cudaStream_t stream) {
  if (args.n_entries == 0 || args.n_heads == 0 || args.head_floats == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(args.n_entries), static_cast<unsigned>(2 * args.n_heads));
  // Every slice starts a multiple of head_floats floats from the base pointers, so 16-byte
  // vectors work when head_floats is a multiple of 4 and both bases are 16-byte aligned.
  const bool vec4 = args.head_floats % 4 == 0 &&
                    reinterpret_cast<uintptr_t>(args.src) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(args.dst) % 16 == 0;
  if (vec4) {
    PageCopyKernel<true><<<grid, kRowThreads, 0, stream>>>(args);
  } else {
    PageCopyKernel<false><<<grid, kRowThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace estuary::cuda::internal
