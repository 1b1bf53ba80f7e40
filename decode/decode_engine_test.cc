#include "decode/decode_engine.h"
#include "decode/engine_test_collector.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/model/model_loader.h"
#include "core/model/river.h"
#include "core/model/sharded_model.h"
#include "core/model/paged_kv_view.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/quant/int4_matmul.h"
#include "gtest/gtest.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::GoldenCase;
std::vector<GoldenCase> LoadGolden(const std::string& model) {
  return ::estuary::testing::LoadGoldenCases(model);
}

using Collector = TokenCollector;

DecodeRequest Greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens = 200) {
  DecodeRequest r;
  r.request_id = id;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

class DecodeEngineGoldenTest : public ::testing::TestWithParam<std::string> {};

// Exit disabled: the paged, batched engine reproduces the golden ids one request at a time and
// with every golden prompt of the model in one batch.
TEST_P(DecodeEngineGoldenTest, ReproducesGoldenIdsAtBatchOneAndAllTogether) {
  auto loaded = LoadModel("models/" + GetParam());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<GoldenCase> cases = LoadGolden(GetParam());
  ASSERT_FALSE(cases.empty());
  DecodeEngineOptions options;
  options.kv_cache_bytes = int64_t{64} << 20;
  // With the river built but τ above 1, exit never happens and the output is the plain model's.
  auto river = River::Build(loaded->model->weights(), Int4QuantOptions());
  ASSERT_TRUE(river.ok()) << river.status();
  options.exit.default_threshold = 1.5f;
  for (auto [together, with_river] : {std::pair{false, false}, {true, false}, {true, true}}) {
    Collector collector;
    auto engine = DecodeEngine::Create(*loaded->model, with_river ? river->get() : nullptr,
                                       options, collector.Sink());
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (size_t i = 0; i < cases.size(); ++i) {
      ASSERT_TRUE((*engine)->Submit(Greedy(std::to_string(i), cases[i].prompt_ids)).ok());
      if (!together) {
        ASSERT_TRUE((*engine)->RunUntilIdle().ok());
      }
    }
    ASSERT_TRUE((*engine)->RunUntilIdle().ok());
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(collector.tokens[std::to_string(i)], cases[i].completion_ids)
          << GetParam() << " case " << i << (together ? " (one batch)" : " (alone)")
          << (with_river ? " with the river at tau 1.5" : "");
    }
    if (with_river) {
      EXPECT_EQ((*engine)->exit_stats().exit_rate(), 0.0);
      EXPECT_EQ((*engine)->exit_stats().river_kv_share(), 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, DecodeEngineGoldenTest,
                         ::testing::Values("stories260K", "stories12L"));

// Two tensor-parallel ranks, one pool shard each: the golden ids with every prompt in one batch,
// and with the river on, the same tokens as TP 1 when both use two reduction blocks
// (sharded_model.h).
TEST_P(DecodeEngineGoldenTest, TensorParallelSizeTwo) {
  const std::vector<GoldenCase> cases = LoadGolden(GetParam());
  std::map<int, std::map<std::string, std::vector<int32_t>>> river_tokens;
  for (const int tp : {2, 1}) {
    auto loaded = LoadModel("models/" + GetParam());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ShardedModelOptions sharding;
    sharding.tp_size = tp;
    sharding.reduction_blocks = 2;
    auto model = ShardedModel::Create(std::move(loaded->model), sharding);
    ASSERT_TRUE(model.ok()) << model.status();
    DecodeEngineOptions options;
    options.kv_cache_bytes = int64_t{64} << 20;
    // Prefill chunks of at most 64 tokens (matmul.cc: kGemvBatchMaxTokens) run the batched GEMV,
    // which is invariant; a longer chunk (stories260K's case 5 has an 88-token prompt) would run
    // OpenBLAS's sgemm on the fastest path, whose bits depend on the shard's shape, and the
    // river's int8 activations (VNNI) turn such last-bit differences into other tokens.
    options.max_num_batched_tokens = 64;
    for (const bool with_river : {false, true}) {
      if (with_river) {
        ASSERT_TRUE((*model)->BuildRiver(Int4QuantOptions()).ok());
      }
      if (!with_river && tp == 1) continue;
      options.exit.default_threshold = 0.8f;
      Collector collector;
      auto engine = DecodeEngine::Create(**model, options, collector.Sink());
      ASSERT_TRUE(engine.ok()) << engine.status();
      EXPECT_EQ((*engine)->pool().num_shards(), tp);
      for (size_t i = 0; i < cases.size(); ++i) {
        ASSERT_TRUE((*engine)->Submit(Greedy(std::to_string(i), cases[i].prompt_ids)).ok());
      }
      ASSERT_TRUE((*engine)->RunUntilIdle().ok());
      for (size_t i = 0; i < cases.size(); ++i) {
        const std::vector<int32_t>& got = collector.tokens[std::to_string(i)];
        if (!with_river) {
          EXPECT_EQ(got, cases[i].completion_ids) << GetParam() << " case " << i;
        }
      }
      if (with_river) river_tokens[tp] = collector.tokens;
    }
  }
  // The decode path uses the fastest kernels, whose sgemm is not shape-invariant, but decode
  // steps are one token per sequence (GEMV / batched GEMV, invariant), and the engine's prefill
  // chunks here stay below the sgemm threshold (above), so TP 1 and TP 2 agree exactly, on the
  // VNNI and the Highway int4 paths alike.
  EXPECT_EQ(river_tokens[1], river_tokens[2]) << GetParam() << " on the " << Int4MatMulTargetName()
                                              << " int4 path";
}

// A pool too small for everyone at once forces preemption; aborts end two requests. Every
// surviving request still produces exactly what it produces alone, and every page comes back.
TEST(DecodeEngineTest, PreemptionAbortAndPoolAccounting) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<GoldenCase> cases = LoadGolden("stories260K");
  DecodeEngineOptions options;
  options.block_size = 16;
  // 5 layers x 4 kv heads x 8 dims x 2 (K, V) x 4 bytes x 16 slots = 20 KiB per page: 24 pages
  // hold 384 tokens, far less than six sequences of up to ~290 tokens.
  options.kv_cache_bytes = 24 * 20 * 1024;
  Collector collector;
  auto engine = DecodeEngine::Create(*loaded->model, nullptr, options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  KvPool& pool = (*engine)->mutable_pool();
  const int32_t free_at_start = pool.free_pages();
  ASSERT_EQ(free_at_start, 24);
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE((*engine)->Submit(Greedy(std::to_string(i), cases[i].prompt_ids)).ok());
  }
  for (int step = 0; step < 20; ++step) ASSERT_TRUE((*engine)->Step().ok());
  EXPECT_TRUE((*engine)->Abort("1"));
  EXPECT_TRUE((*engine)->Abort("4"));
  EXPECT_FALSE((*engine)->Abort("no-such-request"));
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());

  EXPECT_GT((*engine)->preemptions(), 0);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string id = std::to_string(i);
    ASSERT_TRUE(collector.final_events.count(id)) << id;
    if (id == "1" || id == "4") {
      EXPECT_EQ(collector.final_events[id].finish_reason, FinishReason::kCancelled);
      EXPECT_EQ(collector.final_events[id].status.code(), absl::StatusCode::kCancelled);
    } else {
      EXPECT_TRUE(collector.final_events[id].status.ok()) << collector.final_events[id].status;
      EXPECT_EQ(collector.tokens[id], cases[i].completion_ids) << "case " << i;
    }
  }
  pool.ClearPrefixCache();
  EXPECT_EQ(pool.free_pages(), free_at_start);
}

