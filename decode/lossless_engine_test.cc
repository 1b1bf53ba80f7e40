// The lossless exit mode in the decode engine (DecodeRequest::lossless): continuous batching
// of lossless and lossy sequences over the paged pool, with preemption and aborts, gives the
// full model's tokens and returns every page.
#include <map>
#include <string>
#include <vector>

#include "core/model/generator.h"
#include "core/model/model_loader.h"
#include "core/model/river.h"
#include "core/model/sharded_model.h"
#include "decode/decode_engine.h"
#include "decode/engine_test_collector.h"
#include "gtest/gtest.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::GoldenCase;
using ::estuary::testing::GoldenModelDir;
using ::estuary::testing::LoadGoldenCases;

using Collector = TokenCollector;

DecodeRequest Lossless(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  DecodeRequest r;
  r.request_id = id;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.lossless = true;
  return r;
}

// A model and its exit river (null river when either failed to load).
struct WithRiver {
  LoadedModel loaded;
  std::unique_ptr<River> river;
};
WithRiver LoadWithRiver(const std::string& name) {
  WithRiver out;
  auto loaded = LoadModel("models/" + name);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return out;
  out.loaded = std::move(*loaded);
  auto river = River::Build(out.loaded.model->weights(), Int4QuantOptions());
  EXPECT_TRUE(river.ok()) << river.status();
  if (river.ok()) out.river = std::move(*river);
  return out;
}

std::unique_ptr<ShardedModel> LoadSharded(const std::string& name, int tp) {
  auto loaded = LoadModel("models/" + name);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  ShardedModelOptions sharding;
  sharding.tp_size = tp;
  sharding.reduction_blocks = 2;
  auto model = ShardedModel::Create(std::move(loaded->model), sharding);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  EXPECT_TRUE((*model)->BuildRiver(Int4QuantOptions()).ok());
  return std::move(*model);
}

DecodeEngineOptions EasyDrafts() {
  DecodeEngineOptions options;
  options.kv_cache_bytes = int64_t{64} << 20;
  options.exit.default_threshold = 0.8f;
  options.lossless.draft_backbone_layers = -1;  // τ decides: drafts at several depths
  return options;
}

// Every golden case of `name` as a lossless request (ids "0", "1", ...) in one batch on a new
// engine over `model`: checks each case's golden ids and returns the drafts and accepted
// drafts of their final events.
struct DraftCounts {
  int64_t drafts = 0;
  int64_t accepted = 0;
};
DraftCounts RunEveryCase(ShardedModel& model, const DecodeEngineOptions& options,
                         const std::vector<GoldenCase>& cases, const std::string& label) {
  Collector collector;
  auto engine = DecodeEngine::Create(model, options, collector.Sink());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE((*engine)
                    ->Submit(Lossless(std::to_string(i), cases[i].prompt_ids,
                                      static_cast<int>(cases[i].completion_ids.size())))
                    .ok());
  }
  EXPECT_TRUE((*engine)->RunUntilIdle().ok());
  DraftCounts counts;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string id = std::to_string(i);
    EXPECT_EQ(collector.tokens[id], cases[i].completion_ids) << label << " case " << i;
    counts.drafts += collector.final_events[id].draft_tokens;
    counts.accepted += collector.final_events[id].accepted_tokens;
  }
  return counts;
}

// Every golden case of both models, all at once, at TP 1 and 2: the golden ids, with drafts
// kept (so the river did the drafting) and the counts on the final events.
TEST(LosslessEngineTest, GoldenIdsOfEveryCaseInOneBatchAtTp1AndTp2) {
  for (const std::string name : {"stories260K", "stories12L"}) {
    const std::vector<GoldenCase> cases = LoadGoldenCases(name);
    ASSERT_FALSE(cases.empty());
    for (const int tp : {1, 2}) {
      std::unique_ptr<ShardedModel> model = LoadSharded(name, tp);
      ASSERT_NE(model, nullptr);
      const std::string label = name + " TP " + std::to_string(tp);
      const DraftCounts counts = RunEveryCase(*model, EasyDrafts(), cases, label);
      EXPECT_GT(counts.drafts, 0) << label;
      EXPECT_GT(counts.accepted, counts.drafts / 2) << label;
    }
  }
}

