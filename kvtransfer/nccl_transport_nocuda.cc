// NcclTransport's CUDA backend in a build without ESTUARY_CUDA: there is none.
#include "absl/strings/str_cat.h"
#include "kvtransfer/nccl_transport_backend.h"

namespace estuary::kvtransfer::nccl {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaNcclBackend(int device) {
  return absl::FailedPreconditionError(
      "the NCCL transport needs CUDA, and this build has none (configure with -DESTUARY_CUDA=ON)");
}

absl::Status CheckCudaDeviceMemory(const void* data, size_t bytes, int device,
                                   std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(what), " cannot be CUDA device memory: this build has no CUDA"));
}

}  // namespace estuary::kvtransfer::nccl
