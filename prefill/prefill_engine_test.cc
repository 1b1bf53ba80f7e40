#include "prefill/prefill_engine.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "core/model/generator.h"
#include "core/model/model_loader.h"
#include "core/model/paged_kv_view.h"
#include "core/model/sharded_model.h"
#include "core/sampling/sampler.h"
#include "prefill/bench_prefill.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::GoldenCase;
using ::estuary::testing::LoadGoldenCases;

std::unique_ptr<ShardedModel> LoadSharded(const std::string& model, int tp) {
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir(model));
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  ShardedModelOptions options;
  options.tp_size = tp;
  auto sharded = ShardedModel::Create(std::move(loaded->model), options);
  EXPECT_TRUE(sharded.ok()) << sharded.status();
  return sharded.ok() ? std::move(*sharded) : nullptr;
}

// Records every event. Done events keep their pages (the test plays the consumer) until
// Clear(). LayerReady arrives on rank threads, hence the lock.
class Collector {
 public:
  PrefillSink Sink() {
    PrefillSink sink;
    sink.on_layer_ready = [this](const LayerReady& ready) {
      absl::MutexLock lock(&mu_);
      layer_events_.push_back({ready, order_++});
    };
    sink.on_done = [this](PrefillDone& done) {
      absl::MutexLock lock(&mu_);
      done_order_[done.request_id] = order_++;
      done_.emplace(done.request_id, std::move(done));
    };
    return sink;
  }
  PrefillDone& done(const std::string& id) { return done_.at(id); }
  bool has_done(const std::string& id) const { return done_.contains(id); }
  size_t num_done() const { return done_.size(); }
  int64_t done_order(const std::string& id) const { return done_order_.at(id); }
  const std::vector<std::pair<LayerReady, int64_t>>& layer_events() const {
    return layer_events_;
  }
  void Clear() {
    done_.clear();
    layer_events_.clear();
  }

 private:
  absl::Mutex mu_;
  int64_t order_ = 0;
  std::vector<std::pair<LayerReady, int64_t>> layer_events_;
  std::map<std::string, PrefillDone> done_;
  std::map<std::string, int64_t> done_order_;
};

PrefillRequest Request(const std::string& id, std::vector<int32_t> prompt) {
  PrefillRequest request;
  request.request_id = id;
  request.prompt_ids = std::move(prompt);
  request.sampling.temperature = 0.0f;
  return request;
}

PrefillEngineOptions Options(int chunk) {
  PrefillEngineOptions options;
  options.max_num_batched_tokens = chunk;
  options.kv_cache_bytes = int64_t{16} << 20;
  return options;
}

// Every K and V float of positions [0, n) of every layer and shard, in a page-independent order.
std::vector<float> SnapshotKv(const SequenceKv& kv, int n) {
  const KvLayout& layout = kv.pool()->layout();
  std::vector<float> out;
  for (int shard = 0; shard < kv.pool()->num_shards(); ++shard) {
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      for (int pos = 0; pos < n; ++pos) {
        for (int head = 0; head < layout.n_kv_heads; ++head) {
          const float* k = kv.k_slot(layer, pos, head, shard);
          const float* v = kv.v_slot(layer, pos, head, shard);
          out.insert(out.end(), k, k + layout.head_dim);
          out.insert(out.end(), v, v + layout.head_dim);
        }
      }
    }
  }
  return out;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A prompt of `n` valid ids: the golden prompts one after another, repeated.
std::vector<int32_t> LongPrompt(const std::string& model, int n) {
  std::vector<int32_t> ids;
  const std::vector<GoldenCase> cases = LoadGoldenCases(model);
  while (static_cast<int>(ids.size()) < n) {
    for (const GoldenCase& c : cases) ids.insert(ids.end(), c.prompt_ids.begin(), c.prompt_ids.end());
  }
  ids.resize(static_cast<size_t>(n));
  return ids;
}

