// The lossless exit river (self_speculative.h): greedy output identical to full depth on every
// golden case and every prompt of prompts.txt, at TP 1 and 2, whether the drafts are easy or
// hard; sampling that keeps the full model's distribution (chi-square, with the negative control
// of a wrong acceptance rule); and clear errors for what it refuses.
#include "core/model/self_speculative.h"

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/model/kv_cache.h"
#include "core/model/model_loader.h"
#include "gtest/gtest.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::GoldenCase;
using ::estuary::testing::GoldenModelDir;

struct Loaded {
  std::unique_ptr<ShardedModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

// `name` on `tp` ranks (reduction blocks 2, so TP 1 and 2 agree bit for bit) with its river.
Loaded LoadWithRiver(const std::string& name, int tp,
                     RiverLmHead lm_head = RiverLmHead::kShared) {
  auto loaded = LoadModel(GoldenModelDir(name));
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return {};
  ShardedModelOptions options;
  options.tp_size = tp;
  options.reduction_blocks = 2;
  auto sharded = ShardedModel::Create(std::move(loaded->model), options);
  EXPECT_TRUE(sharded.ok()) << sharded.status();
  if (!sharded.ok()) return {};
  EXPECT_TRUE((*sharded)->BuildRiver(Int4QuantOptions(), /*first_layer=*/0, lm_head).ok());
  return {std::move(*sharded), std::move(loaded->tokenizer)};
}

GenerateRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens) {
  GenerateRequest request;
  request.prompt_ids = prompt;
  request.max_tokens = max_tokens;
  request.sampling.temperature = 0.0f;
  return request;
}

// Drafts that mostly agree (τ 0.8, the README's setting) and drafts that mostly do not (every
// token forced onto the river after one layer): both must give the full model's output.
LosslessOptions EasyDrafts() {
  LosslessOptions options;
  options.policy.default_threshold = 0.8f;
  options.draft_backbone_layers = -1;  // τ decides
  return options;
}
LosslessOptions HardDrafts() {
  LosslessOptions options;
  options.policy.max_backbone_layers = 1;
  options.draft_backbone_layers = -1;  // the policy's forced exit
  options.min_draft_confidence = 0.0f;
  options.max_draft_tokens = 6;
  return options;
}

