#pragma once
// Status helpers of the host wrappers in this folder (the .cc files that check arguments, call
// the plain-typed launchers of the .cu files and return absl::Status): a cudaError_t as a
// Status, the "cuda <function>: ..." INVALID_ARGUMENT of the decode-step and element-wise
// wrappers, and a float weight dtype as a launcher's weight-kind enum. Host code only (C++20,
// Abseil): not for the .cu files.

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/tensor/dtype.h"

namespace estuary::cuda::kernels_internal {

// OK for cudaSuccess. Otherwise the thread's last CUDA error is cleared (a failed allocation or
// copy must not resurface as the error of a later launch, whose launcher returns
// cudaGetLastError()), and the status is RESOURCE_EXHAUSTED for cudaErrorMemoryAllocation and
// INTERNAL otherwise, with the message "<what...>: <error name> (<error string>)". The parts of
// `what` are concatenated only on failure.
template <typename... What>
absl::Status CudaStatus(cudaError_t error, const What&... what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  const std::string message = absl::StrCat(what..., ": ", cudaGetErrorName(error), " (",
                                           cudaGetErrorString(error), ")");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// INVALID_ARGUMENT "cuda <what>: <parts...>", `what` naming the public function.
template <typename... Parts>
absl::Status Invalid(const char* what, const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat("cuda ", what, ": ", parts...));
}

// The launcher's weight kind of an f32, bf16 or f16 weight dtype (`Kind`: an enum with kF32,
// kBf16 and kF16); INVALID_ARGUMENT for any other dtype.
template <typename Kind>
absl::Status ToFloatWeightKind(const char* what, DType dtype, Kind* kind) {
  switch (dtype) {
    case DType::kF32:
      *kind = Kind::kF32;
      return absl::OkStatus();
    case DType::kBF16:
      *kind = Kind::kBf16;
      return absl::OkStatus();
    case DType::kF16:
      *kind = Kind::kF16;
      return absl::OkStatus();
    case DType::kInt4:
      break;
  }
  return Invalid(what, "weights must be f32, bf16 or f16, got ", DTypeName(dtype));
}

}  // namespace estuary::cuda::kernels_internal
