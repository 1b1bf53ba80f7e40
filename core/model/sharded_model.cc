#include "core/model/sharded_model.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/model/tensor_parallel.h"

namespace estuary {

absl::StatusOr<std::unique_ptr<ShardedModel>> ShardedModel::Create(
    std::unique_ptr<LlamaModel> model, const ShardedModelOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("ShardedModel: no model");
  const int tp = options.tp_size;
  ESTUARY_RETURN_IF_ERROR(CheckTensorParallelSize(model->config(), tp));
  if (options.threads_per_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads per rank = ", options.threads_per_rank, " must be >= 0"));
  }
  if (options.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the collective timeout must be positive");
  }
  std::unique_ptr<ShardedModel> sharded(new ShardedModel());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  sharded->threads_per_rank_ =
      options.threads_per_rank > 0 ? options.threads_per_rank : std::max(1, cores / tp);
  // The GEMM library's threads are divided among the ranks too (its sgemm runs on the decode
  // path's large batches, on every rank at once).
  if (tp > 1) kernels::cpu::SetCpuThreads(sharded->threads_per_rank_);
  sharded->collective_timeout_ = options.collective_timeout;
  if (tp == 1) {
    sharded->owned_shards_.push_back(std::move(model));
  } else {
    for (int r = 0; r < tp; ++r) {
      ESTUARY_ASSIGN_OR_RETURN(LlamaWeights weights,
                               ShardWeights(model->config(), model->weights(), {r, tp}));
      ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> shard,
                               LlamaModel::Create(model->config(), std::move(weights), {r, tp}));
      sharded->owned_shards_.push_back(std::move(shard));
    }
    ESTUARY_ASSIGN_OR_RETURN(sharded->group_, parallel::CpuCommunicatorGroup::Create(tp));
  }
  const int blocks = options.reduction_blocks > 0 ? options.reduction_blocks : tp;
  if (blocks % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("reduction blocks ", blocks,
                                                   " must be a multiple of the TP size ", tp));
  }
  ESTUARY_RETURN_IF_ERROR(CheckTensorParallelSize(sharded->owned_shards_[0]->config(), blocks));
  for (std::unique_ptr<LlamaModel>& shard : sharded->owned_shards_) {
    ESTUARY_RETURN_IF_ERROR(shard->SplitRowParallel(blocks / tp));
    sharded->shards_.push_back(shard.get());
  }
  sharded->rivers_.resize(static_cast<size_t>(tp));
  sharded->owned_rivers_.resize(static_cast<size_t>(tp));
  if (options.debug_stall_rank >= tp) {
    return absl::InvalidArgumentError(absl::StrCat("the rank to stall, ", options.debug_stall_rank,
                                                   ", is not below the TP size ", tp));
  }
  sharded->threads_ = std::make_unique<parallel::RankThreads>(tp, options.debug_stall_rank);
  for (int r = 0; r < tp; ++r) {
    sharded->pools_.push_back(std::make_unique<WorkerPool>(sharded->threads_per_rank_));
  }
  return sharded;
}

std::unique_ptr<ShardedModel> ShardedModel::Borrow(const LlamaModel& model, const River* river,
                                                   int threads) {
  std::unique_ptr<ShardedModel> sharded(new ShardedModel());
  sharded->shards_ = {&model};
  sharded->rivers_ = {river};
  sharded->owned_rivers_.resize(1);
  sharded->threads_per_rank_ = std::max(1, threads);
  sharded->collective_timeout_ = absl::Seconds(30);
  sharded->threads_ = std::make_unique<parallel::RankThreads>(1);
  sharded->pools_.push_back(std::make_unique<WorkerPool>(sharded->threads_per_rank_));
  return sharded;
}

ShardedModel::~ShardedModel() = default;

absl::Status ShardedModel::BuildRiver(const Int4QuantOptions& options, int first_layer,
                                      RiverLmHead lm_head) {
  // Every rank holds the whole LM head (replicated, as the backbone's): quantized once, on rank
  // 0's river, and shared by the others'.
  std::shared_ptr<const Int4Matrix> head;
  for (size_t r = 0; r < shards_.size(); ++r) {
    ESTUARY_ASSIGN_OR_RETURN(owned_rivers_[r],
                             River::Build(shards_[r]->weights(), options, first_layer,
                                          shards_[r]->row_parallel_blocks(), lm_head, head));
    head = owned_rivers_[r]->shared_lm_head();
    rivers_[r] = owned_rivers_[r].get();
  }
  return absl::OkStatus();
}

