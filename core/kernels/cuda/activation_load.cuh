#pragma once
// Internal, nvcc only: how the row-masked products (DenseRowsKernel in decode_step_kernels.cu,
// Int4MatMulKernel in int4_matmul_kernel.cu) read their activations. A load policy is a small
// struct passed to the kernel by value; `Load8(i, out)` returns the eight f32 activations at
// element offset i (a multiple of 8; rows are [n_tokens][in] with in % 8 == 0, base pointers
// 16-byte aligned) with 16-byte loads:
//   F32Activations     x f32;
//   Bf16Activations    x bf16 bits, widened;
//   SwiGluActivations  silu(gate) * up computed on load (kernel_math::SiluMul, the formula of
//                      elementwise.cu's SwiGlu): the values the product receives are bitwise
//                      those SwiGlu would have written, so the result equals SwiGlu followed by
//                      the plain product.
// The kernels are templates over the policy, so every variant shares one kernel body.

#if !defined(__CUDACC__)
#error "activation_load.cuh is for .cu files (nvcc) only"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "core/kernels/cuda/elementwise_math.cuh"

namespace estuary::cuda::kernel_math {

// Eight f32 from 16-byte aligned read-only memory.
__device__ __forceinline__ void LoadF32x8(const float* p, float (&out)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// Eight bf16 (16-byte aligned, read-only) widened to f32; little-endian: element 2i is the low
// half of word i.
__device__ __forceinline__ void LoadBf16x8(const uint16_t* p, float (&out)[8]) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

struct F32Activations {
  const float* x;
  __device__ __forceinline__ void Load8(int64_t i, float (&out)[8]) const { LoadF32x8(x + i, out); }
};

struct Bf16Activations {
  const uint16_t* x;
  __device__ __forceinline__ void Load8(int64_t i, float (&out)[8]) const {
    LoadBf16x8(x + i, out);
  }
};

struct SwiGluActivations {
  const float* gate;
  const float* up;
  __device__ __forceinline__ void Load8(int64_t i, float (&out)[8]) const {
    float g[8];
    float u[8];
    LoadF32x8(gate + i, g);
    LoadF32x8(up + i, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = SiluMul(g[j], u[j]);
  }
};

}  // namespace estuary::cuda::kernel_math
