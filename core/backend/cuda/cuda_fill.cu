#include "core/backend/cuda/cuda_fill.h"

#include <cuda_runtime.h>

namespace estuary::cuda {
namespace {
__global__ void FillF32Kernel(float* data, size_t count, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    data[i] = value;
  }
}
}  // namespace

int LaunchFillF32(float* data, size_t count, float value, void* stream) {
  if (count == 0) return 0;
  constexpr int kThreads = 256;
  const size_t blocks = (count + kThreads - 1) / kThreads;
  FillF32Kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(data, count, value);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace estuary::cuda
