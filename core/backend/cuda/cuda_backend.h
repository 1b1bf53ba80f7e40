#pragma once
// The CUDA backend (built with ESTUARY_CUDA): device memory, pinned host memory, streams and
// copies through the CUDA runtime (the kernels live in core/kernels/cuda). Only registry.cc
// includes this header.

#include "absl/status/statusor.h"
#include "core/backend/backend.h"

namespace estuary {

// The backend of GPU `ordinal`, created on first use and kept for the process's life.
// UNAVAILABLE when that GPU does not exist or the driver cannot be reached.
absl::StatusOr<Backend*> GetCudaBackend(int ordinal);
int CudaDeviceCountImpl();

}  // namespace estuary
