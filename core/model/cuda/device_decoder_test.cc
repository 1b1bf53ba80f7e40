// The device decode path against the CPU path and the golden outputs. Every test needs a GPU and
// skips with a message without one (label `gpu`).
#include "core/model/cuda/device_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "core/backend/backend.h"
#include "core/model/cuda/device_generate.h"
#include "core/model/cuda/device_model.h"
#include "core/model/generator.h"
#include "core/model/model_loader.h"
#include "core/model/river.h"
#include "core/model/sharded_model.h"
#include "tests/testing/golden_cases.h"

namespace estuary::cuda {
namespace {

using ::estuary::testing::GoldenCase;

std::unique_ptr<LlamaModel> Load(const std::string& name, std::optional<DType> dtype = {}) {
  LoadOptions options;
  options.dtype = dtype;
  auto loaded = LoadModel(::estuary::testing::GoldenModelDir(name), options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? std::move(loaded->model) : nullptr;
}

std::unique_ptr<River> BuildRiver(const LlamaModel& model) {
  Int4QuantOptions quant;
  quant.group_size = 64;
  auto river = River::Build(model.weights(), quant);
  EXPECT_TRUE(river.ok()) << river.status();
  return river.ok() ? std::move(*river) : nullptr;
}

std::unique_ptr<DeviceModel> Upload(const LlamaModel& model, const River* river = nullptr) {
  auto device = DeviceModel::Create(model, river);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(*device) : nullptr;
}

std::unique_ptr<DeviceDecoder> MakeDecoder(const DeviceModel& model, int64_t kv_mib = 16,
                                           const ExitPolicy& policy = {}, bool graphs = true,
                                           int max_rows = 64) {
  DeviceDecoderOptions options;
  options.kv_cache_bytes = kv_mib << 20;
  options.policy = policy;
  options.use_graphs = graphs;
  options.max_rows = max_rows;
  auto decoder = DeviceDecoder::Create(model, options);
  EXPECT_TRUE(decoder.ok()) << decoder.status();
  return decoder.ok() ? std::move(*decoder) : nullptr;
}

// The CPU reference: Generate over a borrowed TP-1 model, with or without the river.
GenerateResult CpuGenerate(const LlamaModel& model, const River* river, const ExitPolicy& policy,
                           const std::vector<int32_t>& prompt, int new_tokens, float threshold) {
  auto sharded = ShardedModel::Borrow(model, river);
  GenerateRequest request;
  request.prompt_ids = prompt;
  request.max_tokens = new_tokens;
  request.ignore_eos = true;
  ShardedForwardOptions forward;
  forward.use_river = river != nullptr;
  forward.policy = policy;
  forward.policy.default_threshold = threshold;
  auto result = Generate(*sharded, request, nullptr, forward);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : GenerateResult{};
}

// Runs `prompt` and then the CPU's completion on the device (teacher forcing): result i is the
// step that, on the CPU, produced completion token i. One near-tie or near-threshold flip then
// cannot change every later input.
std::vector<DeviceRowResult> TeacherForced(DeviceDecoder& decoder,
                                           const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& completion,
                                           float threshold) {
  std::vector<DeviceRowResult> results(completion.size());
  auto seq = decoder.AddSequence();
  EXPECT_TRUE(seq.ok());
  if (!seq.ok() || completion.empty()) return {};
  const absl::Status prefilled = decoder.Prefill(*seq, prompt, 0, threshold, results[0]);
  EXPECT_TRUE(prefilled.ok()) << prefilled;
  for (size_t i = 1; prefilled.ok() && i < completion.size(); ++i) {
    const DeviceRow row{*seq, completion[i - 1], static_cast<int32_t>(prompt.size() + i - 1),
                        threshold};
    const absl::Status stepped = decoder.Step({&row, 1}, {&results[i], 1});
    EXPECT_TRUE(stepped.ok()) << stepped;
    if (!stepped.ok()) break;
  }
  decoder.ReleaseSequence(*seq);
  return results;
}

// How many results agree with the CPU's tokens and backbone layers.
struct Agreement {
  int tokens = 0;
  int layers = 0;
};
Agreement Compare(const std::vector<DeviceRowResult>& gpu, const GenerateResult& cpu) {
  Agreement a;
  for (size_t i = 0; i < gpu.size() && i < cpu.completion_ids.size(); ++i) {
    a.tokens += gpu[i].next_token == cpu.completion_ids[i];
    a.layers += i < cpu.backbone_layers.size() && gpu[i].backbone_layers == cpu.backbone_layers[i];
  }
  return a;
}

// A model loaded on the CPU and uploaded to the device; every test skips without a device.
class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
  // Loads `name` (converted to `dtype` when set), builds its exit river when asked, uploads both.
  void Prepare(const std::string& name, bool with_river = false,
               std::optional<DType> dtype = std::nullopt) {
    model_ = Load(name, dtype);
    ASSERT_NE(model_, nullptr);
    if (with_river) {
      river_ = BuildRiver(*model_);
      ASSERT_NE(river_, nullptr);
    }
    device_ = Upload(*model_, river_.get());
    ASSERT_NE(device_, nullptr);
  }

  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<River> river_;
  std::unique_ptr<DeviceModel> device_;
};

class DeviceGoldenTest : public DeviceTest, public ::testing::WithParamInterface<GoldenCase> {};

// f32 weights on the device give the golden greedy ids of every case (both models), through the
// captured graphs.
TEST_P(DeviceGoldenTest, GreedyIdsMatchGolden) {
  const GoldenCase& c = GetParam();
  ASSERT_NO_FATAL_FAILURE(Prepare(c.model));
  auto decoder = MakeDecoder(*device_, 64);
  ASSERT_NE(decoder, nullptr);
  auto out = GenerateOnDevice(*decoder, c.prompt_ids, static_cast<int>(c.completion_ids.size()));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->completion_ids, c.completion_ids);
}

INSTANTIATE_TEST_SUITE_P(Golden, DeviceGoldenTest,
                         ::testing::ValuesIn(::estuary::testing::AllGoldenCases()));

// Graph replay and direct launches compute the same logits bit for bit.
TEST_F(DeviceTest, GraphReplayMatchesDirectLaunch) {
  ASSERT_NO_FATAL_FAILURE(Prepare("stories12L"));
  std::vector<std::vector<float>> logits(2);
  for (int graphs = 0; graphs < 2; ++graphs) {
    auto decoder = MakeDecoder(*device_, 16, {}, graphs == 1);
    ASSERT_NE(decoder, nullptr);
    auto seq = decoder->AddSequence();
    ASSERT_TRUE(seq.ok());
    const int vocab = model_->config().vocab_size;
    std::vector<DeviceRow> rows;
    for (int p = 0; p < 5; ++p) rows.push_back({*seq, 1 + 7 * p, p, 2.0f});
    std::vector<DeviceRowResult> results(rows.size());
    logits[graphs].resize(rows.size() * static_cast<size_t>(vocab));
    ASSERT_TRUE(decoder->Step(rows, absl::MakeSpan(results), absl::MakeSpan(logits[graphs])).ok());
    // 5 rows run in the bucket of 8; a graph was captured for it only when graphs are on.
    EXPECT_EQ(decoder->graph_nodes(5) > 0, graphs == 1);
  }
  EXPECT_EQ(logits[0], logits[1]);
}

// Several sequences in one step give each sequence the ids it gets alone.
TEST_F(DeviceTest, BatchedSequencesMatchSingleSequences) {
  ASSERT_NO_FATAL_FAILURE(Prepare("stories12L"));
  auto decoder = MakeDecoder(*device_, 32);
  ASSERT_NE(decoder, nullptr);
  const auto cases = ::estuary::testing::LoadGoldenCases("stories12L");
  ASSERT_GE(cases.size(), 3u);
  constexpr int kSteps = 24;
  std::vector<int32_t> seqs;
  std::vector<DeviceRowResult> last(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    auto seq = decoder->AddSequence();
    ASSERT_TRUE(seq.ok());
    seqs.push_back(*seq);
    ASSERT_TRUE(decoder->Prefill(*seq, cases[i].prompt_ids, 0, 2.0f, last[i]).ok());
  }
  std::vector<std::vector<int32_t>> batched(cases.size());
  for (int step = 0; step < kSteps; ++step) {
    std::vector<DeviceRow> rows;
    for (size_t i = 0; i < cases.size(); ++i) {
      batched[i].push_back(last[i].next_token);
      rows.push_back({seqs[i], last[i].next_token,
                      static_cast<int32_t>(cases[i].prompt_ids.size()) + step, 2.0f});
    }
    ASSERT_TRUE(decoder->Step(rows, absl::MakeSpan(last)).ok());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    auto alone = GenerateOnDevice(*decoder, cases[i].prompt_ids, kSteps);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(batched[i], alone->completion_ids) << "case " << i;
  }
}

// stories12L with its exit river, on the CPU and on the device.
class RiverDeviceTest : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(Prepare("stories12L", /*with_river=*/true));
    cases_ = ::estuary::testing::LoadGoldenCases("stories12L");
    ASSERT_FALSE(cases_.empty());
  }

  std::vector<GoldenCase> cases_;
};