GenerateResult RunLossless(ShardedModel& model, const GenerateRequest& request,
                           const LosslessOptions& options) {
  auto result = GenerateLossless(model, request, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : GenerateResult();
}

// With either LM head on the drafts (the river's int4 head changes what is drafted, never what
// is kept).
TEST(SelfSpeculativeTest, GreedyGivesTheGoldenIdsOfEveryCaseAtTp1AndTp2) {
  for (const std::string& name : ::estuary::testing::GoldenModels()) {
    const std::vector<GoldenCase> cases = ::estuary::testing::LoadGoldenCases(name);
    ASSERT_FALSE(cases.empty()) << name;
    for (const auto& [tp, head] : {std::pair{1, RiverLmHead::kShared},
                                   std::pair{2, RiverLmHead::kShared},
                                   std::pair{1, RiverLmHead::kInt4},
                                   std::pair{2, RiverLmHead::kInt4}}) {
      Loaded loaded = LoadWithRiver(name, tp, head);
      ASSERT_NE(loaded.model, nullptr);
      int64_t hard_drafts = 0, hard_accepted = 0;
      for (const GoldenCase& golden : cases) {
        const GenerateRequest request =
            Greedy(golden.prompt_ids, static_cast<int>(golden.completion_ids.size()));
        const GenerateResult easy = RunLossless(*loaded.model, request, EasyDrafts());
        EXPECT_EQ(easy.completion_ids, golden.completion_ids) << name << " TP " << tp;
        EXPECT_LE(easy.accepted_tokens, easy.draft_tokens);
        EXPECT_GE(easy.verifications, 1);
        const GenerateResult hard = RunLossless(*loaded.model, request, HardDrafts());
        EXPECT_EQ(hard.completion_ids, golden.completion_ids) << name << " TP " << tp << " hard";
        hard_drafts += hard.draft_tokens;
        hard_accepted += hard.accepted_tokens;
      }
      // The hard drafts do get rejected, so the rejection path ran.
      EXPECT_LT(hard_accepted, hard_drafts) << name << " TP " << tp;
    }
  }
}

TEST(SelfSpeculativeTest, GreedyEqualsFullDepthOnEveryPromptWith64Tokens) {
  const std::vector<std::string> prompts = ::estuary::testing::LoadEvalPrompts("stories12L");
  ASSERT_GE(prompts.size(), 20u);
  for (int tp : {1, 2}) {
    Loaded loaded = LoadWithRiver("stories12L", tp);
    ASSERT_NE(loaded.model, nullptr);
    int64_t drafts = 0, accepted = 0;
    std::vector<GenerateRequest> requests;
    std::vector<std::vector<int32_t>> expected;
    for (const std::string& prompt : prompts) {
      auto ids = loaded.tokenizer->Encode(prompt, /*add_bos=*/true);
      ASSERT_TRUE(ids.ok()) << ids.status();
      GenerateRequest request = Greedy(*ids, 64);
      request.ignore_eos = true;  // 64 tokens every time
      requests.push_back(request);
      // Full depth with the fastest kernels (the plain decode path) and with the batch-invariant
      // ones (what lossless runs, so equal by construction, bit for bit).
      auto fastest = Generate(*loaded.model, request);
      ShardedForwardOptions invariant;
      invariant.chunk_invariant = true;
      auto exact = Generate(*loaded.model, request, nullptr, invariant);
      ASSERT_TRUE(fastest.ok() && exact.ok());
      const GenerateResult lossless = RunLossless(*loaded.model, request, EasyDrafts());
      ASSERT_EQ(lossless.completion_ids.size(), 64u);
      EXPECT_EQ(lossless.completion_ids, exact->completion_ids) << prompt << " TP " << tp;
      EXPECT_EQ(lossless.completion_ids, fastest->completion_ids) << prompt << " TP " << tp;
      EXPECT_EQ(RunLossless(*loaded.model, request, HardDrafts()).completion_ids,
                exact->completion_ids)
          << prompt << " TP " << tp << " hard";
      drafts += lossless.draft_tokens;
      accepted += lossless.accepted_tokens;
      expected.push_back(exact->completion_ids);
    }
    // Batched: every prompt in one batch, each sequence with its own draft lengths and exits.
    auto batched = GenerateLosslessBatch(*loaded.model, requests, EasyDrafts());
    ASSERT_TRUE(batched.ok()) << batched.status();
    ASSERT_EQ(batched->size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ((*batched)[i].completion_ids, expected[i]) << prompts[i] << " TP " << tp
                                                           << " batched";
    }
    // stories12L's river agrees with the backbone on most tokens at τ 0.8.
    EXPECT_GT(static_cast<double>(accepted) / static_cast<double>(drafts), 0.8) << "TP " << tp;
  }
}

TEST(SelfSpeculativeTest, DraftsThatNeverExitAreAllAccepted) {
  Loaded loaded = LoadWithRiver("stories260K", 1);
  ASSERT_NE(loaded.model, nullptr);
  LosslessOptions options;
  options.policy.default_threshold = 2.0f;  // never exits: every draft is the full model's
  options.draft_backbone_layers = -1;
  options.min_draft_confidence = 0.0f;
  const GoldenCase golden = ::estuary::testing::LoadGoldenCases("stories260K").at(0);
  const GenerateResult result =
      RunLossless(*loaded.model, Greedy(golden.prompt_ids, 50), options);
  EXPECT_EQ(result.completion_ids,
            std::vector<int32_t>(golden.completion_ids.begin(), golden.completion_ids.begin() + 50));
  EXPECT_GT(result.draft_tokens, 0);
  EXPECT_EQ(result.accepted_tokens, result.draft_tokens);
}

// The drafts' depth: by default (draft_backbone_layers 0) every draft runs wholly on the river,
// whatever τ; a cap of 3 holds drafts that τ never lets go (τ 2) to 3 layers, and τ takes them
// off below it (τ 0: after min_backbone_layers); -1 leaves it to τ alone. Golden ids each time.
TEST(SelfSpeculativeTest, DraftsRunAtMostTheirBackboneLayers) {
  Loaded loaded = LoadWithRiver("stories12L", 1);
  ASSERT_NE(loaded.model, nullptr);
  const int n_layers = loaded.model->config().n_layers;
  const GoldenCase golden = ::estuary::testing::LoadGoldenCases("stories12L").at(0);
  const GenerateRequest request =
      Greedy(golden.prompt_ids, static_cast<int>(golden.completion_ids.size()));
  for (const auto& [cap, tau, layers_per_draft] :
       {std::tuple{0, 0.0f, 0}, std::tuple{0, 2.0f, 0}, std::tuple{3, 2.0f, 3},
        std::tuple{3, 0.0f, 1}, std::tuple{-1, 2.0f, n_layers}}) {
    LosslessOptions options;
    options.policy.default_threshold = tau;
    options.draft_backbone_layers = cap;
    const GenerateResult result = RunLossless(*loaded.model, request, options);
    EXPECT_EQ(result.completion_ids, golden.completion_ids) << cap << " " << tau;
    EXPECT_GT(result.draft_tokens, 0);
    EXPECT_EQ(result.draft_backbone_layers, layers_per_draft * result.draft_tokens)
        << cap << " " << tau;
  }
}

// Plain rounds (no drafts: each the pending token through every layer) and the automatic
// choice between them and drafting rounds give the golden ids too; plain rounds draft nothing
// and emit one token each (the first token comes from the prefill), and the automatic choice
// drafts first (it measures both kinds before choosing).
TEST(SelfSpeculativeTest, PlainAndAutomaticRoundsGiveTheGoldenIds) {
  for (const std::string& name : ::estuary::testing::GoldenModels()) {
    Loaded loaded = LoadWithRiver(name, 1);
    ASSERT_NE(loaded.model, nullptr);
    for (const GoldenCase& golden : ::estuary::testing::LoadGoldenCases(name)) {
      const int n = static_cast<int>(golden.completion_ids.size());
      const GenerateRequest request = Greedy(golden.prompt_ids, n);
      LosslessOptions plain;
      plain.drafting = LosslessOptions::Drafting::kNever;
      const GenerateResult p = RunLossless(*loaded.model, request, plain);
      EXPECT_EQ(p.completion_ids, golden.completion_ids) << name << " plain";
      EXPECT_EQ(p.draft_tokens, 0);
      EXPECT_EQ(p.plain_rounds, n - 1) << name;
      LosslessOptions automatic;
      automatic.drafting = LosslessOptions::Drafting::kAuto;
      const GenerateResult a = RunLossless(*loaded.model, request, automatic);
      EXPECT_EQ(a.completion_ids, golden.completion_ids) << name << " auto";
      if (n > 1) EXPECT_GT(a.draft_tokens, 0) << name;
    }
  }
}

TEST(SelfSpeculativeTest, EndsLikeFullDepthAtMaxTokensEosAndTheContext) {
  Loaded loaded = LoadWithRiver("stories260K", 1);
  ASSERT_NE(loaded.model, nullptr);
  const GoldenCase golden = ::estuary::testing::LoadGoldenCases("stories260K").at(0);
  const int context = loaded.model->config().max_seq_len;
  std::vector<GenerateRequest> requests;
  for (int max_tokens : {0, 1, 2, 7}) requests.push_back(Greedy(golden.prompt_ids, max_tokens));
  // EOS when the model stops on its own; the context when it is ignored.
  requests.push_back(Greedy(golden.prompt_ids, context));
  requests.push_back(Greedy(golden.prompt_ids, context));
  requests.back().ignore_eos = true;
  for (const GenerateRequest& request : requests) {
    auto full = Generate(*loaded.model, request);
    ASSERT_TRUE(full.ok()) << full.status();
    const GenerateResult lossless = RunLossless(*loaded.model, request, HardDrafts());
    EXPECT_EQ(lossless.completion_ids, full->completion_ids) << request.max_tokens;
    EXPECT_EQ(lossless.finish_reason, full->finish_reason) << request.max_tokens;
  }
}

// Chi-square statistic of `observed` against `expected` counts, bins below 5 expected pooled;
// `df` receives the degrees of freedom.
double ChiSquare(const std::vector<double>& expected, const std::vector<int>& observed, int* df) {
  double stat = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int bins = 0;
  for (size_t v = 0; v < expected.size(); ++v) {
    if (expected[v] >= 5.0) {
      stat += std::pow(observed[v] - expected[v], 2) / expected[v];
      ++bins;
    } else {
      pooled_e += expected[v];
      pooled_o += observed[v];
    }
  }
  if (pooled_e > 0.0) {
    stat += std::pow(pooled_o - pooled_e, 2) / pooled_e;
    ++bins;
  }
  *df = bins - 1;
  return stat;
}

// Upper critical value of chi-square with `df` degrees of freedom at significance 0.001
// (Wilson-Hilferty: z = 3.09).
double ChiSquareCritical(int df) {
  const double k = df, z = 3.090232;
  return k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3);
}

