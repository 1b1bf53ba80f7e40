#pragma once
// The GPU StepRunner (step_runner.h): an engine's forward steps on a GPU
// (DecodeEngineOptions::cuda_device, PrefillEngineOptions::cuda_device), in place of the CPU
// ranks' runner (sharded_step_runner.h).
//
// It owns the model's device copy (core/model/cuda) and the KV pool, whose page bookkeeping stays
// on the host and whose layer regions are GPU memory. The engine keeps scheduling exactly as on
// the CPU: its sequences are SequenceKv over pool(), it reserves their pages, and it samples on
// the host from the logits Forward returns. Steps run on one of two device decoders that share
// the pool: one under the default exit policy (no exit: the decode engine's prefill), one under
// the engine's policy (StepOptions::exit_policy: the decode engine's decode steps, the prefill
// engine's prefill_exit). Its outcomes carry the device's argmax (argmax_in_outcome()), its
// layer callbacks come with rank 0, and it does not honour chunk_invariant (as before the
// StepRunner: its prefill decoder runs cuBLAS on bf16 weights, whose sums follow the shape).
//
// Built for real only with ESTUARY_CUDA (target estuary::device_step); otherwise
// CreateCudaDeviceStep is UNIMPLEMENTED.

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/kvcache/kv_pool.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/exit_policy.h"
#include "core/model/forward_batch.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"
#include "core/model/sharded_model.h"
#include "core/model/step_runner.h"

namespace estuary {

struct DeviceStepOptions {
  int device = 0;  // CUDA ordinal
  int64_t kv_cache_bytes = 0;
  int block_size = 16;
  int max_rows = 64;  // rows per device step; longer prefills run in several
  ExitPolicy policy;  // the engine's exit policy
  // > 0 (vLLM's --gpu-memory-utilization): the KV pool is sized once the weights are on the
  // device, so that the device's use reaches this share of its memory (KvBytesForUtilization);
  // kv_cache_bytes is then unused.
  double gpu_memory_utilization = 0;
};

// Device memory left over for the KV pool so that `utilization` of `total_bytes` is in use,
// `free_bytes` being free now (the weights loaded), less a workspace for the decoders'
// activations (an eighth of what is left, at most 1 GiB). RESOURCE_EXHAUSTED, naming the
// figures, when nothing is left.
absl::StatusOr<int64_t> KvBytesForUtilization(double utilization, int64_t free_bytes,
                                              int64_t total_bytes);

// UNIMPLEMENTED in a build without CUDA; UNAVAILABLE when the device does not exist;
// FAILED_PRECONDITION for a model the device path does not run (device_model.h).
absl::StatusOr<std::unique_ptr<StepRunner>> CreateCudaDeviceStep(const LlamaModel& model,
                                                                 const River* river,
                                                                 const DeviceStepOptions& options);

// What both engines do with their cuda_device settings. INVALID_ARGUMENT for a device below -1
// (-1 is the CPU) or rows per step outside [1, 1024].
// `gpu_memory_utilization` must be 0 (off), or in (0, 1] with a CUDA device.
absl::Status ValidateDeviceSettings(int cuda_device, int max_rows,
                                    double gpu_memory_utilization = 0);
// The GPU step of a TP-1 ShardedModel (its shard and river); UNIMPLEMENTED above TP 1, naming
// `engine` ("decode", "prefill").
absl::StatusOr<std::unique_ptr<StepRunner>> CreateDeviceStepFor(const ShardedModel& model,
                                                                const DeviceStepOptions& options,
                                                                std::string_view engine);

// The runner an engine's settings ask for, so that engines do not pick one themselves: the GPU
// step (CreateDeviceStepFor) when options.device >= 0, else the CPU ranks' runner
// (sharded_step_runner.h) over a new KV pool of options.kv_cache_bytes across `model`'s ranks,
// its regions from `allocator` (default: anonymous mappings). `model` must outlive the runner.
absl::StatusOr<std::unique_ptr<StepRunner>> CreateStepRunner(ShardedModel& model,
                                                             const DeviceStepOptions& options,
                                                             const KvRegionAllocator& allocator,
                                                             std::string_view engine);

}  // namespace estuary