// The river at a fixed exit (every token leaves after 4 backbone layers) and fully on int4:
// every step runs exactly the forced backbone layers, and the greedy tokens are the CPU river's
// (all but at most one of 16: the CPU int4 kernel rounds activations to 16 bits, the GPU one
// does not, which may move a near-tie).
TEST_F(RiverDeviceTest, FixedExitMatchesCpu) {
  constexpr int kTokens = 16;
  const std::vector<int32_t>& prompt = cases_[0].prompt_ids;
  for (int exit_after : {4, 0}) {
    ExitPolicy policy;
    policy.max_backbone_layers = exit_after;
    auto decoder = MakeDecoder(*device_, 16, policy);
    ASSERT_NE(decoder, nullptr);
    const GenerateResult cpu = CpuGenerate(*model_, river_.get(), policy, prompt, kTokens, 2.0f);
    const std::vector<DeviceRowResult> gpu =
        TeacherForced(*decoder, prompt, cpu.completion_ids, 2.0f);
    ASSERT_EQ(gpu.size(), static_cast<size_t>(kTokens));
    for (const DeviceRowResult& r : gpu) EXPECT_EQ(r.backbone_layers, exit_after);
    EXPECT_GE(Compare(gpu, cpu).tokens, kTokens - 1) << "exit after " << exit_after;
  }
}

