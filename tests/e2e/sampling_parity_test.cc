// Sampling parity through a real cluster (router, prefill and decode processes, stories260K):
// presence and frequency penalties, logit bias, min_tokens and seeded sampling give exactly the
// tokens of the in-process reference generator (core/model/generator.h) with the same
// parameters, whether the first token is sampled by the prefill worker (disaggregated) or by
// the decode worker (local prefill); log-probabilities come back for every token, the first
// one included; a request without a temperature samples (1.0, not greedy) and one without a
// seed gets a fresh one.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/model/generator.h"
#include "core/model/model_loader.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "gtest/gtest.h"
#include "rpc/worker_request.h"
#include "tests/e2e/cluster.h"
#include "tests/testing/golden_cases.h"

namespace estuary::testing {
namespace {

constexpr char kModel[] = "stories260K";
constexpr int kMaxTokens = 48;

struct Mode {
  const char* name;
  std::vector<std::string> router_flags;
};

class SamplingParityTest : public ::testing::TestWithParam<Mode> {
 protected:
  static void SetUpTestSuite() {
    auto loaded = LoadModel(GoldenModelDir(kModel));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = loaded->model.release();
    cases_ = new std::vector<GoldenCase>(LoadGoldenCases(kModel));
    ASSERT_FALSE(cases_->empty());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete cases_;
  }
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(Spec(kModel, 1, 1, 1, 1, GetParam().router_flags));
  }

  // The in-process reference: the same parameters through the plain generator.
  static std::vector<int32_t> Reference(const std::vector<int32_t>& prompt,
                                        const SamplingParams& sampling, int max_tokens) {
    GenerateRequest request;
    request.prompt_ids = prompt;
    request.max_tokens = max_tokens;
    request.sampling = sampling;
    absl::StatusOr<GenerateResult> result = ::estuary::Generate(*model_, request);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->completion_ids : std::vector<int32_t>();
  }

  Generated Run(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                int max_tokens) {
    estuary::v1::GenerateRequest request;
    for (int32_t id : prompt) request.mutable_tokens()->add_ids(id);
    rpc::SamplingToProto(sampling, max_tokens, request.mutable_sampling());
    Generated out = Generate(cluster_->stub(), request);
    EXPECT_TRUE(out.status.ok()) << out.status.error_message() << "\n" << cluster_->Logs();
    return out;
  }