// The full model's distribution of output token 1 (after the prompt and a sampled token 0),
// summed over token 0: what every correct sampler's token 1 follows.
std::vector<double> FullModelSecondTokenDistribution(ShardedModel& model,
                                                     const GenerateRequest& request) {
  const LlamaConfig& c = model.config();
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  Sampler sampler(request.sampling, c.eos_ids);
  auto run = [&](const std::vector<int32_t>& tokens, int generated) {
    auto cache = ContiguousKvCache::Create(c, static_cast<int>(tokens.size()));
    EXPECT_TRUE(cache.ok());
    BatchEntry entry;
    entry.tokens = tokens;
    EntryOutcome outcome;
    std::vector<float> logits(vocab);
    ShardedForwardOptions forward;
    forward.chunk_invariant = true;
    EXPECT_TRUE(model
                    .Forward(absl::MakeConstSpan(&entry, 1),
                             [&](int, size_t) -> KvView* { return &*cache; }, forward,
                             absl::MakeSpan(logits), absl::MakeSpan(&outcome, 1))
                    .ok());
    return sampler.Distribution(absl::MakeSpan(logits), tokens, generated);
  };
  const std::vector<double> first = run(request.prompt_ids, 0);
  std::vector<double> second(vocab, 0.0);
  for (size_t t0 = 0; t0 < vocab; ++t0) {
    if (first[t0] < 1e-7) continue;
    std::vector<int32_t> tokens = request.prompt_ids;
    tokens.push_back(static_cast<int32_t>(t0));
    const std::vector<double> p = run(tokens, 1);
    for (size_t v = 0; v < vocab; ++v) second[v] += first[t0] * p[v];
  }
  return second;
}

