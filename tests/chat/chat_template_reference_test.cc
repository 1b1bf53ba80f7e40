// core/chat's renderer against @huggingface/jinja (the renderer Hugging Face tooling uses),
// byte for byte: every published model template in tests/chat/templates with every message
// case in tests/chat/cases.json. reference_render.mjs renders them in node; this test renders
// the same with ChatTemplate and compares, including that a case the reference refuses (such as
// Mistral's alternating-roles check) fails here too, with the template's own message. The
// reference is installed from package-lock.json on first use; without node or npm the test
// skips, saying why.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "core/chat/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace estuary::chat {
namespace {

using ::estuary::testing::RunProcess;
using Json = nlohmann::ordered_json;

constexpr char kDir[] = "tests/chat";

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A skip reason when the reference renderer cannot be had.
std::string InstallReference() {
  if (::access("/usr/bin/node", X_OK) != 0) return "no node (apt-get install nodejs npm)";
  auto installed =
      RunProcess({"/bin/bash", "scripts/npm_install_once.sh", kDir}, absl::Minutes(7));
  if (!installed.ok() || installed->exit_code != 0) {
    return "npm could not install @huggingface/jinja (no registry reachable?)";
  }
  return "";
}

TEST(ChatTemplateReferenceTest, EveryTemplateAndCaseRendersAsHuggingFaceJinjaDoes) {
  const std::string skip = InstallReference();
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto ran =
      RunProcess({"/usr/bin/node", std::string(kDir) + "/reference_render.mjs"}, absl::Minutes(1));
  ASSERT_TRUE(ran.ok()) << ran.status();
  ASSERT_EQ(ran->exit_code, 0) << ran->err;
  const Json reference = Json::parse(ran->out);
  const Json cases = Json::parse(ReadFile(std::string(kDir) + "/cases.json"));

  int compared = 0, refused = 0;
  for (const auto& [name, results] : reference.items()) {
    const std::string source = ReadFile(std::string(kDir) + "/templates/" + name + ".jinja");
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    for (const Json& c : cases["cases"]) {
      const std::string case_name = c["name"];
      SCOPED_TRACE(name + " / " + case_name);
      ChatRenderInput input;
      input.messages = c["messages"];
      input.add_generation_prompt = c["add_generation_prompt"];
      input.variables = cases["variables"];
      if (c.contains("variables")) input.variables.update(c["variables"]);
      input.bos_token = input.variables["bos_token"];
      input.eos_token = input.variables["eos_token"];
      absl::StatusOr<std::string> ours = parsed->Render(input);
      const Json& expected = results.at(case_name);
      ++compared;
      if (expected["ok"]) {
        ASSERT_TRUE(ours.ok()) << ours.status();
        EXPECT_EQ(*ours, expected["text"].get<std::string>());
      } else {
        ++refused;
        ASSERT_FALSE(ours.ok()) << "rendered where the reference failed with " << expected["error"]
                                << ":\n"
                                << *ours;
        EXPECT_EQ(ours.status().code(), absl::StatusCode::kInvalidArgument);
        if (IsRaisedByTemplate(ours.status())) {
          EXPECT_EQ(ours.status().message(), expected["error"].get<std::string>());
        }
      }
    }
  }
  // The matrix is what it claims: all templates, and refusals among the cases.
  EXPECT_GE(reference.size(), 9u);
  EXPECT_GE(compared, 9 * 13);
  EXPECT_GT(refused, 0);
  EXPECT_FALSE(reference["mistral-instruct-v0.1"]["roles_do_not_alternate"]["ok"]);
  std::printf("compared %d renders with @huggingface/jinja (%d refused by both)\n", compared,
              refused);
}

}  // namespace
}  // namespace estuary::chat
