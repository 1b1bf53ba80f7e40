#pragma once
// DeviceStep: the decode engine's forward steps on a GPU (DecodeEngineOptions::cuda_device).
//
// It owns the model's device copy (core/model/cuda) and the KV pool, whose page bookkeeping stays
// on the host and whose layer regions are GPU memory. The engine keeps scheduling exactly as on
// the CPU: its sequences are SequenceKv over pool(), it reserves their pages, and it samples on
// the host from the logits Forward returns. Prefill entries (τ above 1) and decode entries run on
// two device decoders that share the pool: prefill under the default exit policy, decode under
// the engine's, as the CPU engine does.
//
// Built for real only with ESTUARY_CUDA; otherwise CreateCudaDeviceStep is UNIMPLEMENTED.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/kvcache/kv_pool.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/exit_policy.h"
#include "core/model/forward_batch.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"

namespace estuary {

class DeviceStep {
 public:
  virtual ~DeviceStep() = default;
  virtual KvPool& pool() = 0;
  // One forward step, as ShardedModel::Forward on one rank: kvs[i] holds entries[i]'s pages
  // (reserved up to its last position); `decode` picks the engine's exit policy (else prefill's).
  // logits: vocab floats per entry with want_logits, in entry order.
  virtual absl::Status Forward(absl::Span<const BatchEntry> entries,
                               absl::Span<const SequenceKv* const> kvs, bool decode,
                               absl::Span<float> logits, absl::Span<EntryOutcome> outcomes) = 0;
};

struct DeviceStepOptions {
  int device = 0;                 // CUDA ordinal
  int64_t kv_cache_bytes = 0;
  int block_size = 16;
  int max_rows = 64;              // rows per device step; longer prefills run in several
  ExitPolicy decode_policy;       // the engine's exit policy
};

// UNIMPLEMENTED in a build without CUDA; UNAVAILABLE when the device does not exist;
// FAILED_PRECONDITION for a model the device path does not run (device_model.h).
absl::StatusOr<std::unique_ptr<DeviceStep>> CreateCudaDeviceStep(const LlamaModel& model,
                                                                 const River* river,
                                                                 const DeviceStepOptions& options);

}  // namespace estuary