// Greedy decode from a prefilled sequence, one token per step, as a decode worker would:
// every rank attends over its own shard of the same pages.
std::vector<int32_t> DecodeGreedy(ShardedModel& model, SequenceKv& kv, int prompt_len,
                                  int32_t first_token, int max_tokens) {
  const LlamaConfig& c = model.config();
  const int limit = std::min(max_tokens, c.max_seq_len - prompt_len);
  EXPECT_TRUE(kv.Reserve(prompt_len + limit).ok());
  std::vector<PagedKvView> views;
  for (int r = 0; r < model.tp_size(); ++r) views.emplace_back(&kv, r);
  auto is_eos = [&](int32_t id) {
    return std::find(c.eos_ids.begin(), c.eos_ids.end(), id) != c.eos_ids.end();
  };
  std::vector<int32_t> ids;
  if (is_eos(first_token)) return ids;
  ids.push_back(first_token);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  while (static_cast<int>(ids.size()) < limit) {
    BatchEntry entry;
    entry.tokens = absl::MakeConstSpan(&ids.back(), 1);
    entry.start_pos = prompt_len + static_cast<int>(ids.size()) - 1;
    EntryOutcome outcome;
    const absl::Status status = model.Forward(
        absl::MakeConstSpan(&entry, 1),
        [&](int rank, size_t) -> KvView* { return &views[static_cast<size_t>(rank)]; }, {},
        absl::MakeSpan(logits), absl::MakeSpan(&outcome, 1));
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) break;
    const int32_t next = Argmax(logits);
    if (is_eos(next)) break;
    ids.push_back(next);
  }
  return ids;
}

using ModelTp = std::tuple<std::string, int>;

std::string ModelTpName(const ::testing::TestParamInfo<ModelTp>& info) {
  return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
}

class PrefillModelTest : public ::testing::TestWithParam<ModelTp> {
 protected:
  void SetUp() override {
    model_ = LoadSharded(std::get<0>(GetParam()), std::get<1>(GetParam()));
    ASSERT_NE(model_, nullptr);
  }
  const std::string& model_name() const { return std::get<0>(GetParam()); }
  std::unique_ptr<ShardedModel> model_;
};

// All golden prompts at once (batched, the long one chunked), then a greedy decode from each
// sequence's pages gives the golden completion.
TEST_P(PrefillModelTest, PrefilledKvDecodesToTheGoldenIds) {
  const std::vector<GoldenCase> cases = LoadGoldenCases(model_name());
  ASSERT_FALSE(cases.empty());
  Collector collector;
  auto engine = PrefillEngine::Create(*model_, Options(32), collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int32_t baseline = (*engine)->pool().free_pages();
  for (const GoldenCase& c : cases) {
    ASSERT_TRUE((*engine)->Submit(Request(std::to_string(c.index), c.prompt_ids)).ok());
  }
  ASSERT_TRUE((*engine)->RunUntilIdle(absl::Now() + absl::Seconds(60)).ok());
  ASSERT_EQ(collector.num_done(), cases.size());
  for (const GoldenCase& c : cases) {
    PrefillDone& done = collector.done(std::to_string(c.index));
    ASSERT_TRUE(done.status.ok()) << done.status;
    ASSERT_EQ(done.num_tokens, static_cast<int>(c.prompt_ids.size()));
    ASSERT_FALSE(c.completion_ids.empty());
    EXPECT_EQ(done.first_token, c.completion_ids[0]) << model_name() << " case " << c.index;
    EXPECT_EQ(done.kv.length(), done.num_tokens);
    EXPECT_EQ(done.kv.pages(), done.pages);
    for (uint8_t p : done.provenance) EXPECT_EQ(p, kProvenanceFullDepth);
    const std::vector<int32_t> ids =
        DecodeGreedy(*model_, done.kv, done.num_tokens, done.first_token,
                     ::estuary::testing::kGoldenMaxNewTokens);
    EXPECT_EQ(ids, c.completion_ids) << model_name() << " case " << c.index;
  }
  collector.Clear();
  EXPECT_EQ((*engine)->pool().free_pages(), baseline);
}

// Chunks of 16, 64 and 512 tokens write bitwise the same KV and sample the same first token;
// a prompt batched with others writes the same KV as alone.
TEST_P(PrefillModelTest, ChunkingAndBatchingDoNotChangeTheKv) {
  const std::vector<int32_t> prompt = LongPrompt(model_name(), 200);
  const std::vector<int32_t> other = LongPrompt(model_name(), 37);
  const int n = static_cast<int>(prompt.size());
  std::vector<std::vector<float>> snapshots;
  std::vector<int32_t> first_tokens;
  for (int chunk : {16, 64, 512}) {
    Collector collector;
    auto engine = PrefillEngine::Create(*model_, Options(chunk), collector.Sink());
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->Submit(Request("p", prompt)).ok());
    ASSERT_TRUE((*engine)->RunUntilIdle().ok());
    EXPECT_EQ((*engine)->steps(), (n + chunk - 1) / chunk);
    PrefillDone& done = collector.done("p");
    ASSERT_TRUE(done.status.ok()) << done.status;
    snapshots.push_back(SnapshotKv(done.kv, n));
    first_tokens.push_back(done.first_token);
  }
  for (size_t i = 1; i < snapshots.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(snapshots[0], snapshots[i])) << "chunking #" << i;
    EXPECT_EQ(first_tokens[0], first_tokens[i]);
  }

  // `other` alone, then both in one step (chunk 512), then both interleaved in chunks of 64.
  std::vector<float> other_alone;
  {
    Collector collector;
    auto engine = PrefillEngine::Create(*model_, Options(512), collector.Sink());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->Submit(Request("o", other)).ok());
    ASSERT_TRUE((*engine)->RunUntilIdle().ok());
    other_alone = SnapshotKv(collector.done("o").kv, static_cast<int>(other.size()));
  }
  for (int chunk : {512, 64}) {
    Collector collector;
    auto engine = PrefillEngine::Create(*model_, Options(chunk), collector.Sink());
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->Submit(Request("o", other)).ok());
    ASSERT_TRUE((*engine)->Submit(Request("p", prompt)).ok());
    ASSERT_TRUE((*engine)->Submit(Request("o2", other)).ok());
    ASSERT_TRUE((*engine)->RunUntilIdle().ok());
    if (chunk == 512) {
      EXPECT_EQ((*engine)->steps(), 1) << "all three in one step";
    }
    EXPECT_TRUE(BitwiseEqual(SnapshotKv(collector.done("p").kv, n), snapshots[0])) << chunk;
    EXPECT_EQ(collector.done("p").first_token, first_tokens[0]);
    for (const char* id : {"o", "o2"}) {
      EXPECT_TRUE(BitwiseEqual(SnapshotKv(collector.done(id).kv, static_cast<int>(other.size())),
                               other_alone))
          << chunk << " " << id;
    }
  }
}