// With the river and τ = −1, every decode token exits after min_backbone_layers; the counters
// say so, and per-request thresholds are honoured (a request with exit disabled stays on the
// backbone when it runs alone).
TEST(DecodeEngineTest, RiverCountersAndPerRequestThresholds) {
  auto loaded = LoadModel("models/stories12L");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto river = River::Build(loaded->model->weights(), Int4QuantOptions());
  ASSERT_TRUE(river.ok());
  DecodeEngineOptions options;
  options.exit.min_backbone_layers = 3;
  std::map<std::string, std::vector<int>> layers;
  auto engine = DecodeEngine::Create(*loaded->model, river->get(), options,
                                     [&](const TokenEvent& e) {
                                       if (e.token_id >= 0) {
                                         layers[e.request_id].push_back(e.backbone_layers);
                                       }
                                     });
  ASSERT_TRUE(engine.ok());
  DecodeRequest exits = Greedy("exits", {1, 403, 407, 261, 378}, 20);
  exits.exit_threshold = -1.0f;
  ASSERT_TRUE((*engine)->Submit(exits).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  DecodeRequest stays = Greedy("stays", {1, 403, 407, 261, 378}, 20);
  stays.exit_disabled = true;
  ASSERT_TRUE((*engine)->Submit(stays).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());

  const int n_layers = loaded->model->config().n_layers;
  ASSERT_EQ(layers["exits"].size(), 20u);
  EXPECT_EQ(layers["exits"][0], n_layers);  // the first token comes from the full prefill
  for (size_t i = 1; i < layers["exits"].size(); ++i) EXPECT_EQ(layers["exits"][i], 3);
  for (int l : layers["stays"]) EXPECT_EQ(l, n_layers);
  const ExitStats& stats = (*engine)->exit_stats();
  EXPECT_EQ(stats.decode_tokens(), 38);
  EXPECT_EQ(stats.histogram()[3], 19);
  EXPECT_EQ(stats.histogram()[n_layers], 19);
  EXPECT_DOUBLE_EQ(stats.exit_rate(), 0.5);
  EXPECT_GT(stats.river_kv_share(), 0.0);
  EXPECT_LT(stats.river_kv_share(), 0.5);
}

// A second request with the same long prompt reuses the first one's full pages (prefix cache)
// and produces the same greedy output.
TEST(DecodeEngineTest, PrefixCacheReusesFullPromptPages) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<GoldenCase> cases = LoadGolden("stories260K");
  const GoldenCase& long_case = cases.back();  // an 88-token prompt: five full pages of 16
  ASSERT_GT(long_case.prompt_ids.size(), 64u);
  Collector collector;
  auto engine = DecodeEngine::Create(*loaded->model, nullptr, DecodeEngineOptions(),
                                     collector.Sink());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->Submit(Greedy("first", long_case.prompt_ids, 30)).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  const int64_t hits_before = (*engine)->pool().prefix_hits();
  ASSERT_TRUE((*engine)->Submit(Greedy("second", long_case.prompt_ids, 30)).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  EXPECT_GE((*engine)->pool().prefix_hits() - hits_before, 4);
  EXPECT_EQ(collector.tokens["first"], collector.tokens["second"]);
  EXPECT_EQ(collector.tokens["first"],
            std::vector<int32_t>(long_case.completion_ids.begin(),
                                 long_case.completion_ids.begin() + 30));
}

TEST(DecodeEngineTest, RejectsBadRequestsNamingTheLimit) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Collector collector;
  auto engine = DecodeEngine::Create(*loaded->model, nullptr, DecodeEngineOptions(),
                                     collector.Sink());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->Submit(Greedy("a", {})).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status vocab = (*engine)->Submit(Greedy("b", {1, 600}));
  EXPECT_NE(vocab.message().find("vocabulary"), absl::string_view::npos) << vocab;
  EXPECT_EQ((*engine)->Submit(Greedy("c", {1}, 0)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*engine)->Submit(Greedy("d", {1})).ok());
  EXPECT_NE((*engine)->Submit(Greedy("d", {1})).message().find("already live"),
            absl::string_view::npos);
  const std::vector<int32_t> too_long(512, 5);
  EXPECT_NE((*engine)->Submit(Greedy("e", too_long)).message().find("context"),
            absl::string_view::npos);
}

