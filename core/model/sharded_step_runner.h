#pragma once
// The CPU StepRunner (step_runner.h): each step runs ShardedModel::Forward on the model's TP
// ranks, over every rank's PagedKvView of the sequences' pages. StepOptions::chunk_invariant maps
// to the batch-invariant matmul here, inside core/model, so engines name no kernel type.
//
// Ownership: borrows the ShardedModel (the caller keeps it alive); shares the KV pool.

#include <memory>

#include "core/kvcache/kv_pool.h"
#include "core/model/exit_policy.h"
#include "core/model/sharded_model.h"
#include "core/model/step_runner.h"

namespace estuary {

// `model` must outlive the runner. `pool` has `model`'s layout over its tp_size() shards.
// `policy`: the engine's exit policy, for StepOptions::exit_policy.
std::unique_ptr<StepRunner> MakeShardedStepRunner(ShardedModel& model, const ExitPolicy& policy,
                                                  std::shared_ptr<KvPool> pool);

}  // namespace estuary