// One LayerReady per chunk, rank and layer; per rank in layer order; the pages named are the
// sequence's; all before the request's PrefillDone.
TEST_P(PrefillModelTest, LayerReadyCoversEveryLayerOfEveryChunkOnEveryRank) {
  const int tp = model_->tp_size(), n_layers = model_->config().n_layers;
  const int chunk = 32;
  Collector collector;
  // Besides recording, each event copies the K it announces straight from the pool: the layer
  // must already be written when its event arrives (a transport reads it right then).
  PrefillSink sink = collector.Sink();
  const KvPool* pool = nullptr;
  absl::Mutex copies_mu;
  std::map<std::tuple<std::string, int, int, int>, std::vector<float>> copies;  // id,rank,layer,pos
  const PrefillSink record = sink;
  sink.on_layer_ready = [&](const LayerReady& ready) {
    record.on_layer_ready(ready);
    const KvLayout& layout = pool->layout();
    for (int pos = ready.first_pos; pos < ready.end_pos; ++pos) {
      const int32_t page = ready.pages[static_cast<size_t>(pos / 16 - ready.first_page)];
      std::vector<float> k;
      for (int head = 0; head < layout.n_kv_heads; ++head) {
        const float* slot = pool->k(ready.layer, page, head, ready.rank) + (pos % 16) * layout.head_dim;
        k.insert(k.end(), slot, slot + layout.head_dim);
      }
      absl::MutexLock lock(&copies_mu);
      copies[{ready.request_id, ready.rank, ready.layer, pos}] = std::move(k);
    }
  };
  auto engine = PrefillEngine::Create(*model_, Options(chunk), sink);
  ASSERT_TRUE(engine.ok());
  pool = &(*engine)->pool();
  const std::map<std::string, std::vector<int32_t>> prompts = {
      {"long", LongPrompt(model_name(), 88)}, {"short", LongPrompt(model_name(), 17)}};
  for (const auto& [id, prompt] : prompts) ASSERT_TRUE((*engine)->Submit(Request(id, prompt)).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());

  for (const auto& [id, prompt] : prompts) {
    const PrefillDone& done = collector.done(id);
    ASSERT_TRUE(done.status.ok());
    for (int rank = 0; rank < tp; ++rank) {
      // (first_pos, end_pos, layer) in arrival order on this rank.
      std::vector<std::tuple<int, int, int>> seen, expected;
      for (const auto& [ready, order] : collector.layer_events()) {
        if (ready.request_id != id || ready.rank != rank) continue;
        seen.emplace_back(ready.first_pos, ready.end_pos, ready.layer);
        EXPECT_LT(order, collector.done_order(id));
        const int last_page = (ready.end_pos - 1) / 16;
        ASSERT_EQ(ready.first_page, ready.first_pos / 16);
        EXPECT_EQ(ready.pages, std::vector<int32_t>(done.pages.begin() + ready.first_page,
                                                    done.pages.begin() + last_page + 1));
      }
      // The scheduler gives running prompts their chunk first: "long" takes the first 32-token
      // chunks; "short" shares the step where "long" leaves room.
      int pos = 0;
      const int len = static_cast<int>(prompt.size());
      std::vector<std::pair<int, int>> chunks;
      if (id == "long") {
        for (; pos < len; pos += chunk) chunks.emplace_back(pos, std::min(len, pos + chunk));
      } else {
        chunks = {{0, 8}, {8, 17}};  // 88 = 32 + 32 + 24: 8 tokens fit the third step
      }
      for (const auto& [b, e] : chunks) {
        for (int layer = 0; layer < n_layers; ++layer) expected.emplace_back(b, e, layer);
      }
      EXPECT_EQ(seen, expected) << id << " rank " << rank;
      // What each event saw is the final KV.
      const KvLayout& layout = pool->layout();
      for (int layer = 0; layer < n_layers; ++layer) {
        for (int pos = 0; pos < len; ++pos) {
          std::vector<float> k;
          for (int head = 0; head < layout.n_kv_heads; ++head) {
            const float* slot = done.kv.k_slot(layer, pos, head, rank);
            k.insert(k.end(), slot, slot + layout.head_dim);
          }
          ASSERT_TRUE(BitwiseEqual(copies.at({id, rank, layer, pos}), k))
              << id << " rank " << rank << " layer " << layer << " pos " << pos;
        }
      }
    }
  }
  EXPECT_EQ(collector.layer_events().size(),
            static_cast<size_t>(tp * n_layers * (3 + 2)));
}