// A prompt larger than the whole pool fails alone with RESOURCE_EXHAUSTED.
TEST(DecodeEngineTest, PromptLargerThanThePoolFailsAlone) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  DecodeEngineOptions options;
  options.kv_cache_bytes = 2 * 20 * 1024;  // 2 pages = 32 tokens
  Collector collector;
  auto engine = DecodeEngine::Create(*loaded->model, nullptr, options, collector.Sink());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->Submit(Greedy("big", std::vector<int32_t>(100, 300), 5)).ok());
  ASSERT_TRUE((*engine)->Submit(Greedy("small", {1, 403, 407}, 5)).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  EXPECT_EQ(collector.final_events["big"].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(collector.final_events["small"].status.ok());
  EXPECT_EQ(collector.tokens["small"].size(), 5u);
}

// The decode side of a KV push, with the push done by hand: a separate pool plays the prefill
// worker, its pages are copied into the reserved ones layer by layer (what a transport's puts
// do), then the completion hands over the first token. The engine continues with the golden ids.
TEST(DecodeEngineReservationTest, PushedKvContinuesIntoTheGoldenIds) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& model = *loaded->model;
  const std::vector<GoldenCase> cases = LoadGolden("stories260K");
  const GoldenCase& c = cases.back();
  DecodeEngineOptions options;
  options.kv_cache_bytes = int64_t{8} << 20;
  Collector collector;
  auto engine = DecodeEngine::Create(model, nullptr, options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  KvPool& pool = (*engine)->mutable_pool();
  const int32_t free_at_start = pool.free_pages();

  auto reservation = (*engine)->Reserve(Greedy("pushed", c.prompt_ids), absl::Seconds(30));
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  EXPECT_EQ((*engine)->reserved(), 1);

  // "Prefill worker": its own pool, the prompt run through the model.
  auto prefill_pool = KvPool::Create(pool.layout(), int64_t{8} << 20);
  ASSERT_TRUE(prefill_pool.ok());
  SequenceKv prefilled(prefill_pool->get());
  ASSERT_TRUE(prefilled.Reserve(static_cast<int>(c.prompt_ids.size())).ok());
  PagedKvView view(&prefilled);
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
  ASSERT_TRUE(model.Forward(c.prompt_ids, 0, view, absl::MakeSpan(logits)).ok());
  const int32_t first = static_cast<int32_t>(
      std::max_element(logits.begin(), logits.end()) - logits.begin());
  const size_t n_pages = prefilled.pages().size();
  ASSERT_LE(n_pages, reservation->pages.size());
  for (int layer = 0; layer < pool.layout().n_layers; ++layer) {
    for (size_t p = 0; p < n_pages; ++p) {
      std::memcpy(pool.k(layer, reservation->pages[p], 0),
                  (*prefill_pool)->k(layer, prefilled.pages()[p], 0),
                  static_cast<size_t>(pool.page_bytes_per_layer()));
    }
  }
  const std::vector<uint8_t> provenance(c.prompt_ids.size(), kProvenanceFullDepth);
  const DecodeEngine::Writer writer{reservation->epoch, /*id=*/7};
  EXPECT_EQ((*engine)->CompleteReservation("pushed", writer, first, provenance).code(),
            absl::StatusCode::kFailedPrecondition);  // a writer that never attached
  ASSERT_TRUE((*engine)->AttachWriter("pushed", writer).ok());
  EXPECT_EQ((*engine)->CompleteReservation("pushed", writer, first, provenance).code(),
            absl::StatusCode::kOk);
  EXPECT_EQ((*engine)->CompleteReservation("pushed", writer, first, provenance).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  EXPECT_EQ(collector.tokens["pushed"], c.completion_ids);
  EXPECT_EQ(pool.free_pages() + pool.cached_pages(), free_at_start);
}

// A completion that never comes: the lease ends, the request fails with DEADLINE_EXCEEDED at
// the next step, and the pages return to the pool. An aborted reservation frees them too. (No
// writer attached to either: with one, the pages stay fenced; decode/kv_fencing_test.cc.)
TEST(DecodeEngineReservationTest, LeaseExpiryAndAbortReturnThePages) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  DecodeEngineOptions options;
  options.kv_cache_bytes = int64_t{1} << 20;
  Collector collector;
  auto engine = DecodeEngine::Create(*loaded->model, nullptr, options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int32_t free_at_start = (*engine)->pool().free_pages();
  const std::vector<int32_t> prompt(40, 300);
  auto lapsing = (*engine)->Reserve(Greedy("lapsing", prompt), absl::Milliseconds(50));
  auto aborted = (*engine)->Reserve(Greedy("aborted", prompt), absl::Seconds(30));
  ASSERT_TRUE(lapsing.ok() && aborted.ok());
  EXPECT_EQ((*engine)->pool().free_pages(), free_at_start - 6);
  EXPECT_EQ((*engine)->Reserve(Greedy("aborted", prompt), absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);  // duplicate live id
  EXPECT_TRUE((*engine)->Abort("aborted"));
  absl::SleepFor(absl::Milliseconds(80));
  ASSERT_TRUE((*engine)->Step().ok());
  EXPECT_EQ(collector.final_events["lapsing"].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(collector.final_events["aborted"].status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ((*engine)->reserved(), 0);
  EXPECT_EQ((*engine)->pool().free_pages(), free_at_start);
  EXPECT_EQ((*engine)->CompleteReservation("lapsing", {lapsing->epoch, 7}, 5,
                                            std::vector<uint8_t>(40))
                .code(),
            absl::StatusCode::kNotFound);
}

// A resumed (migrated) stream: the prompt plus the first k tokens of an uninterrupted run, the k
// tokens marked as output (DecodeRequest::resumed_output), gives exactly the rest of that run:
// greedy, and seeded sampling with penalties and min_tokens, whose random stream and counts are
// functions of the output position. Only the new tokens are emitted; max_tokens counts all.
TEST(DecodeEngineResumeTest, AResumedStreamContinuesTheUninterruptedRun) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const GoldenCase c = LoadGolden("stories260K").at(1);
  DecodeEngineOptions options;
  options.kv_cache_bytes = int64_t{16} << 20;
  DecodeRequest sampled = Greedy("sampled", c.prompt_ids, 60);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.top_p = 0.95f;
  sampled.sampling.presence_penalty = 0.4f;
  sampled.sampling.frequency_penalty = 0.3f;
  sampled.sampling.min_tokens = 30;
  sampled.sampling.seed = 1234;
  for (const DecodeRequest& base : {Greedy("greedy", c.prompt_ids, 60), sampled}) {
    Collector collector;
    auto engine = DecodeEngine::Create(*loaded->model, nullptr, options, collector.Sink());
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->Submit(base).ok());
    ASSERT_TRUE((*engine)->RunUntilIdle().ok());
    const std::vector<int32_t> whole = collector.tokens[base.request_id];
    ASSERT_EQ(whole.size(), 60u) << base.request_id;
    for (int k : {1, 17, 45, 59}) {
      DecodeRequest resumed = base;
      resumed.request_id = absl::StrCat(base.request_id, "-from-", k);
      resumed.prompt_ids.insert(resumed.prompt_ids.end(), whole.begin(), whole.begin() + k);
      resumed.resumed_output = k;
      ASSERT_TRUE((*engine)->Submit(resumed).ok());
      ASSERT_TRUE((*engine)->RunUntilIdle().ok());
      EXPECT_EQ(collector.tokens[resumed.request_id],
                std::vector<int32_t>(whole.begin() + k, whole.end()))
          << resumed.request_id;
      EXPECT_EQ(collector.final_events[resumed.request_id].finish_reason, FinishReason::kLength);
    }
  }
  // Output that cannot be: all of the prompt, or max_tokens already reached.
  Collector collector;
  auto engine = DecodeEngine::Create(*loaded->model, nullptr, options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  DecodeRequest all_output = Greedy("all", {1, 2, 3}, 10);
  all_output.resumed_output = 3;
  EXPECT_EQ((*engine)->Submit(all_output).code(), absl::StatusCode::kInvalidArgument);
  DecodeRequest done = Greedy("done", {1, 2, 3, 4}, 2);
  done.resumed_output = 2;
  EXPECT_EQ((*engine)->Submit(done).code(), absl::StatusCode::kInvalidArgument);
}

// Asking for a GPU engine fails cleanly where there is none: UNIMPLEMENTED in a build without
// CUDA (naming the build flag), UNAVAILABLE in a CUDA build on a machine without that device.
TEST(DecodeEngineDeviceTest, GpuEngineWithoutGpuFailsCleanly) {
  auto loaded = LoadModel("models/stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  DecodeEngineOptions options;
  options.cuda_device = 7;
  auto engine = DecodeEngine::Create(*loaded->model, nullptr, options, [](const TokenEvent&) {});
  ASSERT_FALSE(engine.ok());
  EXPECT_TRUE(engine.status().code() == absl::StatusCode::kUnimplemented ||
              engine.status().code() == absl::StatusCode::kUnavailable)
      << engine.status();
  options.cuda_device = -2;
  EXPECT_EQ(DecodeEngine::Create(*loaded->model, nullptr, options, [](const TokenEvent&) {})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace estuary