TEST(SelfSpeculativeTest, SamplingKeepsTheFullModelsDistributionAndAWrongRuleDoesNot) {
  Loaded loaded = LoadWithRiver("stories260K", 1);
  ASSERT_NE(loaded.model, nullptr);
  const GoldenCase golden = ::estuary::testing::LoadGoldenCases("stories260K").at(0);
  GenerateRequest request;
  request.prompt_ids = golden.prompt_ids;
  request.max_tokens = 2;
  request.ignore_eos = true;
  request.sampling.temperature = 1.0f;
  const std::vector<double> p = FullModelSecondTokenDistribution(*loaded.model, request);

  // Hard drafts (exit after one layer), so that q is far from p and half the drafts are
  // rejected: the residual draw matters.
  constexpr int kSamples = 15000;
  auto second_tokens = [&](LosslessOptions::Acceptance acceptance) {
    LosslessOptions options = HardDrafts();
    options.acceptance = acceptance;
    std::vector<int> counts(p.size(), 0);
    for (int seed = 0; seed < kSamples; ++seed) {
      request.sampling.seed = static_cast<uint64_t>(seed);
      const GenerateResult result = RunLossless(*loaded.model, request, options);
      if (result.completion_ids.size() == 2) ++counts[static_cast<size_t>(result.completion_ids[1])];
    }
    return counts;
  };
  std::vector<double> expected(p.size());
  for (size_t v = 0; v < p.size(); ++v) expected[v] = p[v] * kSamples;

  int df = 0;
  const double right = ChiSquare(expected, second_tokens(LosslessOptions::Acceptance::kSpeculative), &df);
  const double critical = ChiSquareCritical(df);
  EXPECT_LT(right, critical) << "speculative sampling, df " << df;
  const double wrong =
      ChiSquare(expected, second_tokens(LosslessOptions::Acceptance::kAcceptEveryDraft), &df);
  EXPECT_GT(wrong, ChiSquareCritical(df)) << "accepting every draft, df " << df;
  std::cout << "chi-square at alpha 0.001 over " << kSamples << " seeds: speculative " << right
            << ", accept-every-draft " << wrong << ", critical " << critical << " (df " << df
            << ")\n";
}

TEST(SelfSpeculativeTest, SeededSamplingIsReproducible) {
  Loaded loaded = LoadWithRiver("stories260K", 1);
  ASSERT_NE(loaded.model, nullptr);
  GenerateRequest request;
  request.prompt_ids = ::estuary::testing::LoadGoldenCases("stories260K").at(0).prompt_ids;
  request.max_tokens = 40;
  request.sampling.temperature = 0.8f;
  request.sampling.top_p = 0.9f;
  request.sampling.seed = 7;
  const GenerateResult a = RunLossless(*loaded.model, request, HardDrafts());
  const GenerateResult b = RunLossless(*loaded.model, request, HardDrafts());
  EXPECT_EQ(a.completion_ids, b.completion_ids);
  EXPECT_FALSE(a.completion_ids.empty());
}

