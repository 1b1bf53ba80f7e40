#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/kernels/cuda/matmul_kernels.h"

namespace estuary::cuda::matmul_internal {
namespace {

__global__ void F32ToBf16Kernel(const float* __restrict__ x, uint16_t* __restrict__ out,
                                int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

}  // namespace

cudaError_t LaunchF32ToBf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  F32ToBf16Kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(
      x, out, n);
  return cudaGetLastError();
}

}  // namespace estuary::cuda::matmul_internal
