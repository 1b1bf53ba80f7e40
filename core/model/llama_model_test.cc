#include "core/model/llama_model.h"

#include <cmath>
#include <random>

#include "core/model/generator.h"
#include "core/model/kv_cache.h"
#include "core/model/model_loader.h"
#include "gtest/gtest.h"

namespace estuary {
namespace {

constexpr char kStories260K[] = "models/stories260K";

// Prefill of a whole prompt in one chunk and token-by-token decode must give the same logits:
// the GEMM and GEMV paths and the causal mask agree.
TEST(LlamaModelTest, ChunkedAndStepwiseForwardAgree) {
  auto loaded = LoadModel(kStories260K);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& model = *loaded->model;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383};
  const int vocab = model.config().vocab_size;

  auto cache_a = ContiguousKvCache::Create(model.config(), 16);
  auto cache_b = ContiguousKvCache::Create(model.config(), 16);
  ASSERT_TRUE(cache_a.ok() && cache_b.ok());
  std::vector<float> chunk_logits(vocab), step_logits(vocab);
  ASSERT_TRUE(model.Forward(prompt, 0, *cache_a, absl::MakeSpan(chunk_logits)).ok());
  for (size_t i = 0; i < prompt.size(); ++i) {
    ASSERT_TRUE(model.Forward({prompt[i]}, static_cast<int>(i), *cache_b,
                              absl::MakeSpan(step_logits))
                    .ok());
  }
  for (int i = 0; i < vocab; ++i) EXPECT_NEAR(chunk_logits[i], step_logits[i], 1e-4f) << i;
}

TEST(LlamaModelTest, RejectsBadTokensAndPositions) {
  auto loaded = LoadModel(kStories260K);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& model = *loaded->model;
  auto cache = ContiguousKvCache::Create(model.config(), 4);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits(model.config().vocab_size);
  EXPECT_EQ(model.Forward({100000}, 0, *cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.Forward({1, 2, 3, 4, 5}, 0, *cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GeneratorTest, ValidatesRequests) {
  auto loaded = LoadModel(kStories260K);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  GenerateRequest request;
  EXPECT_EQ(Generate(*loaded->model, request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.prompt_ids = {1, 9999};
  EXPECT_EQ(Generate(*loaded->model, request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.prompt_ids = {1};
  request.sampling.top_p = 2.0f;
  EXPECT_EQ(Generate(*loaded->model, request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GeneratorTest, SeededSamplingIsReproducibleAndStopsAtMaxTokens) {
  auto loaded = LoadModel(kStories260K);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  GenerateRequest request;
  request.prompt_ids = {1, 403, 407, 261, 378};
  request.max_tokens = 20;
  request.ignore_eos = true;
  request.sampling.temperature = 1.0f;
  request.sampling.top_p = 0.9f;
  request.sampling.seed = 1234;
  auto a = Generate(*loaded->model, request);
  auto b = Generate(*loaded->model, request);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->completion_ids, b->completion_ids);
  EXPECT_EQ(a->completion_ids.size(), 20u);
  EXPECT_EQ(a->finish_reason, FinishReason::kLength);
}

TEST(ModelLoaderTest, ConvertsToBf16AndKeepsTheHeadTied) {
  LoadOptions options;
  options.dtype = DType::kBF16;
  auto loaded = LoadModel(kStories260K, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaWeights& w = loaded->model->weights();
  EXPECT_EQ(w.layers[0].wq.dtype(), DType::kBF16);
  EXPECT_EQ(w.lm_head.raw(), w.embedding.raw());
}

TEST(ModelLoaderTest, MissingPathIsNotFound) {
  EXPECT_EQ(LoadModel("/nonexistent/model").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace estuary
