#include "core/sampling/sampler.h"

#include <map>

#include "gtest/gtest.h"

namespace estuary {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f}; }

TEST(SamplerTest, GreedyPicksArgmax) {
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler(params);
  auto logits = Logits();
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits), {}), 1);
}

// greedy() holds exactly when Sample is the argmax of the raw logits: a GPU engine then uses the
// device's argmax and downloads no logits.
TEST(SamplerTest, GreedyMeansArgmaxOfTheRawLogits) {
  SamplingParams params;
  params.temperature = 0.0f;
  EXPECT_TRUE(Sampler(params).greedy());
  params.repetition_penalty = 1.3f;  // changes the logits first
  EXPECT_FALSE(Sampler(params).greedy());
  params.repetition_penalty = 1.0f;
  params.temperature = 0.7f;
  EXPECT_FALSE(Sampler(params).greedy());
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 42;
  auto draw = [](SamplingParams p) {
    Sampler sampler(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto logits = Logits();
      out.push_back(sampler.Sample(absl::MakeSpan(logits), {}));
    }
    return out;
  };
  EXPECT_EQ(draw(params), draw(params));
  SamplingParams other = params;
  other.seed = 43;
  EXPECT_NE(draw(params), draw(other));
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplingParams params;
  params.top_k = 1;
  params.seed = 7;
  Sampler sampler(params);
  for (int i = 0; i < 20; ++i) {
    auto logits = Logits();
    EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits), {}), 1);
  }
}

TEST(SamplerTest, TopPKeepsOnlyTheNucleus) {
  SamplingParams params;
  params.top_p = 0.5f;  // token 1 (p~0.39) and token 4 (p~0.36) make the nucleus
  params.seed = 1;
  Sampler sampler(params);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 400; ++i) {
    auto logits = Logits();
    counts[sampler.Sample(absl::MakeSpan(logits), {})]++;
  }
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[4], 0);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  SamplingParams params;
  params.min_p = 0.5f;  // keeps tokens with p >= half of the best: 1, 4, 2
  params.seed = 3;
  Sampler sampler(params);
  for (int i = 0; i < 300; ++i) {
    auto logits = Logits();
    const int32_t t = sampler.Sample(absl::MakeSpan(logits), {});
    EXPECT_TRUE(t == 1 || t == 4 || t == 2) << t;
  }
}

TEST(SamplerTest, RepetitionPenaltyChangesTheArgmax) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 2.0f;
  Sampler sampler(params);
  auto logits = Logits();
  const std::vector<int32_t> history = {1};
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits), history), 4);
}

TEST(SamplerTest, ValidateNamesTheField) {
  SamplingParams params;
  params.top_p = 0.0f;
  const absl::Status status = params.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("top_p"), absl::string_view::npos);
  params = SamplingParams();
  params.temperature = -1.0f;
  EXPECT_NE(params.Validate().message().find("temperature"), absl::string_view::npos);
  EXPECT_TRUE(SamplingParams().Validate().ok());
}

TEST(SamplerTest, StopTokens) {
  SamplingParams params;
  params.stop_token_ids = {5, 9};
  Sampler sampler(params);
  EXPECT_TRUE(sampler.IsStopToken(9));
  EXPECT_FALSE(sampler.IsStopToken(4));
}

}  // namespace
}  // namespace estuary
