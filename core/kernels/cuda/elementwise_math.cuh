#pragma once
// Internal, nvcc only: the f32 formulas that several kernels must evaluate identically, bit for
// bit, so that a fused kernel equals the separate ones it replaces:
//   - SiluMul: SwiGlu (elementwise.cu) and the SwiGLU-on-load products (activation_load.cuh,
//     used by decode_step_kernels.cu and int4_matmul_kernel.cu);
//   - RopeToken: ApplyRope (elementwise.cu) and RopeWriteKvRows (decode_step_kernels.cu).
// Every operation is an explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn, ...), which
// the compiler never contracts into an FMA: the result cannot depend on the code around the
// call. The order of operations is the CPU's (core/kernels/cpu/activations.cc, rope.cc); expf,
// cosf and sinf are the precise CUDA functions (no fast math), so values differ from the CPU's
// std::exp / std::cos / std::sin by their ulp errors only.

#if !defined(__CUDACC__)
#error "elementwise_math.cuh is for .cu files (nvcc) only"
#endif

#include <cuda_runtime.h>

#include <cstdint>

namespace estuary::cuda::kernel_math {

// silu(g) * u = g * (1 / (1 + exp(-g))) * u, evaluated left to right.
__device__ __forceinline__ float SiluMul(float g, float u) {
  const float sigmoid = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
  return __fmul_rn(__fmul_rn(g, sigmoid), u);
}

// Rotates one token's query heads and key heads in place, as kernels::cpu::ApplyRope does for a
// token at position `pos`: pair i is (2i, 2i+1) when `interleaved`, else (i, i + head_dim / 2),
// rotated by the angle pos · inv_freq[i] (rounded to f32). q_row is [n_q_heads][head_dim] and
// k_row [n_kv_heads][head_dim] (either may be null when its head count is 0); `trig` is shared
// memory of head_dim floats. For every rotated key element, after writing it, the thread calls
// on_key(kv_head, d, value) (d < head_dim): the hook for kernels that also copy the rotated
// keys elsewhere. Every thread of the block must call this (it synchronizes the block once).
struct NoKeyHook {
  __device__ void operator()(int, int, float) const {}
};
template <typename OnKey>
__device__ __forceinline__ void RopeToken(float* q_row, int n_q_heads, float* k_row,
                                          int n_kv_heads, int head_dim, int pos,
                                          const float* inv_freq, bool interleaved, float* trig,
                                          OnKey on_key) {
  const int half = head_dim / 2;
  float* cos_table = trig;
  float* sin_table = trig + half;
  for (int i = static_cast<int>(threadIdx.x); i < half; i += static_cast<int>(blockDim.x)) {
    const float angle = __fmul_rn(static_cast<float>(pos), inv_freq[i]);
    cos_table[i] = cosf(angle);
    sin_table[i] = sinf(angle);
  }
  __syncthreads();
  const int first_stride = interleaved ? 2 : 1;
  const int partner = interleaved ? 1 : half;
  const int total = (n_q_heads + n_kv_heads) * half;
  for (int idx = static_cast<int>(threadIdx.x); idx < total; idx += static_cast<int>(blockDim.x)) {
    const int head = idx / half;
    const int i = idx % half;
    const bool is_key = head >= n_q_heads;
    float* x = is_key ? k_row + static_cast<int64_t>(head - n_q_heads) * head_dim
                      : q_row + static_cast<int64_t>(head) * head_dim;
    const int a = i * first_stride;
    const float v0 = x[a];
    const float v1 = x[a + partner];
    const float c = cos_table[i];
    const float s = sin_table[i];
    const float out0 = __fsub_rn(__fmul_rn(v0, c), __fmul_rn(v1, s));
    const float out1 = __fadd_rn(__fmul_rn(v0, s), __fmul_rn(v1, c));
    x[a] = out0;
    x[a + partner] = out1;
    if (is_key) {
      on_key(head - n_q_heads, a, out0);
      on_key(head - n_q_heads, a + partner, out1);
    }
  }
}

}  // namespace estuary::cuda::kernel_math
