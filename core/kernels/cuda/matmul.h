#pragma once
// bf16 GEMM on the GPU through cuBLAS (ESTUARY_CUDA only):
//
//   y[t][o] = Σ_i x[t][i] · W[o][i]   for t < n_tokens,
//   W: bf16 [out][in] row-major (raw bits, as on the CPU), x: [n_tokens][in] f32 or bf16,
//   y: f32 [n_tokens][out]; all device pointers.
//
// One cublasGemmEx call (CUBLAS_OP_T on W, bf16 × bf16, CUBLAS_COMPUTE_32F, f32 output): the
// products of bf16 values are exact and accumulate in f32 (tensor cores; cuBLAS picks the
// algorithm, so the summation order depends on the shape and the GPU). cuBLAS has no f32 × bf16
// GEMM, so f32 activations are first rounded to bf16 (round to nearest even) into a scratch
// buffer held by the handle: the result is the exact product with bf16(x), not with x.
//
// Tolerance (matmul_test): |y - y_ref| <= 5e-4 · Σ_i |bf16(x_i) · W_oi| + 1e-6, where y_ref is
// kernels::cpu::MatMul of W with bf16(x).
//
// Thread-safety: a CublasHandle is used by one host thread at a time (cuBLAS handles are not
// thread-safe), and its calls are ordered on its stream.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct cublasContext;  // cublasHandle_t is cublasContext*

namespace estuary::cuda {

// INTERNAL error "<what>: <CUBLAS_STATUS_...> (<description>)" for a cuBLAS status (an int so
// that this header needs no cuBLAS include); OK for CUBLAS_STATUS_SUCCESS.
absl::Status CublasStatusToStatus(int cublas_status, absl::string_view what);

// An owned cuBLAS handle bound to one stream, plus the scratch the f32 → bf16 conversion needs.
// Movable, not copyable; destroying it waits for its stream only when scratch must be freed.
class CublasHandle {
 public:
  // A handle on the current device whose work goes to `stream` (nullptr: the legacy default
  // stream). UNAVAILABLE when there is no device or cuBLAS cannot start.
  static absl::StatusOr<CublasHandle> Create(cudaStream_t stream);

  CublasHandle() = default;
  CublasHandle(CublasHandle&& other) noexcept { *this = static_cast<CublasHandle&&>(other); }
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();

  cublasContext* get() const { return handle_; }
  cudaStream_t stream() const { return stream_; }

  // Device scratch of at least `bytes` bytes, valid until the next call (grows; growing waits
  // for the stream before freeing the old buffer).
  absl::StatusOr<void*> Scratch(size_t bytes);

  // Makes later calls with inputs of at most `max_scratch_bytes` safe to capture in a CUDA graph:
  // grows the scratch now and gives cuBLAS a fixed workspace of `workspace_bytes`
  // (cublasSetWorkspace), so that no call allocates or synchronizes.
  [[nodiscard]] absl::Status PrepareForCapture(size_t max_scratch_bytes, size_t workspace_bytes);

 private:
  void Reset();

  cublasContext* handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* workspace_ = nullptr;  // cuBLAS's, once PrepareForCapture set one
};

// The GEMM above with f32 activations (rounded to bf16 on the GPU first). n_tokens == 0 is a
// no-op. INVALID_ARGUMENT for null pointers, negative sizes or sizes beyond int; INTERNAL with the
// cuBLAS status name when cuBLAS fails. Asynchronous on handle.stream().
[[nodiscard]] absl::Status MatMulBf16(CublasHandle& handle, const uint16_t* w_bf16,
                                      int64_t out_features, int64_t in_features, const float* x,
                                      int64_t n_tokens, float* y);
// Same with bf16 activations (raw bits), used as they are.
[[nodiscard]] absl::Status MatMulBf16(CublasHandle& handle, const uint16_t* w_bf16,
                                      int64_t out_features, int64_t in_features,
                                      const uint16_t* x_bf16, int64_t n_tokens, float* y);

}  // namespace estuary::cuda