// With a low threshold the sequence-level exit leaves the backbone early and records it in the
// provenance of every slot.
TEST_P(PrefillModelTest, PrefillExitRunsTheRiverWithALowThreshold) {
  ASSERT_TRUE(model_->BuildRiver(Int4QuantOptions()).ok());
  const int n_layers = model_->config().n_layers;
  PrefillEngineOptions options = Options(32);
  options.prefill_exit = true;
  options.exit.default_threshold = -1.0f;  // every chunk passes after min_backbone_layers
  options.exit.min_backbone_layers = 2;
  Collector collector;
  auto engine = PrefillEngine::Create(*model_, options, collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Submit(Request("x", LongPrompt(model_name(), 70))).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  const PrefillDone& done = collector.done("x");
  ASSERT_TRUE(done.status.ok()) << done.status;
  ASSERT_EQ(done.chunk_backbone_layers.size(), 3u);
  for (int layers : done.chunk_backbone_layers) {
    EXPECT_LT(layers, n_layers);
    EXPECT_EQ(layers, 2);
  }
  for (uint8_t p : done.provenance) EXPECT_EQ(p, 1) << "last backbone layer is layer 1";
  EXPECT_GE(done.first_token, 0);
  // Every layer's LayerReady still arrives (the river writes KV too).
  EXPECT_EQ(collector.layer_events().size(),
            static_cast<size_t>(model_->tp_size() * n_layers * 3));

  // A request may turn it off for itself (τ above 1).
  PrefillRequest full = Request("full", LongPrompt(model_name(), 20));
  full.exit_threshold = 2.0f;
  ASSERT_TRUE((*engine)->Submit(std::move(full)).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  EXPECT_EQ(collector.done("full").chunk_backbone_layers, std::vector<int>{n_layers});
}

INSTANTIATE_TEST_SUITE_P(Shipped, PrefillModelTest,
                         ::testing::Combine(::testing::ValuesIn(::estuary::testing::GoldenModels()),
                                            ::testing::Values(1, 2)),
                         ModelTpName);

class PrefillEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LoadSharded("stories260K", 2);
    ASSERT_NE(model_, nullptr);
  }
  std::unique_ptr<ShardedModel> model_;
};

