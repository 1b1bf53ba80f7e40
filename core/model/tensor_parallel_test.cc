// Tensor parallelism over CPU ranks: sharding rules, TP 2 against TP 1 and the golden ids (river
// off and on), and a failing rank ending the step instead of hanging it.
#include <memory>
#include <utility>

#include "core/model/generator.h"
#include "core/model/kv_cache.h"
#include "core/model/model_loader.h"
#include "core/model/river.h"
#include "core/model/sharded_model.h"
#include "core/model/tensor_parallel.h"
#include "gtest/gtest.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::GoldenCase;
using ::estuary::testing::LoadGoldenCases;

std::unique_ptr<ShardedModel> LoadSharded(const std::string& model, int tp,
                                          int reduction_blocks = 0) {
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir(model));
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  ShardedModelOptions options;
  options.tp_size = tp;
  options.reduction_blocks = reduction_blocks;
  auto sharded = ShardedModel::Create(std::move(loaded->model), options);
  EXPECT_TRUE(sharded.ok()) << sharded.status();
  return sharded.ok() ? std::move(*sharded) : nullptr;
}

GenerateRequest Greedy(const std::vector<int32_t>& prompt) {
  GenerateRequest request;
  request.prompt_ids = prompt;
  request.max_tokens = ::estuary::testing::kGoldenMaxNewTokens;
  request.sampling.temperature = 0.0f;
  return request;
}

TEST(TensorParallelTest, RejectsSizesThatDoNotDivideTheHeadsWithAClearMessage) {
  LlamaConfig config;
  config.dim = 64;
  config.hidden_dim = 174;
  config.n_layers = 1;
  config.n_heads = 8;
  config.n_kv_heads = 4;
  config.head_dim = 8;
  EXPECT_TRUE(CheckTensorParallelSize(config, 1).ok());
  EXPECT_TRUE(CheckTensorParallelSize(config, 2).ok());
  const absl::Status three = CheckTensorParallelSize(config, 3);
  EXPECT_EQ(three.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(three.message().find("n_kv_heads = 4"), absl::string_view::npos) << three;
  const absl::Status four = CheckTensorParallelSize(config, 4);  // 174 MLP columns
  EXPECT_NE(four.message().find("hidden_dim = 174"), absl::string_view::npos) << four;
  EXPECT_FALSE(CheckTensorParallelSize(config, 0).ok());
}

TEST(TensorParallelTest, ShardsSplitHeadsAndMlpAndShareRowStorage) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& whole = *loaded->model;
  const LlamaConfig& c = whole.config();
  for (int r = 0; r < 2; ++r) {
    auto shard = ShardWeights(c, whole.weights(), {r, 2});
    ASSERT_TRUE(shard.ok()) << shard.status();
    const LlamaLayerWeights& s = shard->layers[1];
    const LlamaLayerWeights& w = whole.weights().layers[1];
    const int64_t q_rows = c.n_heads / 2 * c.head_dim, ffn = c.hidden_dim / 2;
    EXPECT_EQ(s.wq.shape(), (Shape{q_rows, c.dim}));
    EXPECT_EQ(s.wk.shape(), (Shape{c.n_kv_heads / 2 * c.head_dim, c.dim}));
    EXPECT_EQ(s.wo.shape(), (Shape{c.dim, q_rows}));
    EXPECT_EQ(s.w_down.shape(), (Shape{c.dim, ffn}));
    // Row shards are views; column shards hold the right columns.
    EXPECT_EQ(s.wq.data<float>(), w.wq.data<float>() + r * q_rows * c.dim);
    EXPECT_EQ(s.w_gate.data<float>(), w.w_gate.data<float>() + r * ffn * c.dim);
    for (const int64_t row : {int64_t{0}, int64_t{c.dim} - 1}) {
      EXPECT_EQ(s.w_down.data<float>()[row * ffn + 3],
                w.w_down.data<float>()[row * c.hidden_dim + r * ffn + 3]);
      EXPECT_EQ(s.wo.data<float>()[row * q_rows], w.wo.data<float>()[row * c.dim + r * q_rows]);
    }
    auto model = LlamaModel::Create(c, std::move(*shard), {r, 2});
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->local_heads(), c.n_heads / 2);
  }
  // A whole model's weights do not pass as a shard.
  auto wrong = LlamaModel::Create(c, whole.weights(), {0, 2});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
}

class TensorParallelGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelGoldenTest, SizeTwoGivesTheGoldenIdsOnTheBackbone) {
  const std::vector<GoldenCase> cases = LoadGoldenCases(GetParam());
  ASSERT_FALSE(cases.empty());
  std::unique_ptr<ShardedModel> tp2 = LoadSharded(GetParam(), 2);
  ASSERT_NE(tp2, nullptr);
  for (const GoldenCase& c : cases) {
    auto result = Generate(*tp2, Greedy(c.prompt_ids));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->completion_ids, c.completion_ids) << GetParam() << " case " << c.index;
  }
}

// River on (a threshold at which tokens do exit): TP 2 takes exactly TP 1's exit decisions, step
// by step, and produces the same ids. Both use two reduction blocks and the batch-invariant
// kernels, so their hidden states are bit-identical. ShardedModel::Forward fails the step if
// two ranks ever disagree, so a pass also shows every rank took the same decision.
TEST_P(TensorParallelGoldenTest, SizeTwoMatchesSizeOneWithTheRiverOn) {
  const std::vector<GoldenCase> cases = LoadGoldenCases(GetParam());
  std::unique_ptr<ShardedModel> tp1 = LoadSharded(GetParam(), 1, /*reduction_blocks=*/2);
  std::unique_ptr<ShardedModel> tp2 = LoadSharded(GetParam(), 2, /*reduction_blocks=*/2);
  ASSERT_NE(tp1, nullptr);
  ASSERT_NE(tp2, nullptr);
  ASSERT_TRUE(tp1->BuildRiver(Int4QuantOptions()).ok());
  ASSERT_TRUE(tp2->BuildRiver(Int4QuantOptions()).ok());
  ShardedForwardOptions forward;
  forward.use_river = true;
  forward.chunk_invariant = true;
  forward.policy.default_threshold = 0.8f;
  int exits = 0, steps = 0;
  for (const GoldenCase& c : cases) {
    auto one = Generate(*tp1, Greedy(c.prompt_ids), nullptr, forward);
    auto two = Generate(*tp2, Greedy(c.prompt_ids), nullptr, forward);
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ(two->completion_ids, one->completion_ids) << GetParam() << " case " << c.index;
    EXPECT_EQ(two->backbone_layers, one->backbone_layers) << GetParam() << " case " << c.index;
    for (int layers : one->backbone_layers) exits += layers < tp1->config().n_layers;
    steps += static_cast<int>(one->backbone_layers.size());
  }
  EXPECT_GT(exits, steps / 4) << "the river must actually be used for this test to mean much";
}

// With the river off and two reduction blocks, TP 1 and TP 2 give bit-identical logits.
TEST_P(TensorParallelGoldenTest, TwoReductionBlocksMakeSizesOneAndTwoBitIdentical) {
  const std::vector<GoldenCase> cases = LoadGoldenCases(GetParam());
  std::unique_ptr<ShardedModel> tp1 = LoadSharded(GetParam(), 1, 2);
  std::unique_ptr<ShardedModel> tp2 = LoadSharded(GetParam(), 2, 2);
  ASSERT_NE(tp1, nullptr);
  ASSERT_NE(tp2, nullptr);
  const LlamaConfig& c = tp1->config();
  const std::vector<int32_t>& prompt = cases.back().prompt_ids;
  std::vector<std::vector<float>> logits;
  for (ShardedModel* model : {tp1.get(), tp2.get()}) {
    std::vector<ContiguousKvCache> caches;
    for (int r = 0; r < model->tp_size(); ++r) {
      caches.push_back(*ContiguousKvCache::Create(c, 128, model->tp_size()));
    }
    BatchEntry entry;
    entry.tokens = prompt;
    logits.emplace_back(static_cast<size_t>(c.vocab_size));
    EntryOutcome outcome;
    ShardedForwardOptions forward;
    forward.chunk_invariant = true;
    ASSERT_TRUE(model
                    ->Forward(absl::MakeConstSpan(&entry, 1),
                              [&](int rank, size_t) -> KvView* {
                                return &caches[static_cast<size_t>(rank)];
                              },
                              forward, absl::MakeSpan(logits.back()),
                              absl::MakeSpan(&outcome, 1))
                    .ok());
  }
  EXPECT_EQ(logits[0], logits[1]);
}