// The worker's default drafts run wholly on the river; a request that sets its own τ drafts by
// it, uncapped: at τ 2 its drafts never leave the backbone, so they are the full model's and
// every one is kept, in the same batch as default requests. Golden ids for both.
TEST(LosslessEngineTest, ARequestsOwnThresholdLiftsTheWorkersDraftDepth) {
  const std::vector<GoldenCase> cases = LoadGoldenCases("stories12L");
  std::unique_ptr<ShardedModel> model = LoadSharded("stories12L", 1);
  ASSERT_NE(model, nullptr);
  DecodeEngineOptions options;
  options.kv_cache_bytes = int64_t{64} << 20;
  ASSERT_EQ(options.lossless.draft_backbone_layers, 0);
  Collector collector;
  auto engine = DecodeEngine::Create(*model, options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (size_t i = 0; i < cases.size(); ++i) {
    const int n = static_cast<int>(cases[i].completion_ids.size());
    DecodeRequest by_tau = Lossless("tau" + std::to_string(i), cases[i].prompt_ids, n);
    by_tau.exit_threshold = 2.0f;
    ASSERT_TRUE((*engine)->Submit(std::move(by_tau)).ok());
    ASSERT_TRUE(
        (*engine)->Submit(Lossless("river" + std::to_string(i), cases[i].prompt_ids, n)).ok());
  }
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  int64_t river_drafts = 0, river_accepted = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (const std::string kind : {"tau", "river"}) {
      const std::string id = kind + std::to_string(i);
      EXPECT_EQ(collector.tokens[id], cases[i].completion_ids) << id;
    }
    const auto& tau = collector.final_events["tau" + std::to_string(i)];
    EXPECT_GT(tau.draft_tokens, 0);
    EXPECT_EQ(tau.accepted_tokens, tau.draft_tokens) << "case " << i;
    river_drafts += collector.final_events["river" + std::to_string(i)].draft_tokens;
    river_accepted += collector.final_events["river" + std::to_string(i)].accepted_tokens;
  }
  // The int4 drafts are not the full model's: some are rejected over every case.
  EXPECT_GT(river_drafts, 0);
  EXPECT_LT(river_accepted, river_drafts);
}

// The engine's plain rounds (drafting never) and its automatic choice: the golden ids of every
// case in one batch; plain rounds draft nothing, the automatic choice drafts first.
TEST(LosslessEngineTest, PlainAndAutomaticRoundsGiveTheGoldenIds) {
  const std::vector<GoldenCase> cases = LoadGoldenCases("stories12L");
  std::unique_ptr<ShardedModel> model = LoadSharded("stories12L", 1);
  ASSERT_NE(model, nullptr);
  DecodeEngineOptions options = EasyDrafts();
  options.lossless.drafting = LosslessOptions::Drafting::kNever;
  EXPECT_EQ(RunEveryCase(*model, options, cases, "never").drafts, 0);
  options.lossless.drafting = LosslessOptions::Drafting::kAuto;
  EXPECT_GT(RunEveryCase(*model, options, cases, "auto").drafts, 0);
}

