#pragma once
// Internal launchers of the matmul-side CUDA kernels (matmul_kernels.cu, int4_matmul_kernel.cu,
// paged_attention_kernel.cu). Plain types only, so that the .cu files (C++17, nvcc) need no
// Abseil; the public headers (matmul.h, int4_matmul.h, paged_attention.h) wrap them in
// absl::Status. Each launcher returns the CUDA error of the launch (cudaSuccess = 0).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace estuary::cuda::matmul_internal {

// out[i] = bf16(x[i]) (round to nearest even; bits), i < n.
cudaError_t LaunchF32ToBf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);

}  // namespace estuary::cuda::matmul_internal