// With a threshold, the exit decision taken on the device agrees with the CPU's on at least 90%
// of the steps, tokens really exit, and at least 90% of the greedy tokens are the CPU's.
TEST_F(RiverDeviceTest, ThresholdExitsLikeCpu) {
  ExitPolicy policy;  // batch-min rule, exits considered after 1 layer
  auto decoder = MakeDecoder(*device_, 16, policy);
  ASSERT_NE(decoder, nullptr);
  constexpr int kTokens = 32;
  constexpr float kThreshold = 0.8f;
  const std::vector<int32_t>& prompt = cases_[0].prompt_ids;
  const GenerateResult cpu =
      CpuGenerate(*model_, river_.get(), policy, prompt, kTokens, kThreshold);
  ASSERT_EQ(cpu.completion_ids.size(), static_cast<size_t>(kTokens));
  const std::vector<DeviceRowResult> gpu =
      TeacherForced(*decoder, prompt, cpu.completion_ids, kThreshold);
  ASSERT_EQ(gpu.size(), static_cast<size_t>(kTokens));
  int exited = 0;
  for (const DeviceRowResult& r : gpu) exited += r.backbone_layers < model_->config().n_layers;
  EXPECT_GT(exited, 0) << "no token left the backbone at threshold " << kThreshold;
  const Agreement agree = Compare(gpu, cpu);
  EXPECT_GE(agree.layers * 10, kTokens * 9)
      << agree.layers << " of " << kTokens << " steps exit where the CPU's do";
  EXPECT_GE(agree.tokens * 10, kTokens * 9)
      << agree.tokens << " of " << kTokens << " greedy tokens are the CPU's";
}

// bf16 weights on the device against bf16 weights on the CPU.
TEST_F(DeviceTest, Bf16WeightsMatchCpuBf16) {
  ASSERT_NO_FATAL_FAILURE(Prepare("stories12L", false, DType::kBF16));
  auto decoder = MakeDecoder(*device_);
  ASSERT_NE(decoder, nullptr);
  const auto cases = ::estuary::testing::LoadGoldenCases("stories12L");
  ASSERT_FALSE(cases.empty());
  constexpr int kTokens = 16;
  auto gpu = GenerateOnDevice(*decoder, cases[0].prompt_ids, kTokens);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const GenerateResult cpu = CpuGenerate(*model_, nullptr, {}, cases[0].prompt_ids, kTokens, 2.0f);
  EXPECT_EQ(gpu->completion_ids, cpu.completion_ids);
}

