#pragma once
// DeviceStep: an engine's forward steps on a GPU (DecodeEngineOptions::cuda_device,
// PrefillEngineOptions::cuda_device), in place of ShardedModel::Forward on CPU ranks.
//
// It owns the model's device copy (core/model/cuda) and the KV pool, whose page bookkeeping stays
// on the host and whose layer regions are GPU memory. The engine keeps scheduling exactly as on
// the CPU: its sequences are SequenceKv over pool(), it reserves their pages, and it samples on
// the host from the logits Forward returns. Steps run on one of two device decoders that share
// the pool: one under the default exit policy (no exit: the decode engine's prefill), one under
// the engine's policy (the decode engine's decode steps, the prefill engine's prefill_exit).
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
#include "core/sampling/sampler.h"

namespace estuary {

class DeviceStep {
 public:
  virtual ~DeviceStep() = default;
  // Shared so that consumers (a KV push in flight) can keep it alive, as the CPU engines' pools.
  virtual std::shared_ptr<KvPool> pool() = 0;
  // One forward step, as ShardedModel::Forward on one rank: kvs[i] holds entries[i]'s pages
  // (reserved up to its last position); `with_policy` runs it under the engine's exit policy,
  // otherwise with no exit. logits: vocab floats per entry with want_logits, in entry order.
  // `on_layer_done(layer)`, when set, is called for every layer in order as soon as the device
  // has written that layer's KV for every entry (later layers still running), so a KV push can
  // overlap the rest of the step.
  virtual absl::Status Forward(absl::Span<const BatchEntry> entries,
                               absl::Span<const SequenceKv* const> kvs, bool with_policy,
                               absl::Span<float> logits, absl::Span<EntryOutcome> outcomes,
                               const std::function<void(int layer)>& on_layer_done = nullptr) = 0;
};

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
absl::StatusOr<std::unique_ptr<DeviceStep>> CreateCudaDeviceStep(const LlamaModel& model,
                                                                 const River* river,
                                                                 const DeviceStepOptions& options);

// Whether an engine takes a sequence's next token from the device's argmax (EntryOutcome::argmax)
// instead of sampling downloaded logits: a GPU step and greedy sampling. Both engines decide so.
inline bool TokenFromDeviceArgmax(const DeviceStep* step, const Sampler& sampler) {
  return step != nullptr && sampler.greedy();
}

// What both engines do with their cuda_device settings. INVALID_ARGUMENT for a device below -1
// (-1 is the CPU) or rows per step outside [1, 1024].
// `gpu_memory_utilization` must be 0 (off), or in (0, 1] with a CUDA device.
absl::Status ValidateDeviceSettings(int cuda_device, int max_rows,
                                    double gpu_memory_utilization = 0);
// The GPU step of a TP-1 ShardedModel (its shard and river); UNIMPLEMENTED above TP 1, naming
// `engine` ("decode", "prefill").
absl::StatusOr<std::unique_ptr<DeviceStep>> CreateDeviceStepFor(const ShardedModel& model,
                                                                const DeviceStepOptions& options,
                                                                std::string_view engine);

}  // namespace estuary
