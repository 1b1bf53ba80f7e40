#pragma once
// Int4 × f32 matrix multiplication over an Int4Matrix (W4A16-style, activations in f32):
//
//   y[t][o] = Σ_i x[t][i] · Ŵ[o][i]   for t < n_tokens,   x: [n_tokens][cols], y: [n_tokens][rows]
//
// n_tokens == 1 is the decode GEMV; 2..8 tokens share every unpacked weight vector; more tokens
// run in chunks of 8 while the 4-row tile stays in L1, so the weights are read from memory once
// per call for any n_tokens. Highway runtime dispatch (AVX-512, AVX2, SSE4, ...); nibbles are
// widened in registers, all accumulation is f32.
//
// Accuracy: each output equals the dot product with Dequantize(o, i) up to f32 rounding, about
// 1e-6 of Σ_i |x[t][i] · Ŵ[o][i]| (int4_matmul_test checks 2e-5).
//
// Thread-safety: pure function of its arguments; concurrent calls are fine (scratch is
// thread_local). `threads > 1` splits the row tiles over a process-wide persistent pool of
// threads - 1 workers plus the caller (the pool grows to the largest count asked for and
// serializes concurrent multi-threaded calls). Outputs do not depend on the thread count.

#include <cstdint>

#include "core/quant/int4_matrix.h"

namespace estuary {

void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y);
void Int4MatMul(const Int4Matrix& w, const float* x, int64_t n_tokens, float* y, int threads);

// Name of the SIMD target Int4MatMul dispatches to on this machine ("AVX3", "AVX2", ...).
const char* Int4MatMulTargetName();

}  // namespace estuary
