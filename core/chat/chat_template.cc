#include "core/chat/chat_template.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_lexer.h"
#include "core/chat/jinja_parser.h"
#include "core/common/status_macros.h"

namespace estuary::chat {
namespace {

absl::Status Prefixed(const absl::Status& status) {
  if (status.ok() || IsRaisedByTemplate(status)) return status;
  absl::Status out(status.code(), absl::StrCat("chat template: ", status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

// Text parts joined by "\n"; InvalidArgument naming the part otherwise.
absl::StatusOr<nlohmann::ordered_json> FlattenContent(const nlohmann::ordered_json& content,
                                                      size_t message) {
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const nlohmann::ordered_json& part = content[i];
    const auto where = [&] { return absl::StrCat("messages[", message, "].content[", i, "]"); };
    if (!part.is_object() || !part.contains("type") || part["type"] != "text") {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": only parts of type \"text\" are supported"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ".text must be a string"));
    }
    if (i > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  return nlohmann::ordered_json(std::move(text));
}

}  // namespace

bool IsRaisedByTemplate(const absl::Status& status) {
  return status.GetPayload(kRaisedPayload).has_value();
}

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  absl::StatusOr<std::vector<Token>> tokens = Lex(source);
  if (!tokens.ok()) return Prefixed(tokens.status());
  absl::StatusOr<std::vector<NodePtr>> program = chat::Parse(*tokens);
  if (!program.ok()) return Prefixed(program.status());
  return ChatTemplate(std::make_shared<const std::vector<NodePtr>>(std::move(*program)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatRenderInput& input,
                                                 const RenderLimits& limits) const {
  if (!input.messages.is_array()) return absl::InvalidArgumentError("messages must be a list");
  if (!input.variables.is_object()) {
    return absl::InvalidArgumentError("chat template variables must be an object");
  }
  nlohmann::ordered_json messages = input.messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    nlohmann::ordered_json& m = messages[i];
    if (m.is_object() && m.contains("content") && m["content"].is_array()) {
      ESTUARY_ASSIGN_OR_RETURN(m["content"], FlattenContent(m["content"], i));
    }
  }
  nlohmann::ordered_json variables = input.variables;
  variables["messages"] = std::move(messages);
  variables["add_generation_prompt"] = input.add_generation_prompt;
  variables["bos_token"] = input.bos_token;
  variables["eos_token"] = input.eos_token;
  ESTUARY_ASSIGN_OR_RETURN(Value context, ValueFromJson(variables));
  absl::StatusOr<std::string> text = RenderProgram(*program_, *context.object, limits);
  if (!text.ok()) return Prefixed(text.status());
  return text;
}

}  // namespace estuary::chat
