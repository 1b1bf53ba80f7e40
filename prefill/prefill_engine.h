#pragma once
// PrefillEngine: the prefill worker's scheduler over a tensor-parallel model (design §1, §4, §6).
//
// Each Step() runs one forward pass over a batch of prompt chunks of at most
// max_num_batched_tokens tokens in all: requests admitted first get their next chunk first
// (a long prompt is split over several steps, several short prompts share one step). Every
// dense projection runs MatMulPath::kBatchInvariant, so a position's KV is bitwise the same
// whatever the chunk size and whichever other prompts share the step. As each layer of the step
// is written on a rank, a LayerReady event per chunk is delivered (what KV transfer pushes on);
// when a prompt's last chunk is done, the first token is sampled and a PrefillDone event hands
// the sequence's pages to the consumer (see prefill_request.h for events and ownership).
//
// Admission reserves KV pages for the whole prompt at once (all or nothing), in arrival order.
// When the pool has no room a request waits (pages come back as consumers drop finished
// sequences); a prompt that needs more pages than the whole pool holds is refused at Submit()
// with RESOURCE_EXHAUSTED.
//
// Threading: Submit() and Abort() may be called from any thread; Step(), RunUntilIdle() and
// on_done run on one engine thread; on_layer_ready runs on the rank threads. The model must
// outlive the engine. The pool is shared with the PrefillDone events, so a consumer holding an
// event's pages keeps the pool alive past the engine.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/common/request_inbox.h"
#include "core/kvcache/kv_pool.h"
#include "core/model/device_step.h"
#include "core/model/step_runner.h"
#include "core/model/exit_policy.h"
#include "core/model/sharded_model.h"
#include "prefill/prefill_request.h"

namespace estuary {

struct PrefillEngineOptions {
  int max_num_batched_tokens = 512;  // prompt tokens per forward step, over all requests
  int block_size = 16;               // tokens per KV page (must match the decode pool's)
  int64_t kv_cache_bytes = int64_t{256} << 20;  // the pool, all TP shards together
  int max_num_seqs = 64;             // prompts admitted (holding pages, being prefilled) at once
  // Sequence-level exit during prefill (design §5, optional): each chunk runs the exit river
  // under `exit` once its similarity passes τ. Needs ShardedModel::BuildRiver. Off: the full
  // backbone, every slot's provenance kProvenanceFullDepth. The split rule (the default here)
  // decides per chunk, independently of the other chunks in the step.
  bool prefill_exit = false;
  ExitPolicy exit = {.rule = ExitRule::kSplit};
  // >= 0: run the forward steps on this CUDA device (core/model/device_step.h), TP 1, with the
  // pool in GPU memory (its pages then move over the NCCL transport); a CUDA build only. The
  // LayerReady events of a step come as the device finishes each layer. -1: CPU.
  int cuda_device = -1;
  // With cuda_device: > 0 sizes the KV pool from the device's memory instead of kv_cache_bytes
  // (DeviceStepOptions::gpu_memory_utilization).
  double gpu_memory_utilization = 0;
  int device_max_rows = 256;  // prompt rows per device step (CUDA graph buckets up to this)
  DeviceStepOptions device_step() const {
    return {cuda_device, kv_cache_bytes, block_size, device_max_rows, exit, gpu_memory_utilization};
  }

  // INVALID_ARGUMENT naming the flag.
  absl::Status Validate(const LlamaConfig& config) const;
};

class PrefillEngine {
 public:
  // Allocates the pool: KvLayout::FromConfig(config, block_size, tp_size), one shard per rank.
  // FAILED_PRECONDITION when prefill_exit is on and the model has no river.
  static absl::StatusOr<std::unique_ptr<PrefillEngine>> Create(ShardedModel& model,
                                                               const PrefillEngineOptions& options,
                                                               PrefillSink sink);
  ~PrefillEngine();
  PrefillEngine(const PrefillEngine&) = delete;
  PrefillEngine& operator=(const PrefillEngine&) = delete;

  // Queues a request. INVALID_ARGUMENT (naming the limit) for an empty prompt, ids outside the
  // vocabulary, a prompt that fills the context, bad sampling parameters, an exit threshold
  // outside [-1, 2] or a duplicate live request id; RESOURCE_EXHAUSTED for a prompt that needs
  // more pages than the pool has.
  absl::Status Submit(PrefillRequest request);
  // Ends a waiting or running request with CANCELLED (its PrefillDone comes from the next
  // Step()). False when no such request is live.
  bool Abort(const std::string& request_id);

  // One scheduling iteration: takes submissions and aborts, expires deadlines, admits, runs one
  // forward over a batch of chunks and delivers events. A model error fails the requests of the
  // batch with that status (each gets its PrefillDone) and is returned; the engine stays usable.
  absl::Status Step();
  // True when nothing is queued, waiting or running. Engine thread.
  bool Idle() const;
  // Steps until idle. When nothing can run (the pool is full of pages held by consumers) it
  // waits for them briefly between attempts. DEADLINE_EXCEEDED when `deadline` passes first; a
  // model error is returned at once (the affected requests have already failed).
  absl::Status RunUntilIdle(absl::Time deadline = absl::InfiniteFuture());

  const KvPool& pool() const { return *pool_; }
  KvPool& mutable_pool() { return *pool_; }
  const PrefillEngineOptions& options() const { return options_; }
  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t steps() const { return steps_; }
  int64_t prefill_tokens() const { return prefill_tokens_; }

 private:
  struct Sequence;

  PrefillEngine(std::unique_ptr<StepRunner> runner, const PrefillEngineOptions& options,
                PrefillSink sink);

  void DrainInbox();
  void ExpireDeadlines();
  // Builds and runs one batch; sets *ran when a forward pass ran.
  absl::Status RunBatch(bool* ran);
  void Finish(Sequence& sequence, absl::Status status);
  void RemoveFinished();

  // The forward steps, on the CPU ranks or a GPU (CreateStepRunner); it made pool_.
  std::unique_ptr<StepRunner> runner_;
  const PrefillEngineOptions options_;
  const PrefillSink sink_;
  // Shared with every PrefillDone event (which may outlive the engine); declared before the
  // sequences, which hold its pages.
  std::shared_ptr<KvPool> pool_;
  int64_t steps_ = 0;
  int64_t prefill_tokens_ = 0;

  // Requests and aborts from other threads, taken by the engine thread at the start of Step().
  RequestInbox<PrefillRequest> inbox_;

  // Engine-thread state.
  std::deque<std::unique_ptr<Sequence>> waiting_;   // arrival order, no pages yet
  std::vector<std::unique_ptr<Sequence>> running_;  // admitted (pages reserved), arrival order
};

}  // namespace estuary