INSTANTIATE_TEST_SUITE_P(Shipped, TensorParallelGoldenTest,
                         ::testing::ValuesIn(::estuary::testing::GoldenModels()));

// The river's int4 LM head is whole on every rank, as the backbone's: quantized once and shared
// by the ranks' rivers; a head of another shape, or one handed to a river without a head, is
// refused.
TEST(TensorParallelTest, RanksShareOneInt4LmHead) {
  std::unique_ptr<ShardedModel> tp2 = LoadSharded("stories260K", 2);
  ASSERT_NE(tp2, nullptr);
  ASSERT_TRUE(tp2->BuildRiver(Int4QuantOptions(), /*first_layer=*/0, RiverLmHead::kInt4).ok());
  ASSERT_NE(tp2->river(0)->lm_head(), nullptr);
  EXPECT_EQ(tp2->river(1)->lm_head(), tp2->river(0)->lm_head());
  const std::shared_ptr<const Int4Matrix>& head = tp2->river(0)->shared_lm_head();
  EXPECT_EQ(River::Build(tp2->shard(1).weights(), Int4QuantOptions(), 0, 1, RiverLmHead::kShared,
                         head)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto other = Int4Matrix::Quantize(tp2->shard(0).weights().layers[0].wq, Int4QuantOptions());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(River::Build(tp2->shard(1).weights(), Int4QuantOptions(), 0, 1, RiverLmHead::kInt4,
                         std::make_shared<const Int4Matrix>(std::move(*other)))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A rank that fails (here: rank 1 has no KV view) fails the whole step with its status while
// rank 0 waits in an all-reduce; nothing hangs, and the next step runs on a fresh group.
TEST(TensorParallelTest, AFailingRankFailsTheStepAndTheNextStepWorks) {
  std::unique_ptr<ShardedModel> tp2 = LoadSharded("stories260K", 2);
  ASSERT_NE(tp2, nullptr);
  const LlamaConfig& c = tp2->config();
  auto cache0 = ContiguousKvCache::Create(c, 16, 2);
  auto cache1 = ContiguousKvCache::Create(c, 16, 2);
  ASSERT_TRUE(cache0.ok() && cache1.ok());
  const std::vector<int32_t> tokens = {1, 403, 407};
  BatchEntry entry;
  entry.tokens = tokens;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  EntryOutcome outcome;
  const absl::Status failed = tp2->Forward(
      absl::MakeConstSpan(&entry, 1),
      [&](int rank, size_t) -> KvView* { return rank == 0 ? &*cache0 : nullptr; },
      ShardedForwardOptions(), absl::MakeSpan(logits), absl::MakeSpan(&outcome, 1));
  EXPECT_EQ(failed.code(), absl::StatusCode::kInvalidArgument) << failed;
  EXPECT_NE(failed.message().find("rank 1"), absl::string_view::npos) << failed;
  const absl::Status ok = tp2->Forward(
      absl::MakeConstSpan(&entry, 1),
      [&](int rank, size_t) -> KvView* { return rank == 0 ? &*cache0 : &*cache1; },
      ShardedForwardOptions(), absl::MakeSpan(logits), absl::MakeSpan(&outcome, 1));
  EXPECT_TRUE(ok.ok()) << ok;
}

}  // namespace
}  // namespace estuary