// Every prompt of prompts.txt with 64 new tokens, through continuous batching (8 sequences at a
// time, lossy full-depth requests mixed in): each lossless sequence gives the full model's ids.
TEST(LosslessEngineTest, EveryPromptWith64TokensUnderContinuousBatching) {
  const WithRiver m = LoadWithRiver("stories12L");
  ASSERT_NE(m.river, nullptr);
  const std::vector<std::string> prompts = ::estuary::testing::LoadEvalPrompts("stories12L");
  ASSERT_GE(prompts.size(), 20u);
  DecodeEngineOptions options = EasyDrafts();
  options.max_num_seqs = 8;
  Collector collector;
  auto engine = DecodeEngine::Create(*m.loaded.model, m.river.get(), options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto ids = m.loaded.tokenizer->Encode(prompts[i], /*add_bos=*/true);
    ASSERT_TRUE(ids.ok());
    GenerateRequest full;
    full.prompt_ids = *ids;
    full.max_tokens = 64;
    full.ignore_eos = true;
    full.sampling.temperature = 0.0f;
    auto reference = Generate(*m.loaded.model, full);
    ASSERT_TRUE(reference.ok());
    expected.push_back(reference->completion_ids);
    DecodeRequest request = Lossless("p" + std::to_string(i), *ids, 64);
    request.ignore_eos = true;
    ASSERT_TRUE((*engine)->Submit(request).ok());
    if (i % 3 == 0) {  // a lossy full-depth neighbour in the same batches
      DecodeRequest lossy = request;
      lossy.request_id = "q" + std::to_string(i);
      lossy.lossless = false;
      lossy.exit_disabled = true;
      ASSERT_TRUE((*engine)->Submit(lossy).ok());
    }
  }
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(collector.tokens["p" + std::to_string(i)], expected[i]) << prompts[i];
    if (i % 3 == 0) EXPECT_EQ(collector.tokens["q" + std::to_string(i)], expected[i]);
  }
}

// A pool too small for everyone forces preemption; aborts land between rounds. Survivors give
// the golden ids, and every page comes back.
TEST(LosslessEngineTest, PreemptionAbortsAndPoolAccounting) {
  const WithRiver m = LoadWithRiver("stories260K");
  ASSERT_NE(m.river, nullptr);
  const std::vector<GoldenCase> cases = LoadGoldenCases("stories260K");
  DecodeEngineOptions options = EasyDrafts();
  options.block_size = 16;
  options.kv_cache_bytes = 24 * 20 * 1024;  // 24 pages of 16 slots (see decode_engine_test)
  options.lossless.max_draft_tokens = 6;
  options.lossless.min_draft_confidence = 0.0f;  // long drafts: many rejected positions
  Collector collector;
  auto engine = DecodeEngine::Create(*m.loaded.model, m.river.get(), options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  KvPool& pool = (*engine)->mutable_pool();
  const int32_t free_at_start = pool.free_pages();
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE((*engine)
                    ->Submit(Lossless(std::to_string(i), cases[i].prompt_ids,
                                      static_cast<int>(cases[i].completion_ids.size())))
                    .ok());
  }
  for (int step = 0; step < 6; ++step) ASSERT_TRUE((*engine)->Step().ok());
  EXPECT_TRUE((*engine)->Abort("1"));
  EXPECT_TRUE((*engine)->Abort("4"));
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  EXPECT_GT((*engine)->preemptions(), 0);
  int64_t drafts = 0, accepted = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string id = std::to_string(i);
    ASSERT_TRUE(collector.final_events.count(id)) << id;
    if (id == "1" || id == "4") {
      EXPECT_EQ(collector.final_events[id].finish_reason, FinishReason::kCancelled);
      continue;
    }
    EXPECT_TRUE(collector.final_events[id].status.ok()) << collector.final_events[id].status;
    EXPECT_EQ(collector.tokens[id], cases[i].completion_ids) << "case " << i;
    drafts += collector.final_events[id].draft_tokens;
    accepted += collector.final_events[id].accepted_tokens;
  }
  EXPECT_LT(accepted, drafts) << "some drafts must be rejected for the rollback to be tested";
  pool.ClearPrefixCache();
  EXPECT_EQ(pool.free_pages(), free_at_start);
}

