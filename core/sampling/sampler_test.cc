#include "core/sampling/sampler.h"

#include <cmath>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace estuary {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f}; }

TEST(SamplerTest, GreedyPicksArgmax) {
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler(params);
  auto logits = Logits();
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits), {}, 0).id, 1);
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
      out.push_back(sampler.Sample(absl::MakeSpan(logits), {}, i).id);
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
    EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits), {}, i).id, 1);
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
    counts[sampler.Sample(absl::MakeSpan(logits), {}, i).id]++;
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
    const int32_t t = sampler.Sample(absl::MakeSpan(logits), {}, i).id;
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
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits), history, 0).id, 4);
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

// Logits {1, 3, 2, 0.5, 2.9}: token 1 leads token 4 by 0.1.
TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountOnlyTheOutput) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.presence_penalty = 0.5f;
  // Token 1 in the prompt only: no penalty, still the argmax.
  const std::vector<int32_t> prompt_only = {1, 1, 1};
  auto logits = Logits();
  EXPECT_EQ(Sampler(params).Sample(absl::MakeSpan(logits), prompt_only, 0).id, 1);
  // The same token generated once: 3 - 0.5 < 2.9.
  const std::vector<int32_t> generated = {0, 1};
  logits = Logits();
  EXPECT_EQ(Sampler(params).Sample(absl::MakeSpan(logits), generated, 1).id, 4);
  EXPECT_FLOAT_EQ(logits[1], 2.5f);
  // Frequency: token 4 generated 3 times at 0.1 each (2.9 - 0.3 = 2.6 < 3).
  SamplingParams freq;
  freq.temperature = 0.0f;
  freq.frequency_penalty = 0.1f;
  const std::vector<int32_t> fours = {4, 4, 4};
  logits = Logits();
  EXPECT_EQ(Sampler(freq).Sample(absl::MakeSpan(logits), fours, 3).id, 1);
  EXPECT_FLOAT_EQ(logits[4], 2.6f);
  // Negative penalties favour repeats.
  freq.frequency_penalty = -1.0f;
  logits = Logits();
  EXPECT_EQ(Sampler(freq).Sample(absl::MakeSpan(logits), fours, 1).id, 4);
}

TEST(SamplerTest, LogitBiasIsAddedToTheRawLogits) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.logit_bias = {{3, 5.0f}, {99, 100.0f}};  // an id past the vocabulary is ignored
  auto logits = Logits();
  EXPECT_EQ(Sampler(params).Sample(absl::MakeSpan(logits), {}, 0).id, 3);
  params.logit_bias = {{1, -100.0f}};
  logits = Logits();
  EXPECT_EQ(Sampler(params).Sample(absl::MakeSpan(logits), {}, 0).id, 4);
  EXPECT_FALSE(Sampler(params).greedy());
}

// min_tokens masks the model's end-of-sequence ids and the stop ids, greedy or sampled, until
// that many tokens were generated.
TEST(SamplerTest, MinTokensMasksEndOfSequenceAndStopIds) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.min_tokens = 2;
  params.stop_token_ids = {4};
  Sampler sampler(params, /*eos_ids=*/{1});
  auto logits = Logits();
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits), {}, 1).id, 2);
  logits = Logits();
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits), {}, 2).id, 1);
  SamplingParams hot = params;
  hot.temperature = 5.0f;
  for (int i = 0; i < 2000; ++i) {
    hot.seed = static_cast<uint64_t>(i);
    logits = Logits();
    const int32_t t = Sampler(hot, {1}).Sample(absl::MakeSpan(logits), {}, 0).id;
    ASSERT_TRUE(t != 1 && t != 4) << t;
  }
}

TEST(SamplerTest, LogprobsAreOfTheRawDistribution) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.presence_penalty = 2.0f;  // changes the pick, not the reported distribution
  params.logprobs = 2;
  const std::vector<int32_t> history = {1};
  auto logits = Logits();
  const SampledToken t = Sampler(params).Sample(absl::MakeSpan(logits), history, 1);
  EXPECT_EQ(t.id, 4);
  ASSERT_TRUE(t.logprobs.has_value());
  double total = 0;
  for (float l : Logits()) total += std::exp(static_cast<double>(l));
  EXPECT_NEAR(t.logprobs->logprob, 2.9 - std::log(total), 1e-5);
  ASSERT_EQ(t.logprobs->top.size(), 2u);
  EXPECT_EQ(t.logprobs->top[0].id, 1);
  EXPECT_NEAR(t.logprobs->top[0].logprob, 3.0 - std::log(total), 1e-5);
  EXPECT_EQ(t.logprobs->top[1].id, 4);
  params.logprobs = -1;
  logits = Logits();
  EXPECT_FALSE(Sampler(params).Sample(absl::MakeSpan(logits), history, 1).logprobs.has_value());
  params.logprobs = 0;
  EXPECT_FALSE(Sampler(params).greedy());  // a GPU argmax does not give log-probabilities
}

// The draw of a position depends only on (seed, position): a second Sampler (another process)
// continues the stream of the first one.
TEST(SamplerTest, TheRandomStreamIsAFunctionOfSeedAndPosition) {
  SamplingParams params;
  params.temperature = 1.5f;
  params.seed = 99;
  std::vector<int32_t> one_process, two_processes;
  Sampler whole(params);
  for (int i = 0; i < 64; ++i) {
    auto logits = Logits();
    one_process.push_back(whole.Sample(absl::MakeSpan(logits), {}, i).id);
  }
  Sampler first(params);
  auto logits = Logits();
  two_processes.push_back(first.Sample(absl::MakeSpan(logits), {}, 0).id);
  Sampler rest(params);
  for (int i = 1; i < 64; ++i) {
    logits = Logits();
    two_processes.push_back(rest.Sample(absl::MakeSpan(logits), {}, i).id);
  }
  EXPECT_EQ(one_process, two_processes);
  std::map<int32_t, int> distinct;
  for (int32_t t : one_process) ++distinct[t];
  EXPECT_GE(distinct.size(), 3u);  // positions do draw differently
}

TEST(SamplerTest, ValidateNamesTheNewFields) {
  auto message = [](SamplingParams p) { return std::string(p.Validate().message()); };
  SamplingParams p;
  p.presence_penalty = 2.5f;
  EXPECT_NE(message(p).find("presence_penalty"), std::string::npos);
  p = SamplingParams();
  p.frequency_penalty = -3.0f;
  EXPECT_NE(message(p).find("frequency_penalty"), std::string::npos);
  p = SamplingParams();
  p.min_tokens = -1;
  EXPECT_NE(message(p).find("min_tokens"), std::string::npos);
  p = SamplingParams();
  p.logprobs = 21;
  EXPECT_NE(message(p).find("logprobs"), std::string::npos);
  p = SamplingParams();
  p.logit_bias = {{3, 101.0f}};
  EXPECT_NE(message(p).find("logit_bias"), std::string::npos);
}

}  // namespace
}  // namespace estuary