// A sequence decodes the same in a batch as alone: mixed lengths, greedy and seeded sampling,
// one that ends at once (max_tokens 0) and one that ends on the context.
TEST(SelfSpeculativeTest, ASequenceDecodesTheSameInABatchAsAlone) {
  Loaded loaded = LoadWithRiver("stories12L", 1);
  ASSERT_NE(loaded.model, nullptr);
  auto ids = loaded.tokenizer->Encode("Once upon a time", /*add_bos=*/true);
  ASSERT_TRUE(ids.ok());
  std::vector<GenerateRequest> requests;
  for (int max_tokens : {0, 5, 40, 17}) requests.push_back(Greedy(*ids, max_tokens));
  for (uint64_t seed : {3u, 11u}) {
    GenerateRequest sampled = Greedy(*ids, 30);
    sampled.sampling.temperature = 0.9f;
    sampled.sampling.top_p = 0.95f;
    sampled.sampling.seed = seed;
    requests.push_back(sampled);
  }
  std::vector<int32_t> long_prompt(static_cast<size_t>(loaded.model->config().max_seq_len - 6),
                                   ids->back());
  long_prompt[0] = (*ids)[0];
  GenerateRequest at_context = Greedy(long_prompt, 100);
  at_context.ignore_eos = true;
  requests.push_back(at_context);
  // Each draft exits on its own (kSplit): under batch_min the batch shares exits, so the drafts,
  // and which seeded draws accept them, would depend on the batch (not the distribution).
  LosslessOptions options = EasyDrafts();
  options.policy.rule = ExitRule::kSplit;
  auto batched = GenerateLosslessBatch(*loaded.model, requests, options);
  ASSERT_TRUE(batched.ok()) << batched.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateResult alone = RunLossless(*loaded.model, requests[i], options);
    EXPECT_EQ((*batched)[i].completion_ids, alone.completion_ids) << "request " << i;
    EXPECT_EQ((*batched)[i].finish_reason, alone.finish_reason) << "request " << i;
    EXPECT_EQ((*batched)[i].accepted_tokens, alone.accepted_tokens) << "request " << i;
  }
  EXPECT_TRUE((*batched)[0].completion_ids.empty());
  EXPECT_EQ((*batched)[6].finish_reason, FinishReason::kContext);
  EXPECT_EQ((*batched)[6].completion_ids.size(), 6u);
  // The error names the request.
  requests[2].max_tokens = -1;
  auto bad = GenerateLosslessBatch(*loaded.model, requests, EasyDrafts());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("request 2"), std::string::npos) << bad.status();
  EXPECT_FALSE(GenerateLosslessBatch(*loaded.model, {}, EasyDrafts()).ok());
}

TEST(SelfSpeculativeTest, RefusesWhatItCannotDoWithClearErrors) {
  auto loaded = LoadModel(GoldenModelDir("stories260K"));
  ASSERT_TRUE(loaded.ok());
  auto sharded = ShardedModel::Create(std::move(loaded->model), ShardedModelOptions());
  ASSERT_TRUE(sharded.ok());
  ShardedModel& model = **sharded;
  const GenerateRequest request = Greedy({1, 403}, 4);
  const auto no_river = GenerateLossless(model, request, LosslessOptions());
  EXPECT_EQ(no_river.status().code(), absl::StatusCode::kFailedPrecondition) << no_river.status();
  ASSERT_TRUE(model.BuildRiver(Int4QuantOptions()).ok());
  LosslessOptions zero;
  zero.max_draft_tokens = 0;
  const auto k0 = GenerateLossless(model, request, zero);
  EXPECT_EQ(k0.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(k0.status().message().find("--draft-tokens"), absl::string_view::npos) << k0.status();
  LosslessOptions partial;
  partial.policy.resident_backbone_layers = 2;
  EXPECT_EQ(GenerateLossless(model, request, partial).status().code(),
            absl::StatusCode::kInvalidArgument);
  LosslessOptions confidence;
  confidence.min_draft_confidence = 1.5f;
  EXPECT_EQ(GenerateLossless(model, request, confidence).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GenerateLossless(model, Greedy({1, 100000}, 4), LosslessOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace estuary
