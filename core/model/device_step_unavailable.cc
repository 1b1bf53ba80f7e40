// CreateCudaDeviceStep in a build without ESTUARY_CUDA.
#include "core/model/device_step.h"

namespace estuary {

absl::StatusOr<std::unique_ptr<StepRunner>> CreateCudaDeviceStep(const LlamaModel&, const River*,
                                                                 const DeviceStepOptions&) {
  return absl::UnimplementedError(
      "this binary was built without CUDA: rebuild with -DESTUARY_CUDA=ON to decode on a GPU");
}

}  // namespace estuary