// Rejected drafts roll back at once: after every step the sequence holds exactly the pages of
// its verified positions (small pages and long, often rejected drafts, so that rollbacks cross
// pages), and its output is still the golden one.
TEST(LosslessEngineTest, RejectedPositionsGiveTheirPagesBackAfterEveryRound) {
  const WithRiver m = LoadWithRiver("stories260K");
  ASSERT_NE(m.river, nullptr);
  const GoldenCase c = LoadGoldenCases("stories260K").at(0);
  DecodeEngineOptions options = EasyDrafts();
  options.block_size = 4;
  options.enable_prefix_caching = false;
  options.exit.max_backbone_layers = 1;  // hard drafts: many rejected
  options.lossless.max_draft_tokens = 8;
  options.lossless.min_draft_confidence = 0.0f;
  Collector collector;
  auto engine = DecodeEngine::Create(*m.loaded.model, m.river.get(), options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const KvPool& pool = (*engine)->pool();
  const int32_t total = pool.free_pages();
  const int max_tokens = static_cast<int>(c.completion_ids.size());
  ASSERT_TRUE((*engine)->Submit(Lossless("r", c.prompt_ids, max_tokens)).ok());
  int rounds_checked = 0;
  while (!(*engine)->Idle()) {
    ASSERT_TRUE((*engine)->Step().ok());
    if (collector.final_events.count("r")) break;
    const int generated = static_cast<int>(collector.tokens["r"].size());
    if (generated == 0) continue;
    const int verified = static_cast<int>(c.prompt_ids.size()) + generated - 1;
    EXPECT_EQ(total - pool.free_pages(), (verified + 3) / 4) << "after " << generated << " tokens";
    ++rounds_checked;
  }
  EXPECT_GT(rounds_checked, 5);
  EXPECT_EQ(collector.tokens["r"], c.completion_ids);
  EXPECT_LT(collector.final_events["r"].accepted_tokens, collector.final_events["r"].draft_tokens);
  EXPECT_EQ(pool.free_pages(), total);
}

// Seeded sampling runs and repeats itself; lossless without a river, or with a backbone layer
// dropped, is refused with the reason.
TEST(LosslessEngineTest, SamplingRepeatsAndBadSetupsAreRefused) {
  const WithRiver m = LoadWithRiver("stories260K");
  ASSERT_NE(m.river, nullptr);
  const std::vector<GoldenCase> cases = LoadGoldenCases("stories260K");
  std::vector<std::vector<int32_t>> runs;
  for (int run = 0; run < 2; ++run) {
    Collector collector;
    auto engine = DecodeEngine::Create(*m.loaded.model, m.river.get(), EasyDrafts(),
                                       collector.Sink());
    ASSERT_TRUE(engine.ok());
    DecodeRequest request = Lossless("s", cases[0].prompt_ids, 40);
    request.sampling.temperature = 0.8f;
    request.sampling.seed = 5;
    request.sampling.logprobs = 2;
    ASSERT_TRUE((*engine)->Submit(request).ok());
    ASSERT_TRUE((*engine)->RunUntilIdle().ok());
    EXPECT_TRUE(collector.final_events["s"].status.ok());
    runs.push_back(collector.tokens["s"]);
  }
  EXPECT_FALSE(runs[0].empty());
  EXPECT_EQ(runs[0], runs[1]);

  Collector collector;
  auto plain = DecodeEngine::Create(*m.loaded.model, nullptr, EasyDrafts(), collector.Sink());
  ASSERT_TRUE(plain.ok());
  const absl::Status no_river = (*plain)->Submit(Lossless("x", cases[0].prompt_ids, 4));
  EXPECT_EQ(no_river.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_river.message().find("--river"), std::string::npos) << no_river;

  DecodeEngineOptions dropped = EasyDrafts();
  dropped.exit.resident_backbone_layers = 2;
  auto partial = DecodeEngine::Create(*m.loaded.model, m.river.get(), dropped, collector.Sink());
  ASSERT_TRUE(partial.ok()) << partial.status();
  const absl::Status not_resident = (*partial)->Submit(Lossless("y", cases[0].prompt_ids, 4));
  EXPECT_EQ(not_resident.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_resident.message().find("resident"), std::string::npos) << not_resident;
}

}  // namespace
}  // namespace estuary