// A prefill chunk of a bf16 model on cuBLAS (a decoder without exits, 48 rows) against the same
// chunk on the row kernels: cuBLAS rounds the activations to bf16, so the logits agree closely
// but not bitwise, and the greedy token is the same.
TEST_F(DeviceTest, CublasPrefillAgreesWithRowKernels) {
  ASSERT_NO_FATAL_FAILURE(Prepare("stories12L", false, DType::kBF16));
  const int vocab = model_->config().vocab_size;
  std::vector<int32_t> prompt;
  for (const GoldenCase& c : ::estuary::testing::LoadGoldenCases("stories12L")) {
    prompt.insert(prompt.end(), c.prompt_ids.begin(), c.prompt_ids.end());
  }
  prompt.resize(std::min<size_t>(prompt.size(), 48));
  ASSERT_GE(prompt.size(), static_cast<size_t>(kCublasMinRows));
  std::vector<std::vector<float>> logits(2, std::vector<float>(static_cast<size_t>(vocab)));
  for (int with_cublas = 0; with_cublas < 2; ++with_cublas) {
    DeviceDecoderOptions options;
    options.kv_cache_bytes = int64_t{16} << 20;
    options.exits = with_cublas == 0;  // a decoder without exits uses cuBLAS for >= 32 rows
    auto decoder = DeviceDecoder::Create(*device_, options);
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    auto seq = (*decoder)->AddSequence();
    ASSERT_TRUE(seq.ok());
    std::vector<DeviceRow> rows;
    for (size_t i = 0; i < prompt.size(); ++i) {
      rows.push_back({*seq, prompt[i], static_cast<int32_t>(i), 2.0f});
    }
    std::vector<DeviceRowResult> results(rows.size());
    std::vector<float> all(rows.size() * static_cast<size_t>(vocab));
    ASSERT_TRUE((*decoder)->Step(rows, absl::MakeSpan(results), absl::MakeSpan(all)).ok());
    std::copy(all.end() - vocab, all.end(), logits[static_cast<size_t>(with_cublas)].begin());
  }
  double dot = 0, a2 = 0, b2 = 0;
  for (int i = 0; i < vocab; ++i) {
    dot += double{logits[0][i]} * logits[1][i];
    a2 += double{logits[0][i]} * logits[0][i];
    b2 += double{logits[1][i]} * logits[1][i];
  }
  EXPECT_GT(dot / std::sqrt(a2 * b2), 0.999);
  EXPECT_EQ(std::max_element(logits[0].begin(), logits[0].end()) - logits[0].begin(),
            std::max_element(logits[1].begin(), logits[1].end()) - logits[1].begin());
}

// Bad rows are refused before anything runs, and a refused step changes nothing.
TEST_F(DeviceTest, RejectsBadRows) {
  ASSERT_NO_FATAL_FAILURE(Prepare("stories260K"));
  auto decoder = MakeDecoder(*device_, 4, {}, true, 4);
  ASSERT_NE(decoder, nullptr);
  auto seq = decoder->AddSequence();
  ASSERT_TRUE(seq.ok());
  DeviceRowResult result;
  auto step = [&](std::vector<DeviceRow> rows) {
    std::vector<DeviceRowResult> results(rows.size());
    return decoder->Step(rows, absl::MakeSpan(results)).code();
  };
  const int32_t free_before = decoder->free_pages();
  EXPECT_EQ(step({{*seq, -1, 0, 2.0f}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{*seq, model_->config().vocab_size, 0, 2.0f}}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{*seq, 1, decoder->max_seq_len(), 2.0f}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{*seq + 100, 1, 0, 2.0f}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{*seq, 1, 0, 2.0f}, {*seq, 1, 2, 2.0f}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{*seq, 1, 0, 2.0f},
                  {*seq, 1, 1, 2.0f},
                  {*seq, 1, 2, 2.0f},
                  {*seq, 1, 3, 2.0f},
                  {*seq, 1, 4, 2.0f}}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decoder->free_pages(), free_before);
  EXPECT_TRUE(decoder->Prefill(*seq, std::vector<int32_t>{1, 2, 3}, 0, 2.0f, result).ok());
  decoder->ReleaseSequence(*seq);
  EXPECT_EQ(decoder->free_pages(), free_before);
}

}  // namespace
}  // namespace estuary::cuda
