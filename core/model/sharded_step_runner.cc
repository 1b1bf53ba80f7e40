#include "core/model/sharded_step_runner.h"

#include <utility>
#include <vector>

#include "core/model/paged_kv_view.h"

namespace estuary {
namespace {

class ShardedStepRunner final : public StepRunner {
 public:
  ShardedStepRunner(ShardedModel& model, const ExitPolicy& policy, std::shared_ptr<KvPool> pool)
      : model_(model), policy_(policy), pool_(std::move(pool)) {}

  const LlamaConfig& config() const override { return model_.config(); }
  int tp_size() const override { return model_.tp_size(); }
  bool has_river() const override { return model_.river(0) != nullptr; }
  bool argmax_in_outcome() const override { return false; }
  std::shared_ptr<KvPool> pool() override { return pool_; }

  absl::Status Forward(absl::Span<const BatchEntry> entries,
                       absl::Span<SequenceKv* const> kvs, const StepOptions& options,
                       absl::Span<float> logits, absl::Span<EntryOutcome> outcomes) override {
    if (kvs.size() != entries.size()) {
      return absl::InvalidArgumentError("one sequence per entry is needed");
    }
    // views[rank][i]: rank `rank`'s view of kvs[i]'s pages.
    std::vector<std::vector<PagedKvView>> views(static_cast<size_t>(model_.tp_size()));
    for (int rank = 0; rank < model_.tp_size(); ++rank) {
      std::vector<PagedKvView>& mine = views[static_cast<size_t>(rank)];
      mine.reserve(kvs.size());
      for (SequenceKv* kv : kvs) mine.emplace_back(kv, rank);
    }
    ShardedForwardOptions forward;
    forward.use_river = options.use_river;
    if (options.exit_policy) forward.policy = policy_;
    forward.chunk_invariant = options.chunk_invariant;
    forward.on_layer_done = options.on_layer_done;
    return model_.Forward(
        entries,
        [&views](int rank, size_t entry) -> KvView* {
          return &views[static_cast<size_t>(rank)][entry];
        },
        forward, logits, outcomes);
  }

 private:
  ShardedModel& model_;
  const ExitPolicy policy_;
  std::shared_ptr<KvPool> pool_;
};

}  // namespace

std::unique_ptr<StepRunner> MakeShardedStepRunner(ShardedModel& model, const ExitPolicy& policy,
                                                  std::shared_ptr<KvPool> pool) {
  return std::make_unique<ShardedStepRunner>(model, policy, std::move(pool));
}

}  // namespace estuary