// A resumed (migrated) stream's prompt ends with k tokens of output: the first token is sampled
// at output position k, so it is the (k + 1)-th token of the uninterrupted seeded run (the same
// random stream, the presence penalty counting those k tokens, min_tokens still masking EOS).
TEST_F(PrefillEngineTest, AResumedPromptSamplesAtItsOutputPosition) {
  const GoldenCase c = LoadGoldenCases("stories260K").at(1);
  GenerateRequest whole;
  whole.prompt_ids = c.prompt_ids;
  whole.max_tokens = 40;
  whole.sampling.temperature = 0.9f;
  whole.sampling.presence_penalty = 0.5f;
  whole.sampling.min_tokens = 20;
  whole.sampling.seed = 77;
  ShardedForwardOptions invariant;  // the prefill engine's kernels, so the logits match bitwise
  invariant.chunk_invariant = true;
  absl::StatusOr<GenerateResult> uninterrupted = Generate(*model_, whole, nullptr, invariant);
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  const std::vector<int32_t>& out = uninterrupted->completion_ids;
  ASSERT_EQ(out.size(), 40u);
  Collector collector;
  auto engine = PrefillEngine::Create(*model_, Options(64), collector.Sink());
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int k : {0, 5, 19, 33}) {
    PrefillRequest resumed = Request(std::to_string(k), c.prompt_ids);
    resumed.sampling = whole.sampling;
    resumed.prompt_ids.insert(resumed.prompt_ids.end(), out.begin(), out.begin() + k);
    resumed.resumed_output = k;
    ASSERT_TRUE((*engine)->Submit(std::move(resumed)).ok());
  }
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  for (int k : {0, 5, 19, 33}) {
    PrefillDone& done = collector.done(std::to_string(k));
    ASSERT_TRUE(done.status.ok()) << done.status;
    EXPECT_EQ(done.first_token, out[static_cast<size_t>(k)]) << "resumed after " << k;
  }
  PrefillRequest all_output = Request("all", {1, 2});
  all_output.resumed_output = 2;
  EXPECT_EQ((*engine)->Submit(std::move(all_output)).code(), absl::StatusCode::kInvalidArgument);
  collector.Clear();
}

