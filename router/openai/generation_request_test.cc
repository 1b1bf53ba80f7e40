// The OpenAI request bodies -> GenerateRequests: defaults, every prompt form, n, the fields
// refused as not implemented, and errors that name the field.
#include "router/openai/generation_request.h"

#include <optional>

#include "gtest/gtest.h"
#include "router/openai/api_error.h"

namespace estuary::openai {
namespace {

using json = nlohmann::json;

GenerationRequest MustParse(const json& body) {
  absl::StatusOr<GenerationRequest> parsed = ParseCompletionRequest(body);
  EXPECT_TRUE(parsed.ok()) << parsed.status() << " for " << body.dump();
  return parsed.ok() ? *parsed : GenerationRequest();
}

// The "param" an error names, and its HTTP status.
std::pair<std::string, int> ErrorOf(const json& body) {
  absl::StatusOr<GenerationRequest> parsed = ParseCompletionRequest(body);
  EXPECT_FALSE(parsed.ok()) << body.dump();
  if (parsed.ok()) return {"", 200};
  const json error = ErrorJson(parsed.status());
  return {error["error"]["param"].is_string() ? error["error"]["param"].get<std::string>() : "",
          HttpStatusOf(parsed.status())};
}

TEST(CompletionRequestTest, DefaultsAreOpenAis) {
  const GenerationRequest r = MustParse({{"prompt", "Once upon a time"}});
  ASSERT_EQ(r.choices.size(), 1u);
  const estuary::v1::GenerateRequest& c = r.choices[0];
  EXPECT_EQ(c.text(), "Once upon a time");
  // Unset sampling fields stay unset: the router fills them from generation_config.json or
  // OpenAI's defaults (router/generation_defaults.h).
  EXPECT_FALSE(c.sampling().has_temperature());
  EXPECT_EQ(c.sampling().top_p(), 0.0f);
  EXPECT_FALSE(c.sampling().has_logprobs());
  EXPECT_EQ(c.sampling().max_tokens(), kDefaultCompletionMaxTokens);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.n, 1);
}

TEST(CompletionRequestTest, UnseededRequestsLeaveTheSeedToTheRouterAndASeedIsKept) {
  const GenerationRequest a = MustParse({{"prompt", "x"}, {"n", 2}});
  EXPECT_FALSE(a.choices[0].sampling().has_seed());
  EXPECT_FALSE(a.choices[1].sampling().has_seed());
  const GenerationRequest s = MustParse({{"prompt", "x"}, {"seed", 7}});
  EXPECT_EQ(s.choices[0].sampling().seed(), 7u);
}

TEST(CompletionRequestTest, EveryPromptFormAndNMakeChoicesInOpenAisOrder) {
  EXPECT_EQ(MustParse({{"prompt", json::array({1, 2, 3})}}).choices[0].tokens().ids_size(), 3);
  const GenerationRequest lists =
      MustParse({{"prompt", json::array({json::array({1, 2}), json::array({1, 5, 6})})},
                 {"n", 2},
                 {"seed", 10}});
  ASSERT_EQ(lists.choices.size(), 4u);
  EXPECT_EQ(lists.choices[0].tokens().ids_size(), 2);
  EXPECT_EQ(lists.choices[1].tokens().ids_size(), 2);
  EXPECT_EQ(lists.choices[2].tokens().ids_size(), 3);
  EXPECT_EQ(lists.choices[1].sampling().seed(), 11u);  // sample k of the request: seed + k
  const GenerationRequest strings = MustParse({{"prompt", json::array({"a", "b"})}});
  ASSERT_EQ(strings.choices.size(), 2u);
  EXPECT_EQ(strings.choices[1].text(), "b");
}

TEST(CompletionRequestTest, SamplingFieldsAndExtensionsArePassedOn) {
  const GenerationRequest r = MustParse({{"prompt", "x"},
                                         {"temperature", 0},
                                         {"top_p", 0.5},
                                         {"top_k", -1},
                                         {"min_p", 0.1},
                                         {"max_tokens", 40},
                                         {"stop", "\n"},
                                         {"stop_token_ids", {2}},
                                         {"ignore_eos", true},
                                         {"repetition_penalty", 1.1},
                                         {"exit_threshold", 0.8},
                                         {"stream", true},
                                         {"stream_options", {{"include_usage", true}}},
                                         {"user", "someone"},
                                         {"an_unknown_field", {1, 2}}});
  const estuary::v1::SamplingParams& s = r.choices[0].sampling();
  EXPECT_EQ(s.temperature(), 0.0f);
  EXPECT_EQ(s.top_p(), 0.5f);
  EXPECT_EQ(s.top_k(), 0);
  EXPECT_FLOAT_EQ(s.min_p(), 0.1f);
  EXPECT_EQ(s.max_tokens(), 40);
  ASSERT_EQ(s.stop_size(), 1);
  EXPECT_EQ(s.stop(0), "\n");
  EXPECT_EQ(s.stop_token_ids(0), 2);
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(r.choices[0].exit().threshold(), 0.8f);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(CompletionRequestTest, ErrorsNameTheField) {
  EXPECT_EQ(ErrorOf({{"max_tokens", 5}}), std::make_pair(std::string("prompt"), 400));
  EXPECT_EQ(ErrorOf({{"prompt", 5}}).first, "prompt");
  EXPECT_EQ(ErrorOf({{"prompt", json::array()}}).first, "prompt");
  EXPECT_EQ(ErrorOf({{"prompt", {1, -2}}}).first, "prompt");
  EXPECT_EQ(ErrorOf({{"prompt", {json::array({1}), 7}}}).first, "prompt[1]");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"temperature", "hot"}}).first, "temperature");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"temperature", 2.5}}).first, "temperature");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"max_tokens", 0}}).first, "max_tokens");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"max_tokens", 1.5}}).first, "max_tokens");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"max_tokens", 1e300}}).first, "max_tokens");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"n", 0}}).first, "n");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"stop", {1}}}).first, "stop");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"stream", "yes"}}).first, "stream");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}).first,
            "stream_options");
  EXPECT_EQ(ErrorOf({{"prompt", json::array({"a", "b", "c"})}, {"n", 16}}).first, "n");
  EXPECT_EQ(ErrorOf(json::array({1})).first, "body");
}

