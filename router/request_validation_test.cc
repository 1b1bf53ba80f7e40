// PrepareRequest against the stories260K tokenizer: every refusal is INVALID_ARGUMENT and names
// the field and limit; text is tokenized with BOS; max_tokens 0 resolves to the default.

#include "router/request_validation.h"

#include <memory>
#include <string>

#include "core/model/model_loader.h"
#include "gtest/gtest.h"
#include "tests/testing/golden_cases.h"

namespace estuary::router {
namespace {

class RequestValidationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = LoadModel(::estuary::testing::GoldenModelDir("stories260K"));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const LlamaConfig& c = loaded->model->config();
    limits_ = new ModelLimits{c.max_seq_len, c.vocab_size, c.n_layers, {}};
    tokenizer_ = loaded->tokenizer.release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete limits_;
  }

  static estuary::v1::GenerateRequest Text(const std::string& text) {
    estuary::v1::GenerateRequest request;
    request.set_text(text);
    return request;
  }
  // The refusal's message; fails the test unless it is INVALID_ARGUMENT.
  static std::string Refusal(const estuary::v1::GenerateRequest& request) {
    auto prepared = PrepareRequest(request, *tokenizer_, *limits_);
    EXPECT_FALSE(prepared.ok());
    if (prepared.ok()) return "";
    EXPECT_EQ(prepared.status().code(), absl::StatusCode::kInvalidArgument) << prepared.status();
    return std::string(prepared.status().message());
  }

  static Tokenizer* tokenizer_;
  static ModelLimits* limits_;
};
Tokenizer* RequestValidationTest::tokenizer_ = nullptr;
ModelLimits* RequestValidationTest::limits_ = nullptr;

TEST_F(RequestValidationTest, TokenizesTextWithBosAndResolvesMaxTokens) {
  const auto golden = ::estuary::testing::LoadGoldenCases("stories260K");
  ASSERT_FALSE(golden.empty());
  estuary::v1::GenerateRequest request = Text(golden[0].prompt);
  request.mutable_sampling()->add_stop("\n");
  auto prepared = PrepareRequest(request, *tokenizer_, *limits_);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->prompt_ids, golden[0].prompt_ids);
  EXPECT_EQ(prepared->max_tokens, std::min<int>(kDefaultMaxTokens,
                                                limits_->context_length - golden[0].prompt_ids.size()));
  EXPECT_EQ(prepared->sampling.max_tokens(), prepared->max_tokens);
  EXPECT_EQ(prepared->sampling.stop_size(), 0);  // stop strings stay at the router
  EXPECT_EQ(prepared->stop, std::vector<std::string>{"\n"});

  estuary::v1::GenerateRequest tokens;
  for (int32_t id : golden[0].prompt_ids) tokens.mutable_tokens()->add_ids(id);
  tokens.mutable_sampling()->set_max_tokens(7);
  prepared = PrepareRequest(tokens, *tokenizer_, *limits_);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->prompt_ids, golden[0].prompt_ids);
  EXPECT_EQ(prepared->max_tokens, 7);
}

TEST_F(RequestValidationTest, MaxTokensZeroStopsAtTheContext) {
  estuary::v1::GenerateRequest request;
  for (int i = 0; i < limits_->context_length - 10; ++i) request.mutable_tokens()->add_ids(5);
  auto prepared = PrepareRequest(request, *tokenizer_, *limits_);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->max_tokens, 10);
}

TEST_F(RequestValidationTest, RefusesEmptyInput) {
  EXPECT_NE(Refusal(estuary::v1::GenerateRequest()).find("no input"), std::string::npos);
  EXPECT_NE(Refusal(Text("")).find("text is empty"), std::string::npos);
  estuary::v1::GenerateRequest tokens;
  tokens.mutable_tokens();
  EXPECT_NE(Refusal(tokens).find("tokens.ids is empty"), std::string::npos);
}

