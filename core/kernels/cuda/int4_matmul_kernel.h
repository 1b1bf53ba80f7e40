#pragma once
// Internal: the device view of GPU int4 weights and the W4A16 kernel launcher
// (int4_matmul_kernel.cu). Plain types only; see int4_matmul.h for the layout and the public API.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace estuary::cuda {

// Device pointers of one int4 weight matrix W[rows][cols] in the GPU layout (int4_matmul.h).
struct Int4GpuView {
  const void* nibbles = nullptr;    // [rows][cols / 32] 16-byte chunks
  const uint16_t* scales = nullptr;   // f16 bits [rows][n_groups]
  const uint16_t* offsets = nullptr;  // f16 bits [rows][n_groups]
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;
  int64_t n_groups = 0;
  float multiplier = 1.0f;  // s = f16(scale) * multiplier, m = f16(offset) * multiplier
};

namespace matmul_internal {

// y[t][o] = Σ_i x[t][i] Ŵ[o][i] for t < n_tokens. x is f32 (x_is_bf16 false) or bf16 bits,
// [n_tokens][cols], 16-byte aligned; y f32 [n_tokens][rows]. Shapes are checked by the caller
// (cols % 32 == 0, group_size % 32 == 0, rows and cols < 2^31, n_tokens <= 65535 * 8).
cudaError_t LaunchInt4MatMul(const Int4GpuView& w, const void* x, bool x_is_bf16,
                             int64_t n_tokens, float* y, cudaStream_t stream);

}  // namespace matmul_internal
}  // namespace estuary::cuda
