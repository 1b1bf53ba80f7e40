// The AVX512-BF16 batched GEMV over bf16 weights (issue 18, item 4): vdpbf16ps multiplies 32
// bf16 pairs per instruction into 16 f32 lanes, twice the multiply-adds of an f32 FMA after
// widening. GemvBatchBf16 (gemv_batch.cc) runs it at every token count on CPUs that have
// AVX512-BF16 (unless SetBf16BatchPath / ESTUARY_BF16_DOT=0 say otherwise, kernels.h) and its
// Highway f32 path elsewhere; this header is for that dispatch, the tests and the benchmarks.
//
// Bit-exactness: the activations are rounded to bf16 (round to nearest even, relative error at
// most 2^-9) before the products, so the result is NOT bitwise the f32 path and differs from the
// exact product by at most 2^-9 sum_i |w_i x_i| plus f32 summation error (kernels_test checks
// 2^-8 of it); the products of two bf16 are exact in f32 and are accumulated in f32 lanes in a
// fixed order (vdpbf16ps flushes denormal inputs and outputs to zero). A (row, token) result
// depends only on that row and that token: bitwise the same whatever n_tokens, the rows around
// it or the thread that runs it (MatMulPath::kBatchInvariant's contract).
#ifndef ESTUARY_CORE_KERNELS_CPU_BF16_DOT_H_
#define ESTUARY_CORE_KERNELS_CPU_BF16_DOT_H_

#include <cstdint>

namespace estuary::kernels::cpu {

// True when this CPU has AVX512-F/BW/VL and AVX512-BF16 (checked once).
bool Bf16DotAvailable();

// y[t*rows + o] = sum_i w[o*cols + i] * bf16(x[t*cols + i]), layouts as GemvBatchBf16. Requires
// Bf16DotAvailable(). Single thread; no-op when n_tokens or rows is 0.
void GemvBatchBf16Dot(const uint16_t* w, const float* x, int64_t n_tokens, int64_t rows,
                      int64_t cols, float* y);

// GemvBatchBf16's Highway f32-FMA path whatever the CPU (the baseline in tests and benchmarks;
// defined in gemv_batch.cc).
void GemvBatchBf16Fma(const uint16_t* w, const float* x, int64_t n_tokens, int64_t rows,
                      int64_t cols, float* y);

}  // namespace estuary::kernels::cpu

#endif  // ESTUARY_CORE_KERNELS_CPU_BF16_DOT_H_
