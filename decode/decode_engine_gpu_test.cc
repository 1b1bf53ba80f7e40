// The decode engine with its steps on a GPU (DecodeEngineOptions::cuda_device) against the golden
// ids and the CPU engine. Skips without a CUDA device (label `gpu`).

#include <algorithm>
#include <map>

#include "core/backend/backend.h"
#include "core/model/model_loader.h"
#include "core/model/river.h"
#include "decode/decode_engine.h"
#include "gtest/gtest.h"
#include "tests/testing/golden_cases.h"

namespace estuary {
namespace {

using ::estuary::testing::GoldenCase;

SamplingParams GreedySampling() {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  return greedy;
}

// Runs every golden prompt of `model_name` through one engine, all in one batch, and returns
// each request's tokens and the engine's exit rate.
struct EngineRun {
  std::map<int, std::vector<int32_t>> tokens;
  double exit_rate = 0;
};

EngineRun RunAll(const LlamaModel& model, const River* river, const std::vector<GoldenCase>& cases,
                 DecodeEngineOptions options, int max_tokens,
                 const SamplingParams& sampling = GreedySampling()) {
  EngineRun run;
  TokenSink sink = [&](const TokenEvent& e) {
    if (e.token_id >= 0) run.tokens[std::stoi(e.request_id)].push_back(e.token_id);
  };
  options.kv_cache_bytes = int64_t{64} << 20;
  auto engine = DecodeEngine::Create(model, river, options, sink);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return run;
  for (size_t i = 0; i < cases.size(); ++i) {
    DecodeRequest r;
    r.request_id = std::to_string(i);
    r.prompt_ids = cases[i].prompt_ids;
    r.max_tokens = max_tokens;
    r.sampling = sampling;
    EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  EXPECT_TRUE((*engine)->RunUntilIdle().ok());
  run.exit_rate = (*engine)->exit_stats().exit_rate();
  return run;
}

class DecodeEngineGpuTest : public ::testing::TestWithParam<std::string> {};

// f32 weights on the GPU: every golden prompt in one batch gives the golden ids.
TEST_P(DecodeEngineGpuTest, ReproducesGoldenIdsInOneBatch) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const auto cases = ::estuary::testing::LoadGoldenCases(GetParam());
  ASSERT_FALSE(cases.empty());
  DecodeEngineOptions options;
  options.cuda_device = 0;
  const EngineRun gpu = RunAll(*loaded->model, nullptr, cases, options, 200);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(gpu.tokens.at(static_cast<int>(i)), cases[i].completion_ids) << "case " << i;
  }
}

// Sampling on the host from downloaded logits (temperature 1 with top-k 1 is greedy, but not by
// Sampler::greedy(), so the logits path runs) gives the golden ids too.
TEST_P(DecodeEngineGpuTest, HostSamplingFromDeviceLogits) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const auto cases = ::estuary::testing::LoadGoldenCases(GetParam());
  DecodeEngineOptions options;
  options.cuda_device = 0;
  SamplingParams top1;
  top1.temperature = 1.0f;
  top1.top_k = 1;
  const EngineRun gpu = RunAll(*loaded->model, nullptr, cases, options, 200, top1);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(gpu.tokens.at(static_cast<int>(i)), cases[i].completion_ids) << "case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, DecodeEngineGpuTest,
                         ::testing::Values("stories260K", "stories12L"));

// With the river forced after 4 layers, the GPU engine gives the CPU engine's tokens and every
// decode token exits. The GPU int4 kernel does not round activations to 16 bits as the CPU one
// does, so a near-tie may flip and change a sequence from there on: at least 3/4 of all tokens
// must lie in the common prefixes.
TEST(DecodeEngineGpuRiverTest, ForcedExitMatchesCpuEngine) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir("stories12L"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto river = River::Build(loaded->model->weights(), Int4QuantOptions());
  ASSERT_TRUE(river.ok()) << river.status();
  const auto cases = ::estuary::testing::LoadGoldenCases("stories12L");
  DecodeEngineOptions options;
  options.exit.max_backbone_layers = 4;
  constexpr int kTokens = 12;
  const EngineRun cpu = RunAll(*loaded->model, river->get(), cases, options, kTokens);
  options.cuda_device = 0;
  const EngineRun gpu = RunAll(*loaded->model, river->get(), cases, options, kTokens);
  size_t common = 0, total = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t>& a = gpu.tokens.at(static_cast<int>(i));
    const std::vector<int32_t>& b = cpu.tokens.at(static_cast<int>(i));
    const size_t n = std::min(a.size(), b.size());
    size_t prefix = 0;
    while (prefix < n && a[prefix] == b[prefix]) ++prefix;
    common += prefix;
    total += b.size();
  }
  EXPECT_GE(common * 4, total * 3) << common << " of " << total << " tokens in common prefixes";
  EXPECT_GT(gpu.exit_rate, 0.9);
}

// A device that does not exist fails engine creation with UNAVAILABLE, whether or not this
// machine has a GPU.
TEST(DecodeEngineGpuCreateTest, MissingDeviceIsUnavailable) {
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir("stories260K"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  DecodeEngineOptions options;
  options.cuda_device = 64;
  auto engine = DecodeEngine::Create(*loaded->model, nullptr, options, [](const TokenEvent&) {});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnavailable) << engine.status();
}

}  // namespace
}  // namespace estuary
