#pragma once
// ShardedModel: a Llama model spread over the tensor-parallel ranks of one worker process
// (design §6), and the one entry point through which workers run it. With tp_size 1 it wraps
// the whole model and runs on the caller's thread, with no communicator: exactly ForwardBatch.
//
// Ownership: owns the rank shards (LlamaModel each; see tensor_parallel.h for the split), their
// exit rivers, the rank threads and the CPU communicator group that joins them. The whole model
// handed to Create() is consumed: row shards share its weight storage, column shards are copies,
// and the rest is dropped.
//
// A forward step runs ForwardBatch on every rank at once, each rank on its own thread with its
// own KV views (the caller maps each entry to rank r's view), the o and down projections
// all-reduced in between. A rank that fails (a kernel error, a collective past its deadline)
// aborts the group so that the other ranks return at once; the step fails with that rank's
// status and the next step gets a fresh group. After each step the ranks' exit decisions are
// compared; ranks that disagree fail the step with INTERNAL (they cannot, since the residual
// stream is identical on every rank, but a bug here would silently corrupt KV).
//
// Thread-safety: Forward() calls are serialized (one step at a time); the const accessors may be
// called from any thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/common/worker_pool.h"
#include "core/kernels/cpu/kernels.h"
#include "core/model/exit_policy.h"
#include "core/model/forward_batch.h"
#include "core/model/llama_model.h"
#include "core/model/river.h"
#include "core/parallel/cpu_communicator.h"
#include "core/parallel/rank_threads.h"

namespace estuary {

struct ShardedModelOptions {
  int tp_size = 1;
  // Threads each rank's batch-invariant GEMM may use; 0: the machine's cores / tp_size (at least
  // one). With tp_size > 1, OpenBLAS's thread count is set to the same share (process-wide).
  // The decode path's GEMV is single-threaded per rank either way.
  int threads_per_rank = 0;
  // Longest wait of one all-reduce for the other ranks.
  absl::Duration collective_timeout = absl::Seconds(30);
  // TP invariance: the o and down projections (and their river copies) are computed as this
  // many column blocks in all, summed in block order: each rank computes reduction_blocks /
  // tp_size blocks and the all-reduce adds the ranks' sums in rank order. So every TP size that
  // divides it gives bit-identical hidden states, exit decisions and KV (with the
  // batch-invariant kernels; the fastest path's OpenBLAS sgemm changes with the shape). 0: the
  // TP size itself (plain Megatron). Must be a multiple of tp_size dividing the heads and the
  // MLP width; 2 makes TP 1 and TP 2 agree.
  int reduction_blocks = 0;
  // Fault injection for tests (parallel::RankThreads' stall_rank): this rank stops making
  // progress at the first step, for good. -1: none.
  int debug_stall_rank = -1;
};

struct ShardedForwardOptions {
  bool use_river = false;  // run the exit river under `policy` (BuildRiver first)
  ExitPolicy policy;
  // Results independent of how rows are chunked and batched: the batch-invariant matmul
  // (MatMulPath::kBatchInvariant) instead of the fastest one. Mapped in Forward().
  bool chunk_invariant = false;
  // Called on rank `rank`'s thread once layer `layer` of the step has written its KV there.
  std::function<void(int rank, int layer)> on_layer_done;
};

class ShardedModel {
 public:
  // INVALID_ARGUMENT when tp_size does not divide the model's heads, KV heads or MLP width.
  static absl::StatusOr<std::unique_ptr<ShardedModel>> Create(std::unique_ptr<LlamaModel> model,
                                                              const ShardedModelOptions& options);
  // TP 1 over a model (and optional river) the caller owns and keeps alive: for engines and
  // tools that were handed a plain LlamaModel, its kernels on a pool of `threads` threads.
  // ReleaseBackboneLayersFrom is not available.
  static std::unique_ptr<ShardedModel> Borrow(const LlamaModel& model, const River* river,
                                              int threads = 1);
  ~ShardedModel();

  int tp_size() const { return static_cast<int>(shards_.size()); }
  const LlamaConfig& config() const { return shards_[0]->config(); }
  const LlamaModel& shard(int rank) const { return *shards_[static_cast<size_t>(rank)]; }
  int threads_per_rank() const { return threads_per_rank_; }

  // Quantizes each rank's shard into that rank's exit river (layers >= first_layer, and the LM
  // head with RiverLmHead::kInt4).
  absl::Status BuildRiver(const Int4QuantOptions& options, int first_layer = 0,
                          RiverLmHead lm_head = RiverLmHead::kShared);
  // Rank `rank`'s river; null before BuildRiver.
  const River* river(int rank) const;
  // LlamaModel::ReleaseBackboneLayersFrom on every rank; returns the bytes freed over all ranks.
  absl::StatusOr<int64_t> ReleaseBackboneLayersFrom(int resident_layers);

  // Maps batch entry `entry` to rank `rank`'s KV view of that sequence.
  using KvResolver = std::function<KvView*(int rank, size_t entry)>;
  // One step. `entries` give tokens, positions, thresholds and want_logits; their `kv` is
  // ignored (kv_for supplies each rank's). Logits come from rank 0, as ForwardBatch lays them
  // out; outcomes are rank 0's (equal on every rank, checked).
  absl::Status Forward(absl::Span<const BatchEntry> entries, const KvResolver& kv_for,
                       const ShardedForwardOptions& options, absl::Span<float> logits,
                       absl::Span<EntryOutcome> outcomes);

 private:
  ShardedModel() = default;

  std::vector<const LlamaModel*> shards_;  // [rank]; owned_shards_ or borrowed
  std::vector<const River*> rivers_;       // [rank]; owned_rivers_ or borrowed; null: none
  std::vector<std::unique_ptr<LlamaModel>> owned_shards_;
  std::vector<std::unique_ptr<River>> owned_rivers_;
  int threads_per_rank_ = 1;
  absl::Duration collective_timeout_;
  std::unique_ptr<parallel::RankThreads> threads_;
  std::vector<std::unique_ptr<WorkerPool>> pools_;  // [rank]: threads_per_rank_ threads each
  std::unique_ptr<parallel::CpuCommunicatorGroup> group_;  // null for tp_size 1
};

}  // namespace estuary