TEST_F(PrefillEngineTest, RejectsBadInputNamingTheLimit) {
  const LlamaConfig& c = model_->config();
  Collector collector;
  auto engine = PrefillEngine::Create(*model_, Options(64), collector.Sink());
  ASSERT_TRUE(engine.ok());
  PrefillEngine& e = **engine;
  auto expect_invalid = [&](PrefillRequest request, const std::string& words) {
    const absl::Status status = e.Submit(std::move(request));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(std::string(status.message()).find(words), std::string::npos) << status;
  };
  expect_invalid(Request("empty", {}), "no tokens");
  expect_invalid(Request("neg", {1, -1}), "outside the vocabulary");
  expect_invalid(Request("big", {1, c.vocab_size}), "outside the vocabulary");
  expect_invalid(Request("long", std::vector<int32_t>(static_cast<size_t>(c.max_seq_len), 1)),
                 "context");
  PrefillRequest bad_sampling = Request("temp", {1, 2});
  bad_sampling.sampling.temperature = -1.0f;
  expect_invalid(std::move(bad_sampling), "temperature");
  PrefillRequest bad_tau = Request("tau", {1, 2});
  bad_tau.exit_threshold = 3.0f;
  expect_invalid(std::move(bad_tau), "exit threshold");
  ASSERT_TRUE(e.Submit(Request("a", {1, 2, 3})).ok());
  expect_invalid(Request("a", {1, 2}), "already live");
  ASSERT_TRUE(e.RunUntilIdle().ok());
  EXPECT_TRUE(collector.done("a").status.ok());
  EXPECT_TRUE(e.Submit(Request("a", {1, 2})).ok()) << "a finished id may be reused";
  ASSERT_TRUE(e.RunUntilIdle().ok());
  EXPECT_EQ(collector.num_done(), 1u);  // the map keeps the latest "a"
  EXPECT_TRUE(e.Idle());

  // Options.
  for (auto [mutate, flag] :
       std::vector<std::pair<void (*)(PrefillEngineOptions&), std::string>>{
           {[](PrefillEngineOptions& o) { o.max_num_batched_tokens = 0; },
            "--max-num-batched-tokens"},
           {[](PrefillEngineOptions& o) { o.block_size = 0; }, "--block-size"},
           {[](PrefillEngineOptions& o) { o.max_num_seqs = 0; }, "--max-num-seqs"},
           {[](PrefillEngineOptions& o) { o.kv_cache_bytes = 0; }, "--kv-cache-bytes"}}) {
    PrefillEngineOptions options = Options(64);
    mutate(options);
    auto bad = PrefillEngine::Create(*model_, options, {});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(std::string(bad.status().message()).find(flag), std::string::npos) << bad.status();
  }
  PrefillEngineOptions exit_without_river = Options(64);
  exit_without_river.prefill_exit = true;
  EXPECT_EQ(PrefillEngine::Create(*model_, exit_without_river, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(PrefillEngineTest, AbortEndsWaitingAndRunningRequestsAndFreesTheirPages) {
  Collector collector;
  PrefillEngineOptions options = Options(16);
  options.max_num_seqs = 1;  // "b" waits while "a" runs
  auto engine = PrefillEngine::Create(*model_, options, collector.Sink());
  ASSERT_TRUE(engine.ok());
  PrefillEngine& e = **engine;
  const int32_t baseline = e.pool().free_pages();
  const std::vector<int32_t> prompt = LongPrompt("stories260K", 100);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(e.Submit(Request(id, prompt)).ok());
  ASSERT_TRUE(e.Step().ok());  // "a" has its first chunk
  EXPECT_EQ(e.running(), 1);
  EXPECT_EQ(e.waiting(), 2);
  EXPECT_LT(e.pool().free_pages(), baseline);
  EXPECT_TRUE(e.Abort("a"));
  EXPECT_TRUE(e.Abort("b"));
  EXPECT_FALSE(e.Abort("nobody"));
  ASSERT_TRUE(e.RunUntilIdle(absl::Now() + absl::Seconds(30)).ok());
  for (const char* id : {"a", "b"}) {
    EXPECT_EQ(collector.done(id).status.code(), absl::StatusCode::kCancelled) << id;
    EXPECT_EQ(collector.done(id).first_token, -1);
  }
  EXPECT_EQ(collector.done("a").num_tokens, 16) << "one chunk was written before the abort";
  EXPECT_EQ(collector.done("a").kv.length(), 16);
  EXPECT_TRUE(collector.done("b").kv.pages().empty());
  EXPECT_TRUE(collector.done("c").status.ok());
  EXPECT_FALSE(e.Abort("c")) << "finished";
  collector.Clear();
  EXPECT_EQ(e.pool().free_pages(), baseline);
  EXPECT_EQ(e.pool().Stats().used_pages, 0);
}

TEST_F(PrefillEngineTest, AFullPoolMakesRequestsWaitAndATooLongPromptIsRefused) {
  const KvLayout layout = KvLayout::FromConfig(model_->config(), 16, model_->tp_size());
  PrefillEngineOptions options = Options(64);
  options.kv_cache_bytes = 8 * layout.page_bytes() * model_->tp_size();  // 8 pages, 128 tokens
  Collector collector;
  auto engine = PrefillEngine::Create(*model_, options, collector.Sink());
  ASSERT_TRUE(engine.ok());
  PrefillEngine& e = **engine;
  ASSERT_EQ(e.pool().num_pages(), 8);
  const absl::Status too_long = e.Submit(Request("huge", LongPrompt("stories260K", 129)));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kResourceExhausted) << too_long;
  EXPECT_NE(std::string(too_long.message()).find("9 KV pages"), std::string::npos) << too_long;

  // 6 pages each: the second waits until the consumer drops the first's pages.
  ASSERT_TRUE(e.Submit(Request("first", LongPrompt("stories260K", 90))).ok());
  ASSERT_TRUE(e.Submit(Request("second", LongPrompt("stories260K", 90))).ok());
  const absl::Status stuck = e.RunUntilIdle(absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(stuck.code(), absl::StatusCode::kDeadlineExceeded) << stuck;
  ASSERT_TRUE(collector.has_done("first"));
  EXPECT_TRUE(collector.done("first").status.ok());
  EXPECT_FALSE(collector.has_done("second"));
  EXPECT_EQ(e.waiting(), 1);
  collector.Clear();  // the consumer releases "first"
  ASSERT_TRUE(e.RunUntilIdle(absl::Now() + absl::Seconds(30)).ok());
  EXPECT_TRUE(collector.done("second").status.ok());

  // A request past its deadline ends with DEADLINE_EXCEEDED instead of running.
  PrefillRequest late = Request("late", {1, 2, 3});
  late.deadline = absl::Now() - absl::Seconds(1);
  ASSERT_TRUE(e.Submit(std::move(late)).ok());
  ASSERT_TRUE(e.RunUntilIdle().ok());
  EXPECT_EQ(collector.done("late").status.code(), absl::StatusCode::kDeadlineExceeded);
  collector.Clear();
  EXPECT_EQ(e.pool().free_pages(), 8);
}

TEST_F(PrefillEngineTest, ADroppedDoneEventReturnsThePagesAtOnce) {
  int done = 0;
  PrefillSink sink;
  sink.on_done = [&done](PrefillDone& event) { done += event.status.ok(); };  // keeps nothing
  auto engine = PrefillEngine::Create(*model_, Options(64), sink);
  ASSERT_TRUE(engine.ok());
  const int32_t baseline = (*engine)->pool().free_pages();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*engine)->Submit(Request(std::to_string(i), LongPrompt("stories260K", 40))).ok());
  }
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  EXPECT_EQ(done, 5);
  EXPECT_EQ((*engine)->pool().free_pages(), baseline);
}

