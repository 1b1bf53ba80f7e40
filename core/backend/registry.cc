// The only file that knows whether the CUDA backend was built (ggml's registry rule).
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/backend/backend.h"
#include "core/backend/cpu/cpu_backend.h"

#if ESTUARY_USE_CUDA
#include "core/backend/cuda/cuda_backend.h"
#endif

namespace estuary {

absl::StatusOr<Backend*> GetBackend(Device device) {
  if (device.is_cpu()) {
    static CpuBackend* cpu = new CpuBackend();  // process lifetime
    return cpu;
  }
#if ESTUARY_USE_CUDA
  return GetCudaBackend(device.ordinal);
#else
  return absl::UnimplementedError(
      absl::StrCat("device ", device.ToString(), ": this build has no CUDA backend "
                   "(configure with -DESTUARY_CUDA=ON)"));
#endif
}

int CudaDeviceCount() {
#if ESTUARY_USE_CUDA
  return CudaDeviceCountImpl();
#else
  return 0;
#endif
}

}  // namespace estuary
