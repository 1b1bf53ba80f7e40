// The exit river against independent references:
//   - τ = −1 with min_backbone_layers = m equals a plain model whose layers >= m carry the
//     dequantized int4 weights (m bf16/f32 layers, then int4 layers);
//   - river-written KV lands in the sequence's own pages and provenance records the exit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/kvcache/kv_pool.h"
#include "core/kvcache/sequence_kv.h"
#include "core/model/forward_batch.h"
#include "core/model/kv_cache.h"
#include "core/model/model_loader.h"
#include "core/model/paged_kv_view.h"
#include "core/model/river.h"
#include "core/quant/int4_matmul.h"
#include "core/sampling/sampler.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

// A model whose layers >= m use the river's dequantized weights, and whose LM head is the
// river's dequantized head when the river has one.
std::unique_ptr<LlamaModel> DequantizedReference(const LlamaModel& model, const River& river,
                                                 int m) {
  LlamaWeights weights = model.weights();
  if (river.lm_head() != nullptr) {
    auto head = river.lm_head()->DequantizeToF32();
    EXPECT_TRUE(head.ok()) << head.status();
    weights.lm_head = *head;  // no longer the embedding's storage when the model ties them
  }
  for (int l = m; l < model.config().n_layers; ++l) {
    LlamaLayerWeights& w = weights.layers[static_cast<size_t>(l)];
    for (auto [dense, int4] :
         std::initializer_list<std::pair<Tensor*, const Int4Matrix*>>{
             {&w.wq, &river.matrix(l, RiverProjection::kQ)},
             {&w.wk, &river.matrix(l, RiverProjection::kK)},
             {&w.wv, &river.matrix(l, RiverProjection::kV)},
             {&w.wo, &river.matrix(l, RiverProjection::kO)},
             {&w.w_gate, &river.matrix(l, RiverProjection::kGate)},
             {&w.w_up, &river.matrix(l, RiverProjection::kUp)},
             {&w.w_down, &river.matrix(l, RiverProjection::kDown)}}) {
      auto dequantized = int4->DequantizeToF32();
      EXPECT_TRUE(dequantized.ok());
      *dense = *dequantized;
    }
  }
  auto reference = LlamaModel::Create(model.config(), std::move(weights));
  EXPECT_TRUE(reference.ok()) << reference.status();
  return std::move(*reference);
}

// The int4 kernel for one test, set before the river is built (Int4Layout::kAuto follows it).
class ScopedInt4Path {
 public:
  explicit ScopedInt4Path(Int4Path path) { SetInt4MatMulPath(path); }
  ~ScopedInt4Path() { SetInt4MatMulPath(Int4Path::kAuto); }
};

// Logit tolerance relative to 1 + max |logit|: the Highway kernel rounds activations to int16
// per group (error ~1e-5 of the group's largest), VNNI's and AVX2's to int8 (up to 1/254 of
// it), and the error runs through every river layer and 40 steps of KV. Seen at VNNI: 0.019 on
// stories12L, 0.041 on stories260K (dim 64: one group per row); a wrong kernel is off by ~1.
float LogitTolerance(Int4Path path) { return path == Int4Path::kHighway ? 2e-3f : 8e-2f; }

class RiverReferenceTest
    : public ::testing::TestWithParam<std::tuple<std::string, bool, Int4Path, RiverLmHead>> {};