// The benchmark's code path on the tiny model (the real run is `estuary bench-prefill --model ...`).
TEST(BenchPrefillTest, MeasuresPrefillAndTheGemmsOnATinyModel) {
  BenchPrefillOptions options;
  options.model_path = "models/stories260K";
  options.prompt_tokens = 40;
  options.max_num_batched_tokens = 16;
  options.matmul_iterations = 1;
  auto report = MeasurePrefill(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->rows.size(), 2u + 5u);
  for (const BenchPrefillRow& row : report->rows) {
    if (row.kind == "prefill") {
      EXPECT_GT(row.tokens_per_second, 0);
      EXPECT_GT(row.dense_gflops, 0);
      EXPECT_EQ(row.chunk, 16);
    } else {
      EXPECT_EQ(row.n_tokens, 16);
      EXPECT_GT(row.batch_invariant_gflops, 0);
      EXPECT_GT(row.sgemm_gflops, 0);
    }
  }
  EXPECT_NE(BenchPrefillJson(*report).find("\"rows\":["), std::string::npos);
  EXPECT_NE(BenchPrefillTable(*report).find("inv/sgemm"), std::string::npos);
  options.prompt_tokens = 0;
  EXPECT_EQ(MeasurePrefill(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.prompt_tokens = 40;
  options.model_path.clear();
  EXPECT_EQ(MeasurePrefill(options).status().code(), absl::StatusCode::kInvalidArgument);
}

// Asking for a GPU engine fails cleanly where there is none: UNIMPLEMENTED in a build without
// CUDA, UNAVAILABLE in a CUDA build on a machine without that device.
TEST(PrefillEngineDeviceTest, GpuEngineWithoutGpuFailsCleanly) {
  auto model = LoadSharded("stories260K", 1);
  ASSERT_NE(model, nullptr);
  PrefillEngineOptions options;
  options.cuda_device = 7;
  auto engine = PrefillEngine::Create(*model, options, {});
  ASSERT_FALSE(engine.ok());
  EXPECT_TRUE(engine.status().code() == absl::StatusCode::kUnimplemented ||
              engine.status().code() == absl::StatusCode::kUnavailable)
      << engine.status();
  options.cuda_device = -3;
  EXPECT_EQ(PrefillEngine::Create(*model, options, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace estuary