TEST_F(RequestValidationTest, RefusesTokenIdsOutsideTheVocabulary) {
  estuary::v1::GenerateRequest request;
  request.mutable_tokens()->add_ids(1);
  request.mutable_tokens()->add_ids(limits_->vocab_size);
  const std::string message = Refusal(request);
  EXPECT_NE(message.find("tokens.ids[1]"), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat("[0, ", limits_->vocab_size, ")")), std::string::npos)
      << message;
  request.mutable_tokens()->set_ids(1, -3);
  EXPECT_NE(Refusal(request).find("-3"), std::string::npos);
  request.mutable_tokens()->set_ids(1, 5);
  request.mutable_sampling()->add_stop_token_ids(100000);
  EXPECT_NE(Refusal(request).find("sampling.stop_token_ids[0]"), std::string::npos);
}

TEST_F(RequestValidationTest, RefusesPromptsAndLengthsBeyondTheContext) {
  const int context = limits_->context_length;
  estuary::v1::GenerateRequest full;
  for (int i = 0; i < context; ++i) full.mutable_tokens()->add_ids(5);
  std::string message = Refusal(full);
  EXPECT_NE(message.find(absl::StrCat("context length of ", context)), std::string::npos)
      << message;

  estuary::v1::GenerateRequest request = Text("Once upon a time");
  request.mutable_sampling()->set_max_tokens(context);
  message = Refusal(request);
  EXPECT_NE(message.find("sampling.max_tokens"), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat("context length of ", context)), std::string::npos)
      << message;
  request.mutable_sampling()->set_max_tokens(-1);
  EXPECT_NE(Refusal(request).find("sampling.max_tokens = -1"), std::string::npos);
}

TEST_F(RequestValidationTest, RefusesSamplingOutOfRange) {
  estuary::v1::GenerateRequest request = Text("Once upon a time");
  request.mutable_sampling()->set_temperature(-0.5f);
  EXPECT_NE(Refusal(request).find("temperature"), std::string::npos);
  request = Text("Once upon a time");
  request.mutable_sampling()->set_top_p(1.5f);
  EXPECT_NE(Refusal(request).find("top_p"), std::string::npos);
  request = Text("Once upon a time");
  request.mutable_sampling()->set_top_k(-1);
  EXPECT_NE(Refusal(request).find("top_k"), std::string::npos);
  request = Text("Once upon a time");
  request.mutable_sampling()->set_min_p(2.0f);
  EXPECT_NE(Refusal(request).find("min_p"), std::string::npos);
  request = Text("Once upon a time");
  request.mutable_sampling()->set_repetition_penalty(-1.0f);
  EXPECT_NE(Refusal(request).find("repetition_penalty"), std::string::npos);
}

TEST_F(RequestValidationTest, RefusesBadStopStrings) {
  estuary::v1::GenerateRequest request = Text("Once upon a time");
  for (int i = 0; i <= kMaxStopStrings; ++i) request.mutable_sampling()->add_stop(std::string("x"));
  std::string message = Refusal(request);
  EXPECT_NE(message.find("at most 16"), std::string::npos) << message;
  request = Text("Once upon a time");
  request.mutable_sampling()->add_stop(std::string(kMaxStopStringBytes + 1, 'a'));
  message = Refusal(request);
  EXPECT_NE(message.find("sampling.stop[0]"), std::string::npos) << message;
  EXPECT_NE(message.find("at most 256"), std::string::npos) << message;
  request = Text("Once upon a time");
  request.mutable_sampling()->add_stop(std::string("ok"));
  request.mutable_sampling()->add_stop(std::string());
  EXPECT_NE(Refusal(request).find("sampling.stop[1] is empty"), std::string::npos);
}