TEST_P(RiverReferenceTest, ForcedExitEqualsDequantizedReference) {
  const auto& [model_name, last, path, head] = GetParam();
  if (path == Int4Path::kVnni && !Int4VnniAvailable()) GTEST_SKIP() << "no AVX512-VNNI here";
  if (path == Int4Path::kAvx2 && !Int4Avx2Available()) GTEST_SKIP() << "no AVX2 here";
  const ScopedInt4Path kernel(path);
  auto loaded = LoadModel("models/" + model_name);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& model = *loaded->model;
  const int n_layers = model.config().n_layers;
  const int m = last ? n_layers - 1 : 1;
  auto river = River::Build(model.weights(), Int4QuantOptions(), 0, 1, head);
  ASSERT_TRUE(river.ok()) << river.status();
  ASSERT_EQ((*river)->lm_head() != nullptr, head == RiverLmHead::kInt4);
  const std::unique_ptr<LlamaModel> reference = DequantizedReference(model, **river, m);

  ForwardOptions options;
  options.river = river->get();
  options.policy.min_backbone_layers = m;
  const int vocab = model.config().vocab_size;
  auto river_cache = ContiguousKvCache::Create(model.config(), 64);
  auto reference_cache = ContiguousKvCache::Create(model.config(), 64);
  ASSERT_TRUE(river_cache.ok() && reference_cache.ok());
  std::vector<float> river_logits(vocab), reference_logits(vocab);
  // Greedy continuation of a prompt, every token its own step, on both paths.
  std::vector<int32_t> tokens = {1, 403, 407, 261, 378};
  for (int pos = 0; pos < 40; ++pos) {
    BatchEntry entry;
    entry.tokens = absl::MakeConstSpan(&tokens[static_cast<size_t>(pos)], 1);
    entry.start_pos = pos;
    entry.kv = &*river_cache;
    entry.exit_threshold = -1.0f;
    EntryOutcome outcome;
    ASSERT_TRUE(ForwardBatch(model, absl::MakeConstSpan(&entry, 1), options,
                             absl::MakeSpan(river_logits), absl::MakeSpan(&outcome, 1))
                    .ok());
    EXPECT_EQ(outcome.backbone_layers, m);
    EXPECT_EQ(river_cache->provenance(pos), m - 1);
    ASSERT_TRUE(reference
                    ->Forward(absl::MakeConstSpan(&tokens[static_cast<size_t>(pos)], 1), pos,
                              *reference_cache, absl::MakeSpan(reference_logits))
                    .ok());
    float max_abs = 0.0f;
    for (float logit : reference_logits) max_abs = std::max(max_abs, std::fabs(logit));
    for (int i = 0; i < vocab; ++i) {
      ASSERT_NEAR(river_logits[i], reference_logits[i], LogitTolerance(path) * (1.0f + max_abs))
          << model_name << " m=" << m << " pos " << pos << " logit " << i;
    }
    if (pos + 1 == static_cast<int>(tokens.size())) tokens.push_back(Argmax(reference_logits));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shipped, RiverReferenceTest,
    ::testing::Combine(::testing::Values("stories260K", "stories12L"), ::testing::Bool(),
                       ::testing::Values(Int4Path::kHighway, Int4Path::kVnni, Int4Path::kAvx2),
                       ::testing::Values(RiverLmHead::kShared, RiverLmHead::kInt4)));

// stories12L with its exit river (int4, the default options), loaded by each test that needs it.
class RiverTest : public ::testing::Test {
 protected:
  void Load() {
    auto model = LoadModel("models/stories12L");
    ASSERT_TRUE(model.ok()) << model.status();
    loaded = std::move(*model);
    auto built = River::Build(loaded->model->weights(), Int4QuantOptions());
    ASSERT_TRUE(built.ok()) << built.status();
    river = std::move(*built);
  }
  std::optional<LoadedModel> loaded;
  std::unique_ptr<River> river;
};

// River KV goes into the same pages as backbone KV; provenance records the last backbone layer;
// layers below the exit hold exactly the backbone's KV.
TEST_F(RiverTest, RiverKvLandsInTheSequencePagesWithProvenance) {
  ASSERT_NO_FATAL_FAILURE(Load());
  const LlamaModel& model = *loaded->model;
  const LlamaConfig& c = model.config();
  auto pool = KvPool::Create(KvLayout::FromConfig(c, 16), int64_t{8} << 20);
  ASSERT_TRUE(pool.ok()) << pool.status();
  SequenceKv exited(pool->get()), full(pool->get());
  ASSERT_TRUE(exited.Reserve(20).ok() && full.Reserve(20).ok());
  PagedKvView exited_view(&exited), full_view(&full);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  std::vector<float> logits(c.vocab_size);
  ForwardOptions options;
  options.river = river.get();
  options.policy.min_backbone_layers = 3;
  for (auto [view, tau] : {std::pair<KvView*, float>{&exited_view, -1.0f}, {&full_view, 2.0f}}) {
    BatchEntry entry;
    entry.tokens = prompt;
    entry.kv = view;
    entry.exit_threshold = tau;
    EntryOutcome outcome;
    ASSERT_TRUE(ForwardBatch(model, absl::MakeConstSpan(&entry, 1), options,
                             absl::MakeSpan(logits), absl::MakeSpan(&outcome, 1))
                    .ok());
  }
  const std::vector<int32_t> pages_before = exited.pages();
  for (int pos = 0; pos < static_cast<int>(prompt.size()); ++pos) {
    EXPECT_EQ(exited.provenance(pos), 2);  // layers 0..2 on the backbone
    EXPECT_EQ(full.provenance(pos), kProvenanceFullDepth);
    for (int layer = 0; layer < c.n_layers; ++layer) {
      const float* a = exited.k_slot(layer, pos, 0);
      const float* b = full.k_slot(layer, pos, 0);
      double diff = 0.0, norm = 0.0;
      for (int i = 0; i < c.head_dim; ++i) {
        diff += std::fabs(a[i] - b[i]);
        norm += std::fabs(a[i]);
      }
      EXPECT_GT(norm, 0.0) << "layer " << layer << " pos " << pos << " was never written";
      if (layer < 3) {
        EXPECT_EQ(diff, 0.0) << "backbone layer " << layer << " pos " << pos;
      } else if (pos > 0) {
        EXPECT_GT(diff, 0.0) << "river layer " << layer << " pos " << pos;
      }
    }
  }
  EXPECT_EQ(exited.pages(), pages_before);
}

// batch_min: one sequence with exit disabled keeps the whole batch on the backbone; split lets
// the other one leave alone.
TEST_F(RiverTest, BatchMinCouplesTheBatchAndSplitDoesNot) {
  ASSERT_NO_FATAL_FAILURE(Load());
  const LlamaModel& model = *loaded->model;
  const LlamaConfig& c = model.config();
  for (ExitRule rule : {ExitRule::kBatchMin, ExitRule::kSplit}) {
    auto a = ContiguousKvCache::Create(c, 8);
    auto b = ContiguousKvCache::Create(c, 8);
    ASSERT_TRUE(a.ok() && b.ok());
    const std::vector<int32_t> tokens_a = {1, 403}, tokens_b = {1, 407};
    BatchEntry entries[2];
    entries[0].tokens = tokens_a;
    entries[0].kv = &*a;
    entries[0].exit_threshold = -1.0f;  // would exit at once
    entries[1].tokens = tokens_b;
    entries[1].kv = &*b;
    entries[1].exit_threshold = 2.0f;  // never exits
    ForwardOptions options;
    options.river = river.get();
    options.policy.rule = rule;
    std::vector<float> logits(2 * static_cast<size_t>(c.vocab_size));
    EntryOutcome outcomes[2];
    ASSERT_TRUE(ForwardBatch(model, entries, options, absl::MakeSpan(logits),
                             absl::MakeSpan(outcomes))
                    .ok());
    EXPECT_EQ(outcomes[1].backbone_layers, c.n_layers) << ExitRuleName(rule);
    EXPECT_EQ(outcomes[0].backbone_layers, rule == ExitRule::kSplit ? 1 : c.n_layers)
        << ExitRuleName(rule);
  }
}

// With an int4 LM head in the river, a batch of an exited sequence and a full-depth one gives
// each the logits it gets alone: the exited one through the river's head, the other through the
// backbone's (bit for bit the same as with a river that shares it). The weight bytes of a step
// count the head the tokens read.
TEST_F(RiverTest, ExitedTokensReadTheRiversLmHeadAndFullDepthOnesTheBackbones) {
  ASSERT_NO_FATAL_FAILURE(Load());
  const LlamaModel& model = *loaded->model;
  const LlamaConfig& c = model.config();
  auto with_head = River::Build(model.weights(), Int4QuantOptions(), 0, 1, RiverLmHead::kInt4);
  ASSERT_TRUE(with_head.ok()) << with_head.status();
  const River& head_river = **with_head;
  ASSERT_NE(head_river.lm_head(), nullptr);
  EXPECT_EQ(river->lm_head(), nullptr);
  EXPECT_EQ(head_river.bytes(), river->bytes() + head_river.lm_head()->bytes());
  EXPECT_EQ(DecodeStepWeightBytes(model, &head_river, 2),
            DecodeStepWeightBytes(model, river.get(), 2) -
                static_cast<int64_t>(model.weights().lm_head.nbytes()) +
                head_river.lm_head()->bytes());
  EXPECT_EQ(DecodeStepWeightBytes(model, &head_river, c.n_layers),
            DecodeStepWeightBytes(model, river.get(), c.n_layers));

  const std::vector<int32_t> tokens_a = {1, 403, 261}, tokens_b = {1, 407};
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  // Runs the entries of `which` (0: a, exits after 2 layers; 1: b, full depth) in one batch.
  const auto run = [&](const River& r, std::vector<int> which, std::vector<float>& logits,
                       std::vector<EntryOutcome>& outcomes) {
    std::vector<std::optional<ContiguousKvCache>> caches;
    std::vector<BatchEntry> entries;
    for (size_t i = 0; i < which.size(); ++i) {
      auto cache = ContiguousKvCache::Create(c, 8);
      ASSERT_TRUE(cache.ok());
      caches.emplace_back(std::move(*cache));
    }
    for (size_t i = 0; i < which.size(); ++i) {
      BatchEntry entry;
      entry.tokens = which[i] == 0 ? absl::MakeConstSpan(tokens_a) : absl::MakeConstSpan(tokens_b);
      entry.kv = &*caches[i];
      entry.exit_threshold = which[i] == 0 ? -1.0f : 2.0f;
      entries.push_back(entry);
    }
    ForwardOptions options;
    options.river = &r;
    options.policy.rule = ExitRule::kSplit;
    options.policy.min_backbone_layers = 2;
    options.matmul.path = kernels::cpu::MatMulPath::kBatchInvariant;
    logits.assign(which.size() * vocab, 0.0f);
    outcomes.assign(which.size(), EntryOutcome());
    ASSERT_TRUE(ForwardBatch(model, entries, options, absl::MakeSpan(logits),
                             absl::MakeSpan(outcomes))
                    .ok());
  };
  std::vector<float> both, a_alone, b_alone, a_shared, b_shared;
  std::vector<EntryOutcome> outcomes, ignored;
  ASSERT_NO_FATAL_FAILURE(run(head_river, {0, 1}, both, outcomes));
  EXPECT_EQ(outcomes[0].backbone_layers, 2);
  EXPECT_EQ(outcomes[1].backbone_layers, c.n_layers);
  ASSERT_NO_FATAL_FAILURE(run(head_river, {0}, a_alone, ignored));
  ASSERT_NO_FATAL_FAILURE(run(head_river, {1}, b_alone, ignored));
  ASSERT_NO_FATAL_FAILURE(run(*river, {0}, a_shared, ignored));
  ASSERT_NO_FATAL_FAILURE(run(*river, {1}, b_shared, ignored));
  EXPECT_TRUE(std::equal(a_alone.begin(), a_alone.end(), both.begin()));
  EXPECT_TRUE(std::equal(b_alone.begin(), b_alone.end(), both.begin() + vocab));
  EXPECT_EQ(b_alone, b_shared);
  // The exited token's logits moved by the head's quantization, not beyond it.
  float max_abs = 0.0f, max_diff = 0.0f;
  for (size_t i = 0; i < vocab; ++i) {
    max_abs = std::max(max_abs, std::fabs(a_shared[i]));
    max_diff = std::max(max_diff, std::fabs(a_alone[i] - a_shared[i]));
  }
  EXPECT_GT(max_diff, 0.0f);
  EXPECT_LT(max_diff, 0.1f * max_abs);
}

// Each backbone layer's per-entry similarity.
class SimilarityTrace : public ForwardProbe {
 public:
  void OnBackboneLayer(int layer, absl::Span<const float> similarity) override {
    layers.emplace_back(similarity.begin(), similarity.end());
  }
  std::vector<std::vector<float>> layers;  // [layer][entry]
};

// The layer each rule exits at, from a full-depth trace of the same batch: the decision before
// layer l reads layer l - 1's similarity (forward_batch.cc). n_layers when nobody leaves.
int PredictedExit(ExitRule rule, const std::vector<std::vector<float>>& trace,
                  const std::vector<float>& taus, int n_layers) {
  std::vector<bool> passed(taus.size(), false);
  for (int l = 1; l < n_layers; ++l) {
    bool all_now = true, all_ever = true;
    for (size_t e = 0; e < taus.size(); ++e) {
      const bool pass = trace[static_cast<size_t>(l - 1)][e] - taus[e] > 0.0f;
      passed[e] = passed[e] || pass;
      all_now = all_now && pass;
      all_ever = all_ever && passed[e];
    }
    if (rule == ExitRule::kBatchMin ? all_now : all_ever) return l;
  }
  return n_layers;
}

// all_passed remembers each sequence's pass and lets the batch go once the last one has passed;
// batch_min needs every pass at the same layer. Both exit exactly where a full-depth trace of
// the same batch says, and here all_passed leaves earlier.
TEST_F(RiverTest, AllPassedLeavesOnceEverySequenceHasPassedAtSomeLayer) {
  ASSERT_NO_FATAL_FAILURE(Load());
  const LlamaModel& model = *loaded->model;
  const LlamaConfig& c = model.config();
  const std::vector<std::vector<int32_t>> prompts = {{1, 403}, {1, 407}, {1, 261}};
  // Runs the batch under `rule` with thresholds `taus`; returns each entry's backbone layers.
  auto run = [&](ExitRule rule, const std::vector<float>& taus, ForwardProbe* probe) {
    std::vector<ContiguousKvCache> caches;
    for (size_t e = 0; e < prompts.size(); ++e) caches.push_back(*ContiguousKvCache::Create(c, 8));
    std::vector<BatchEntry> entries(prompts.size());
    for (size_t e = 0; e < prompts.size(); ++e) {
      entries[e].tokens = prompts[e];
      entries[e].kv = &caches[e];
      entries[e].exit_threshold = taus[e];
    }
    ForwardOptions options;
    options.river = river.get();
    options.policy.rule = rule;
    options.probe = probe;
    std::vector<float> logits(prompts.size() * static_cast<size_t>(c.vocab_size));
    std::vector<EntryOutcome> outcomes(prompts.size());
    EXPECT_TRUE(ForwardBatch(model, entries, options, absl::MakeSpan(logits),
                             absl::MakeSpan(outcomes))
                    .ok());
    std::vector<int> layers;
    for (const EntryOutcome& o : outcomes) layers.push_back(o.backbone_layers);
    return layers;
  };
  SimilarityTrace trace;
  run(ExitRule::kBatchMin, {2.0f, 2.0f, 2.0f}, &trace);
  ASSERT_EQ(trace.layers.size(), static_cast<size_t>(c.n_layers));
  // Sequences 0 and 1 pass only at their own most similar layer (different layers here: the
  // similarity is not monotone in depth), sequence 2 at every layer from the first on.
  std::vector<float> taus(prompts.size());
  for (size_t e = 0; e < prompts.size(); ++e) {
    float most = -1.0f, least = 2.0f;
    for (size_t l = 0; l + 1 < trace.layers.size(); ++l) {
      most = std::max(most, trace.layers[l][e]);
      if (l >= 1) least = std::min(least, trace.layers[l][e]);
    }
    taus[e] = std::nextafter(e < 2 ? most : least, 0.0f);
  }
  const int batch_min = PredictedExit(ExitRule::kBatchMin, trace.layers, taus, c.n_layers);
  const int all_passed = PredictedExit(ExitRule::kAllPassed, trace.layers, taus, c.n_layers);
  std::printf("predicted exit: batch_min after %d layers, all_passed after %d\n", batch_min,
              all_passed);
  EXPECT_LT(all_passed, batch_min);
  for (auto [rule, expected] : {std::pair{ExitRule::kBatchMin, batch_min},
                                std::pair{ExitRule::kAllPassed, all_passed}}) {
    for (int layers : run(rule, taus, nullptr)) EXPECT_EQ(layers, expected) << ExitRuleName(rule);
  }
}

// Backbone offloading: with layers >= K released, decoding forces the exit at K and equals a
// run that forces it with --max-backbone-layers; without a river it is refused.
TEST_F(RiverTest, ResidentBackboneLayersForceTheExit) {
  auto released = LoadModel("models/stories12L");
  auto intact = LoadModel("models/stories12L");
  ASSERT_TRUE(released.ok() && intact.ok());
  const LlamaConfig& c = intact->model->config();
  auto river = River::Build(intact->model->weights(), Int4QuantOptions());
  ASSERT_TRUE(river.ok());
  auto saved = released->model->ReleaseBackboneLayersFrom(4);
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(*saved, 8 * intact->model->layer_bytes(0));
  EXPECT_EQ(released->model->resident_layers(), 4);

  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  std::vector<float> with_offload(c.vocab_size), with_max(c.vocab_size);
  for (bool offload : {true, false}) {
    auto cache = ContiguousKvCache::Create(c, 8);
    ASSERT_TRUE(cache.ok());
    BatchEntry entry;
    entry.tokens = prompt;
    entry.kv = &*cache;
    ForwardOptions options;
    options.river = river->get();
    if (!offload) options.policy.max_backbone_layers = 4;
    EntryOutcome outcome;
    const LlamaModel& model = offload ? *released->model : *intact->model;
    ASSERT_TRUE(ForwardBatch(model, absl::MakeConstSpan(&entry, 1), options,
                             absl::MakeSpan(offload ? with_offload : with_max),
                             absl::MakeSpan(&outcome, 1))
                    .ok());
    EXPECT_EQ(outcome.backbone_layers, 4);
  }
  EXPECT_EQ(with_offload, with_max);
  auto cache = ContiguousKvCache::Create(c, 8);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(released->model->Forward(prompt, 0, *cache, absl::MakeSpan(with_offload)).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace estuary
