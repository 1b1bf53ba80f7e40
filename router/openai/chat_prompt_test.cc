// The router's chat prompts: where the template comes from (--chat-template, tokenizer_config.json
// in both of its forms, none), request validation with errors naming the field, and tokenizing
// without a second BOS. Uses the real stories260K tokenizer.
#include "router/openai/chat_prompt.h"

#include <filesystem>
#include <fstream>

#include "core/loader/model_metadata.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/openai/api_error.h"

namespace estuary::openai {
namespace {

using ::testing::HasSubstr;

class ChatPromptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto metadata = LoadModelMetadata("models/stories260K");
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    tokenizer_ = std::move(metadata->tokenizer);
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::vector<int32_t> Encode(const std::string& text, bool bos) {
    auto ids = tokenizer_->Encode(text, bos);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::filesystem::path dir_;
};

const nlohmann::json kChat = nlohmann::json::parse(
    R"({"messages":[{"role":"system","content":"Be kind."},{"role":"user","content":"Hi there"}]})");

TEST_F(ChatPromptTest, NoTemplateAnywhereIsNull) {
  auto fn = MakeChatPrompt("models/stories260K", "", *tokenizer_);
  ASSERT_TRUE(fn.ok()) << fn.status();
  EXPECT_FALSE(*fn);
}

TEST_F(ChatPromptTest, TemplateFileRendersAndTokenizesWithOneBos) {
  const std::string file =
      Write("t.jinja",
            "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
            "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}");
  auto fn = MakeChatPrompt("models/stories260K", file, *tokenizer_);
  ASSERT_TRUE(fn.ok()) << fn.status();
  ASSERT_TRUE(*fn);
  auto ids = (*fn)(kChat);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // The template's "<s>" is the one BOS id, followed by the rest encoded without BOS.
  std::vector<int32_t> expected = {tokenizer_->bos_id()};
  for (int32_t id : Encode("system: Be kind.\nuser: Hi there\nassistant:", false))
    expected.push_back(id);
  EXPECT_EQ(*ids, expected);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), tokenizer_->bos_id()), 1);
  // add_generation_prompt false (vLLM's extension) drops the assistant header.
  nlohmann::json body = kChat;
  body["add_generation_prompt"] = false;
  auto without = (*fn)(body);
  ASSERT_TRUE(without.ok());
  EXPECT_LT(without->size(), ids->size());
}

TEST_F(ChatPromptTest, TokenizerConfigTemplateStringAndListForms) {
  const std::string model = dir_.string();
  for (const char* name : {"model.bin", "tokenizer.bin"}) {
    std::filesystem::copy_file(std::filesystem::path("models/stories260K") / name, dir_ / name);
  }
  Write("tokenizer_config.json",
        R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
            "chat_template": "{% for m in messages %}[{{ m.content }}]{{ eos_token }}{% endfor %}"})");
  auto fn = MakeChatPrompt(model, "", *tokenizer_);
  ASSERT_TRUE(fn.ok()) << fn.status();
  ASSERT_TRUE(*fn);
  auto ids = (*fn)(kChat);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, Encode("[Be kind.]</s>[Hi there]</s>", false));

  Write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]})");
  fn = MakeChatPrompt(model, "", *tokenizer_);
  ASSERT_TRUE(fn.ok()) << fn.status();
  ids = (*fn)(kChat);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, Encode("D2", false));

  Write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  fn = MakeChatPrompt(model, "", *tokenizer_);
  ASSERT_FALSE(fn.ok());
  EXPECT_THAT(fn.status().message(), HasSubstr("none named \"default\""));
}

TEST_F(ChatPromptTest, MalformedTemplateFileIsRefusedWithItsPosition) {
  const std::string file = Write("bad.jinja", "ok\n{% for m in messages %}never closed");
  auto fn = MakeChatPrompt("", file, *tokenizer_);
  ASSERT_FALSE(fn.ok());
  EXPECT_THAT(fn.status().message(), HasSubstr("bad.jinja: chat template: line 2, column 4"));
  EXPECT_FALSE(MakeChatPrompt("", (dir_ / "missing.jinja").string(), *tokenizer_).ok());
}

TEST_F(ChatPromptTest, InvalidMessagesNameTheField) {
  auto fn = MakeChatPrompt(
      "", Write("t.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}"), *tokenizer_);
  ASSERT_TRUE(fn.ok());
  const auto error = [&](const char* body) {
    auto ids = (*fn)(nlohmann::json::parse(body));
    EXPECT_FALSE(ids.ok()) << body;
    EXPECT_EQ(HttpStatusOf(ids.status()), 400) << ids.status();
    return ids.ok() ? nlohmann::json() : ErrorJson(ids.status())["error"];
  };
  EXPECT_EQ(error(R"({"messages": []})")["param"], "messages");
  EXPECT_EQ(
      error(
          R"({"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]})")
          ["param"],
      "messages[1].role");
  EXPECT_EQ(error(R"({"messages": [{"role": "user", "content": 5}]})")["param"],
            "messages[0].content");
  EXPECT_EQ(error(R"({"messages": [{"role": "user"}]})")["param"], "messages[0].content");
  EXPECT_EQ(
      error(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})")["param"],
      "messages[0].content[0].type");
  EXPECT_EQ(error(R"({"messages": [{"role": "user", "content": "x"}], "tools": 3})")["param"],
            "tools");
  // Text parts are joined; an assistant turn without content is allowed.
  auto ids = (*fn)(nlohmann::json::parse(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": null}]})"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, Encode("a\nb", false));
}

TEST_F(ChatPromptTest, RaiseExceptionIsA400OnMessages) {
  auto fn = MakeChatPrompt("",
                           Write("t.jinja",
                                 "{% if messages[0].role != 'user' %}{{ raise_exception("
                                 "'Conversation must start with a user message') }}{% endif %}"),
                           *tokenizer_);
  ASSERT_TRUE(fn.ok());
  auto ids = (*fn)(kChat);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(HttpStatusOf(ids.status()), 400);
  const nlohmann::json error = ErrorJson(ids.status())["error"];
  EXPECT_EQ(error["param"], "messages");
  EXPECT_THAT(error["message"].get<std::string>(),
              HasSubstr("Conversation must start with a user message"));
}

}  // namespace
}  // namespace estuary::openai
