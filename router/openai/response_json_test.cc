// The answers' JSON: OpenAI's shapes, usage counting each prompt once, SSE framing, and JSON
// that never fails to print (invalid UTF-8 is replaced).
#include "router/openai/response_json.h"

#include "gtest/gtest.h"

namespace estuary::openai {
namespace {

using json = nlohmann::json;

ChoiceResult Result(std::string text, int prompt, int completion, double layers) {
  ChoiceResult r;
  r.text = std::move(text);
  r.finish_reason = "length";
  r.usage.set_prompt_tokens(prompt);
  r.usage.set_completion_tokens(completion);
  r.usage.set_mean_backbone_layers(layers);
  return r;
}

TEST(ResponseJsonTest, CompletionBodyAndUsage) {
  ResponseEnvelope e;
  e.id = "cmpl-1";
  e.model = "m";
  e.n = 2;
  e.num_layers = 12;
  const json body = FullBody(e, {Result("a", 5, 4, 3.0), Result("b", 5, 2, 6.0)});
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][1]["text"], "b");
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5);  // one prompt, two samples
  EXPECT_EQ(body["usage"]["completion_tokens"], 6);
  EXPECT_EQ(body["usage"]["total_tokens"], 11);
  EXPECT_DOUBLE_EQ(body["usage"]["estuary"]["mean_backbone_layers"].get<double>(), 4.0);
  EXPECT_FALSE(body["choices"][0].contains("token_ids"));
  EXPECT_FALSE(body["usage"]["estuary"].contains("draft_tokens"));  // no lossless choice

  // Lossless choices add up their drafts.
  std::vector<ChoiceResult> lossless = {Result("a", 5, 4, 12.0), Result("b", 5, 2, 12.0)};
  lossless[0].usage.set_draft_tokens(5);
  lossless[0].usage.set_accepted_tokens(4);
  lossless[1].usage.set_draft_tokens(3);
  lossless[1].usage.set_accepted_tokens(1);
  const json counted = FullBody(e, lossless);
  EXPECT_EQ(counted["usage"]["estuary"]["draft_tokens"], 8);
  EXPECT_EQ(counted["usage"]["estuary"]["accepted_tokens"], 5);
}

TEST(ResponseJsonTest, ChatShapes) {
  ResponseEnvelope e;
  e.endpoint = Endpoint::kChat;
  const json body = FullBody(e, {Result("hi", 3, 1, 1.0)});
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "hi");
  const json first = DeltaChunk(e, 0, "h", {}, /*role_first=*/true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "h");
  EXPECT_FALSE(DeltaChunk(e, 0, "i", {}, false)["choices"][0]["delta"].contains("role"));
  const json last = FinishChunk(e, 0, "stop");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const json usage = UsageChunk(e, {Result("hi", 3, 1, 1.0)});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 4);
}

TEST(ResponseJsonTest, SseFramingAndInvalidUtf8) {
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  const std::string event = SseEvent(json{{"text", std::string("a\xff")}});
  EXPECT_NE(event.find("\xef\xbf\xbd"), std::string::npos);
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(ResponseJsonTest, FinishReasons) {
  EXPECT_EQ(FinishReasonName(estuary::v1::FINISH_REASON_EOS), "stop");
  EXPECT_EQ(FinishReasonName(estuary::v1::FINISH_REASON_STOP_STRING), "stop");
  EXPECT_EQ(FinishReasonName(estuary::v1::FINISH_REASON_STOP_TOKEN), "stop");
  EXPECT_EQ(FinishReasonName(estuary::v1::FINISH_REASON_LENGTH), "length");
}

}  // namespace
}  // namespace estuary::openai
