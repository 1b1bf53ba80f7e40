// The engine-side helpers of device_step.h (built with and without CUDA).
#include "core/model/device_step.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/kvcache/kv_layout.h"
#include "core/model/sharded_step_runner.h"

namespace estuary {

absl::Status ValidateDeviceSettings(int cuda_device, int max_rows,
                                    double gpu_memory_utilization) {
  if (gpu_memory_utilization != 0) {
    if (cuda_device < 0) {
      return absl::InvalidArgumentError(
          "--gpu-memory-utilization applies to a CUDA device (--device cuda); on the CPU size the "
          "KV pool with --kv-cache-memory (e.g. 2GiB)");
    }
    if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpu-memory-utilization = ", gpu_memory_utilization, " must be in (0, 1]"));
    }
  }
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

absl::StatusOr<int64_t> KvBytesForUtilization(double utilization, int64_t free_bytes,
                                              int64_t total_bytes) {
  if (!(utilization > 0.0 && utilization <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-memory-utilization = ", utilization,
                                                   " must be in (0, 1]"));
  }
  const int64_t used = total_bytes - free_bytes;
  const int64_t budget = static_cast<int64_t>(utilization * static_cast<double>(total_bytes));
  const int64_t left = budget - used;
  const int64_t workspace = std::min<int64_t>(left / 8, int64_t{1} << 30);
  const int64_t kv = left - workspace;
  if (kv <= 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--gpu-memory-utilization = ", utilization, " leaves no room for the KV cache: ",
        used >> 20, " MiB of the device's ", total_bytes >> 20,
        " MiB are in use already (the weights among them); raise it or use --kv-cache-memory"));
  }
  return kv;
}

absl::StatusOr<std::unique_ptr<StepRunner>> CreateDeviceStepFor(const ShardedModel& model,
                                                                const DeviceStepOptions& options,
                                                                std::string_view engine) {
  if (model.tp_size() != 1) {
    return absl::UnimplementedError(
        absl::StrCat("tensor parallelism on GPUs is not wired into the ",
                     absl::string_view(engine.data(), engine.size()),
                     " engine yet; use TP 1 with a CUDA device"));
  }
  if (model.river(0) != nullptr && model.river(0)->lm_head() != nullptr) {
    return absl::UnimplementedError(
        "the GPU step reads the backbone's LM head for every token: build the river without an "
        "int4 LM head (--river-lm-head shared)");
  }
  return CreateCudaDeviceStep(model.shard(0), model.river(0), options);
}

absl::StatusOr<std::unique_ptr<StepRunner>> CreateStepRunner(ShardedModel& model,
                                                             const DeviceStepOptions& options,
                                                             const KvRegionAllocator& allocator,
                                                             std::string_view engine) {
  if (options.device >= 0) return CreateDeviceStepFor(model, options, engine);
  const int tp = model.tp_size();
  ESTUARY_ASSIGN_OR_RETURN(
      std::unique_ptr<KvPool> pool,
      KvPool::Create(KvLayout::FromConfig(model.config(), options.block_size, tp),
                     options.kv_cache_bytes, tp, allocator));
  return MakeShardedStepRunner(model, options.policy, std::shared_ptr<KvPool>(std::move(pool)));
}

}  // namespace estuary