TEST(CompletionRequestTest, PenaltiesBiasMinTokensAndLogprobsArePassedOn) {
  const GenerationRequest r = MustParse({{"prompt", "x"},
                                         {"presence_penalty", 0.5},
                                         {"frequency_penalty", -1.25},
                                         {"logit_bias", {{"5", 100}, {"7", -3.5}}},
                                         {"min_tokens", 4},
                                         {"logprobs", 3}});
  const estuary::v1::SamplingParams& s = r.choices[0].sampling();
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -1.25f);
  ASSERT_EQ(s.logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(s.logit_bias().at(5), 100.0f);
  EXPECT_FLOAT_EQ(s.logit_bias().at(7), -3.5f);
  EXPECT_EQ(s.min_tokens(), 4);
  EXPECT_EQ(s.logprobs(), 3);
  EXPECT_EQ(r.logprobs, 3);
  // Chat's spelling: logprobs: true with top_logprobs.
  const GenerationRequest chat = MustParse({{"prompt", "x"}, {"logprobs", true}, {"top_logprobs", 2}});
  EXPECT_EQ(chat.logprobs, 2);
  EXPECT_EQ(MustParse({{"prompt", "x"}, {"logprobs", false}}).logprobs, -1);
  EXPECT_EQ(MustParse({{"prompt", "x"}, {"echo", true}}).echo, true);
}

TEST(CompletionRequestTest, NewFieldsNameTheirErrors) {
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"presence_penalty", 2.5}}).first, "presence_penalty");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"frequency_penalty", "lots"}}).first, "frequency_penalty");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"logit_bias", {{"five", 1}}}}).first, "logit_bias[\"five\"]");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"logit_bias", {{"5", 101}}}}).first, "logit_bias[\"5\"]");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"logit_bias", json::array()}}).first, "logit_bias");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"min_tokens", -1}}).first, "min_tokens");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"logprobs", 21}}).first, "logprobs");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"top_logprobs", 3}}).first, "top_logprobs");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"echo", true}, {"logprobs", 1}}).first, "echo");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"best_of", 2}}).first, "best_of");
  MustParse({{"prompt", "x"}, {"logit_bias", json::object()}, {"logprobs", nullptr}});
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"exit_mode", "fast"}}).first, "exit_mode");
  EXPECT_EQ(ErrorOf({{"prompt", "x"}, {"exit_mode", 2}}).first, "exit_mode");
}

// The exit mode: absent leaves the decode worker's default, otherwise lossy or lossless.
TEST(CompletionRequestTest, ExitModeIsPassedOn) {
  EXPECT_EQ(MustParse({{"prompt", "x"}}).choices[0].exit().mode(),
            estuary::v1::EXIT_MODE_UNSPECIFIED);
  EXPECT_EQ(MustParse({{"prompt", "x"}, {"exit_mode", "lossless"}}).choices[0].exit().mode(),
            estuary::v1::EXIT_MODE_LOSSLESS);
  EXPECT_EQ(MustParse({{"prompt", "x"}, {"exit_mode", "lossy"}}).choices[0].exit().mode(),
            estuary::v1::EXIT_MODE_LOSSY);
}

}  // namespace
}  // namespace estuary::openai
