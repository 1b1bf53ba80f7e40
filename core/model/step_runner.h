#pragma once
// StepRunner: what an engine (decode/, prefill/) needs from one forward step, whatever runs it.
// The engines hold one and never ask where it runs: the CPU ranks of a ShardedModel
// (sharded_step_runner.h) and the GPU step (device_step.h) both implement it, so no engine
// branches on the device or names a kernel type.
//
// Ownership: a runner owns (or shares) the KV pool its steps read and write; the engine builds
// its sequences (SequenceKv) over pool() and reserves their pages before each step. The model
// stays the runner's (or its creator's) business.
//
// Thread-safety: Forward() calls are serialized by the caller (one step at a time); the const
// queries may be called from any thread.

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/kvcache/kv_pool.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/forward_batch.h"
#include "core/model/llama_config.h"

namespace estuary {

struct StepOptions {
  // Run the exit river (the runner's, when it has one; see has_river()). Without exit_policy it
  // only stands in for backbone layers that are not resident, where the exit is forced.
  bool use_river = false;
  // Decide exits under the runner's exit policy (given at its creation); otherwise under the
  // default policy, which never exits on its own.
  bool exit_policy = false;
  // The step's results must not depend on how its rows are cut into chunks or batched with other
  // sequences (a prompt prefilled in chunks gives the same KV as in one go). A request, not a
  // promise: the CPU runner maps it to its batch-invariant matmul; the GPU step ignores it
  // (device_step.h).
  bool chunk_invariant = false;
  // Called once layer `layer` of the step has written its KV on rank `rank` (0 on a GPU) for
  // every entry, later layers possibly still running, so a KV push can overlap the step.
  std::function<void(int rank, int layer)> on_layer_done;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // The model's shape (vocabulary, layers, EOS ids).
  virtual const LlamaConfig& config() const = 0;
  // Tensor-parallel ranks a step runs on; every sequence's pages exist once per rank.
  virtual int tp_size() const = 0;
  // Whether an exit river is there for StepOptions::use_river.
  virtual bool has_river() const = 0;
  // Whether each EntryOutcome::argmax holds the last token's argmax even for entries without
  // want_logits, so that greedy sequences need no logits (the GPU step computes it on the device).
  virtual bool argmax_in_outcome() const = 0;
  // Shared so that consumers (a KV push in flight, PrefillDone events) can keep it alive.
  virtual std::shared_ptr<KvPool> pool() = 0;

  // One step: kvs[i] holds entries[i]'s pages (reserved up to its last position; entries' own
  // `kv` is ignored). logits: vocab floats per entry with want_logits, in entry order.
  virtual absl::Status Forward(absl::Span<const BatchEntry> entries,
                               absl::Span<SequenceKv* const> kvs,
                               const StepOptions& options, absl::Span<float> logits,
                               absl::Span<EntryOutcome> outcomes) = 0;

  // Whether a sequence sampled by a greedy (or not) sampler takes its next token from
  // EntryOutcome::argmax instead of its logits. Both engines decide so.
  bool TokenFromArgmax(bool greedy) const { return greedy && argmax_in_outcome(); }
};

}  // namespace estuary
