// The engine-side helpers of device_step.h (built with and without CUDA).
#include "core/model/device_step.h"

#include "absl/strings/str_cat.h"

namespace estuary {

absl::Status ValidateDeviceSettings(int cuda_device, int max_rows) {
  if (cuda_device < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device = ", cuda_device, " must be >= 0 (or -1 for the CPU)"));
  }
  if (max_rows < 1 || max_rows > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("device rows per step = ", max_rows, " must be in [1, 1024]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceStep>> CreateDeviceStepFor(const ShardedModel& model,
                                                                const DeviceStepOptions& options,
                                                                std::string_view engine) {
  if (model.tp_size() != 1) {
    return absl::UnimplementedError(
        absl::StrCat("tensor parallelism on GPUs is not wired into the ",
                     absl::string_view(engine.data(), engine.size()),
                     " engine yet; use TP 1 with a CUDA device"));
  }
  return CreateCudaDeviceStep(model.shard(0), model.river(0), options);
}

}  // namespace estuary