  static LlamaModel* model_;
  static std::vector<GoldenCase>* cases_;
  std::unique_ptr<Cluster> cluster_;
};
LlamaModel* SamplingParityTest::model_ = nullptr;
std::vector<GoldenCase>* SamplingParityTest::cases_ = nullptr;

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST_P(SamplingParityTest, PenaltiesBiasAndSeedsMatchTheReference) {
  const GoldenCase& c = (*cases_)[0];
  std::vector<SamplingParams> variants;
  SamplingParams penalties = Greedy();
  penalties.presence_penalty = 1.5f;
  penalties.frequency_penalty = 0.5f;
  variants.push_back(penalties);
  SamplingParams bias = Greedy();
  bias.logit_bias = {{c.completion_ids[1], -100.0f}, {c.completion_ids[3], 4.0f}};
  variants.push_back(bias);
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.seed = 1234;
  variants.push_back(seeded);
  SamplingParams mixed;
  mixed.temperature = 0.7f;
  mixed.repetition_penalty = 1.2f;
  mixed.frequency_penalty = 0.3f;
  mixed.top_k = 40;
  mixed.seed = 5;
  variants.push_back(mixed);

  const std::vector<int32_t> plain = Reference(c.prompt_ids, Greedy(), kMaxTokens);
  for (size_t v = 0; v < variants.size(); ++v) {
    const std::vector<int32_t> want = Reference(c.prompt_ids, variants[v], kMaxTokens);
    EXPECT_NE(want, plain) << "variant " << v << " changed nothing";
    const Generated got = Run(c.prompt_ids, variants[v], kMaxTokens);
    EXPECT_EQ(got.ids, want) << "variant " << v;
  }
}

// A case whose greedy story ends with EOS: min_tokens past that point keeps it going, exactly
// as the reference does.
TEST_P(SamplingParityTest, MinTokensKeepsGoingPastTheEndOfTheStory) {
  const int context = model_->config().max_seq_len;
  for (const GoldenCase& c : *cases_) {
    const int room = context - static_cast<int>(c.prompt_ids.size()) - 64;
    const std::vector<int32_t> plain = Reference(c.prompt_ids, Greedy(), room);
    if (static_cast<int>(plain.size()) >= room) continue;  // ran to max_tokens: no EOS
    SamplingParams longer = Greedy();
    longer.min_tokens = static_cast<int>(plain.size()) + 8;
    const int max_tokens = longer.min_tokens + 8;
    const std::vector<int32_t> want = Reference(c.prompt_ids, longer, max_tokens);
    ASSERT_GE(want.size(), static_cast<size_t>(longer.min_tokens));
    EXPECT_EQ(Run(c.prompt_ids, longer, max_tokens).ids, want) << "case " << c.index;
    return;
  }
  FAIL() << "no golden case of " << kModel << " ends early at EOS";
}

TEST_P(SamplingParityTest, LogprobsComeBackForEveryTokenTheFirstIncluded) {
  const GoldenCase& c = (*cases_)[1];
  SamplingParams asked = Greedy();
  asked.logprobs = 5;
  const Generated got = Run(c.prompt_ids, asked, kMaxTokens);
  ASSERT_FALSE(got.ids.empty());
  EXPECT_EQ(got.ids, Reference(c.prompt_ids, Greedy(), kMaxTokens));
  ASSERT_EQ(got.logprobs.size(), got.ids.size());
  for (size_t i = 0; i < got.ids.size(); ++i) {
    const estuary::v1::TokenLogprobs& lp = got.logprobs[i];
    ASSERT_EQ(lp.top_size(), 5) << "token " << i;
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(lp.top(0).token_id(), got.ids[i]) << "token " << i;
    EXPECT_FLOAT_EQ(lp.logprob(), lp.top(0).logprob()) << "token " << i;
    double mass = 0;
    for (int k = 0; k < lp.top_size(); ++k) {
      EXPECT_LE(lp.top(k).logprob(), 0.0f);
      if (k > 0) {
        EXPECT_GE(lp.top(k - 1).logprob(), lp.top(k).logprob());
      }
      mass += std::exp(static_cast<double>(lp.top(k).logprob()));
    }
    EXPECT_LE(mass, 1.0 + 1e-4);
  }
  // Not asked: none.
  EXPECT_TRUE(Run(c.prompt_ids, Greedy(), 8).logprobs.empty());
}

// No temperature: 1.0 (OpenAI's and vLLM's default), so the output is sampled; no seed: each
// request draws its own.
TEST_P(SamplingParityTest, UnsetTemperatureSamplesAndUnseededRequestsDiffer) {
  const GoldenCase& c = (*cases_)[2 % cases_->size()];
  estuary::v1::GenerateRequest request;
  for (int32_t id : c.prompt_ids) request.mutable_tokens()->add_ids(id);
  request.mutable_sampling()->set_max_tokens(kMaxTokens);
  request.mutable_sampling()->set_ignore_eos(true);
  const Generated a = Generate(cluster_->stub(), request);
  const Generated b = Generate(cluster_->stub(), request);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_NE(a.ids, b.ids);
  EXPECT_NE(a.ids, Reference(c.prompt_ids, Greedy(), kMaxTokens));
  request.mutable_sampling()->set_seed(77);
  EXPECT_EQ(Generate(cluster_->stub(), request).ids, Generate(cluster_->stub(), request).ids);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, SamplingParityTest,
    ::testing::Values(Mode{"disaggregated", {}},
                      Mode{"local_prefill", {"--local-prefill-max-tokens", "100000"}}),
    [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace estuary::testing