const River* ShardedModel::river(int rank) const { return rivers_[static_cast<size_t>(rank)]; }

absl::StatusOr<int64_t> ShardedModel::ReleaseBackboneLayersFrom(int resident_layers) {
  if (owned_shards_.empty()) {
    return absl::FailedPreconditionError("a borrowed model's backbone cannot be released here");
  }
  int64_t released = 0;
  for (const std::unique_ptr<LlamaModel>& shard : owned_shards_) {
    ESTUARY_ASSIGN_OR_RETURN(const int64_t bytes, shard->ReleaseBackboneLayersFrom(resident_layers));
    released += bytes;
  }
  return released;
}

absl::Status ShardedModel::Forward(absl::Span<const BatchEntry> entries, const KvResolver& kv_for,
                                   const ShardedForwardOptions& options,
                                   absl::Span<float> logits, absl::Span<EntryOutcome> outcomes) {
  if (options.use_river && rivers_[0] == nullptr) {
    return absl::FailedPreconditionError("the exit river was asked for but not built");
  }
  if (outcomes.size() != entries.size()) {
    return absl::InvalidArgumentError("one outcome per batch entry is needed");
  }
  const int tp = tp_size();
  std::vector<std::vector<EntryOutcome>> rank_outcomes(static_cast<size_t>(tp));
  auto run_rank = [&](int rank) -> absl::Status {
    std::vector<BatchEntry> local(entries.begin(), entries.end());
    for (size_t e = 0; e < local.size(); ++e) {
      local[e].kv = kv_for(rank, e);
      if (local[e].kv == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("no KV view for entry ", e, " on rank ", rank));
      }
      if (rank != 0) {
        local[e].want_logits = false;     // the LM head runs on rank 0 only
        local[e].layer_inputs = nullptr;  // the residual stream is the same on every rank
      }
    }
    ForwardOptions forward;
    forward.river = options.use_river ? rivers_[static_cast<size_t>(rank)] : nullptr;
    forward.policy = options.policy;
    forward.matmul = {options.chunk_invariant ? kernels::cpu::MatMulPath::kBatchInvariant
                                              : kernels::cpu::MatMulPath::kFastest,
                      pools_[static_cast<size_t>(rank)].get()};
    forward.comm = group_ != nullptr ? &group_->rank(rank) : nullptr;
    forward.collective_timeout = collective_timeout_;
    if (options.on_layer_done) {
      forward.on_layer_done = [&options, rank](int layer) { options.on_layer_done(rank, layer); };
    }
    std::vector<EntryOutcome>& mine = rank_outcomes[static_cast<size_t>(rank)];
    mine.resize(entries.size());
    return ForwardBatch(*shards_[static_cast<size_t>(rank)], local, forward,
                        rank == 0 ? logits : absl::Span<float>(), absl::MakeSpan(mine));
  };
  absl::Status status = threads_->Run(run_rank, [this](const absl::Status& error) {
    if (group_ != nullptr) group_->Abort(error);
  });
  if (!status.ok()) {
    // An aborted group cannot be revived: the next step gets a new one.
    if (group_ != nullptr) {
      ESTUARY_ASSIGN_OR_RETURN(group_, parallel::CpuCommunicatorGroup::Create(tp));
    }
    return status;
  }
  for (int r = 1; r < tp; ++r) {
    for (size_t e = 0; e < entries.size(); ++e) {
      if (rank_outcomes[static_cast<size_t>(r)][e].backbone_layers !=
          rank_outcomes[0][e].backbone_layers) {
        return absl::InternalError(absl::StrCat(
            "tensor-parallel ranks took different exit decisions for entry ", e, ": rank 0 ran ",
            rank_outcomes[0][e].backbone_layers, " backbone layers, rank ", r, " ran ",
            rank_outcomes[static_cast<size_t>(r)][e].backbone_layers));
      }
    }
  }
  std::copy(rank_outcomes[0].begin(), rank_outcomes[0].end(), outcomes.begin());
  return absl::OkStatus();
}

}  // namespace estuary