TEST_F(RequestValidationTest, RefusesExitThresholdsOutsideTheRange) {
  estuary::v1::GenerateRequest request = Text("Once upon a time");
  request.mutable_exit()->set_threshold(2.5f);
  EXPECT_NE(Refusal(request).find("exit.threshold"), std::string::npos);
  request.mutable_exit()->set_threshold(-1.5f);
  EXPECT_NE(Refusal(request).find("[-1, 2]"), std::string::npos);
  request.mutable_exit()->set_threshold(1.5f);
  EXPECT_TRUE(PrepareRequest(request, *tokenizer_, *limits_).ok());
}

// Unset sampling fields get the served model's defaults (1.0 without a generation_config.json)
// and a random seed; set fields are kept.
TEST_F(RequestValidationTest, FillsSamplingDefaultsAndASeed) {
  auto a = PrepareRequest(Text("x"), *tokenizer_, *limits_);
  auto b = PrepareRequest(Text("x"), *tokenizer_, *limits_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->sampling.has_temperature());
  EXPECT_EQ(a->sampling.temperature(), 1.0f);
  EXPECT_TRUE(a->sampling.has_seed());
  EXPECT_NE(a->sampling.seed(), b->sampling.seed());
  estuary::v1::GenerateRequest greedy = Text("x");
  greedy.mutable_sampling()->set_temperature(0.0f);
  greedy.mutable_sampling()->set_seed(3);
  auto g = PrepareRequest(greedy, *tokenizer_, *limits_);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->sampling.temperature(), 0.0f);
  EXPECT_EQ(g->sampling.seed(), 3u);

  ModelLimits tuned = *limits_;
  absl::StatusOr<GenerationDefaults> defaults =
      ParseGenerationConfig(R"({"temperature": 0.6, "top_p": 0.9, "top_k": 40, "do_sample": true})");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  tuned.defaults = *defaults;
  auto t = PrepareRequest(Text("x"), *tokenizer_, tuned);
  ASSERT_TRUE(t.ok());
  EXPECT_FLOAT_EQ(t->sampling.temperature(), 0.6f);
  EXPECT_FLOAT_EQ(t->sampling.top_p(), 0.9f);
  EXPECT_EQ(t->sampling.top_k(), 40);
}

TEST_F(RequestValidationTest, GenerationConfigErrorsNameTheField) {
  EXPECT_FALSE(ParseGenerationConfig("[1]").ok());
  EXPECT_FALSE(ParseGenerationConfig("{").ok());
  absl::StatusOr<GenerationDefaults> bad = ParseGenerationConfig(R"({"temperature": "hot"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("temperature"), absl::string_view::npos);
  bad = ParseGenerationConfig(R"({"top_p": 3})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("top_p"), absl::string_view::npos);
  EXPECT_TRUE(ParseGenerationConfig(R"({"bos_token_id": 1, "temperature": null})").ok());
}

TEST_F(RequestValidationTest, PenaltiesBiasMinTokensAndLogprobsAreChecked) {
  estuary::v1::GenerateRequest request = Text("x");
  request.mutable_sampling()->set_max_tokens(4);
  request.mutable_sampling()->set_min_tokens(5);
  EXPECT_NE(Refusal(request).find("min_tokens"), std::string::npos);
  request = Text("x");
  (*request.mutable_sampling()->mutable_logit_bias())[limits_->vocab_size] = 1.0f;
  EXPECT_NE(Refusal(request).find("logit_bias"), std::string::npos);
  request = Text("x");
  request.mutable_sampling()->set_presence_penalty(3.0f);
  EXPECT_NE(Refusal(request).find("presence_penalty"), std::string::npos);
  request = Text("x");
  request.mutable_sampling()->set_logprobs(21);
  EXPECT_NE(Refusal(request).find("logprobs"), std::string::npos);
  request = Text("x");
  request.mutable_sampling()->set_logprobs(20);
  (*request.mutable_sampling()->mutable_logit_bias())[3] = -100.0f;
  EXPECT_TRUE(PrepareRequest(request, *tokenizer_, *limits_).ok());
}

}  // namespace
}  // namespace estuary::router
