#include "router/openai/chat_prompt.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/chat/chat_template.h"
#include "core/common/status_macros.h"
#include "router/openai/api_error.h"
#include "router/openai/request_fields.h"

namespace estuary::openai {
namespace {

constexpr size_t kMaxTemplateFileBytes = size_t{4} << 20;

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (size > kMaxTemplateFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is larger than ", kMaxTemplateFileBytes, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  return text.str();
}

// bos_token / eos_token: a string, or {"content": "..."} (AddedToken form).
std::string SpecialToken(const nlohmann::json& config, const char* name) {
  const auto it = config.find(name);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

struct Prompt {
  chat::ChatTemplate chat_template;
  std::string bos_token;
  std::string eos_token;
  const Tokenizer* tokenizer;
};

absl::Status ValidateMessages(const nlohmann::json& messages) {
  if (!messages.is_array() || messages.empty()) {
    return InvalidField("messages", "must be a non-empty list of messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return InvalidField(at, "must be an object with role and content");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return InvalidField(at + ".role", "must be one of system, user, assistant, tool");
    }
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return InvalidField(
          at + ".role",
          absl::StrCat("must be one of system, user, assistant, tool (got \"", r, "\")"));
    }
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (r == "assistant") continue;  // an assistant turn may carry only tool_calls
      return InvalidField(at + ".content", "is required");
    }
    if (content->is_string()) continue;
    if (!content->is_array())
      return InvalidField(at + ".content", "must be a string or a list of text parts");
    for (size_t j = 0; j < content->size(); ++j) {
      const nlohmann::json& part = (*content)[j];
      const std::string part_at = absl::StrCat(at, ".content[", j, "]");
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
        return InvalidField(part_at, "must be an object with a type");
      }
      if (part["type"] != "text") {
        return InvalidField(part_at + ".type", "only \"text\" parts are supported");
      }
      if (!part.contains("text") || !part["text"].is_string()) {
        return InvalidField(part_at + ".text", "must be a string");
      }
    }
  }
  return absl::OkStatus();
}

// The body's JSON (key order already lost by the HTTP parser) in the renderer's ordered form.
nlohmann::ordered_json Ordered(const nlohmann::json& value) {
  return nlohmann::ordered_json::parse(
      value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

absl::StatusOr<std::vector<int32_t>> Render(const Prompt& prompt, const nlohmann::json& body) {
  const nlohmann::json* messages = Field(body, "messages");
  ESTUARY_RETURN_IF_ERROR(ValidateMessages(messages ? *messages : nlohmann::json()));
  chat::ChatRenderInput input;
  input.messages = Ordered(*messages);
  // vLLM's extensions: add_generation_prompt (default true) and chat_template_kwargs.
  ESTUARY_ASSIGN_OR_RETURN(input.add_generation_prompt,
                           BoolField(body, "add_generation_prompt", true));
  if (const nlohmann::json* kwargs = Field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return InvalidField("chat_template_kwargs", "must be an object");
    input.variables = Ordered(*kwargs);
  }
  if (const nlohmann::json* tools = Field(body, "tools")) {
    if (!tools->is_array()) return InvalidField("tools", "must be a list");
    input.variables["tools"] = Ordered(*tools);
  }
  input.bos_token = prompt.bos_token;
  input.eos_token = prompt.eos_token;
  absl::StatusOr<std::string> text = prompt.chat_template.Render(input);
  if (!text.ok()) {
    // The template's raise_exception is about the conversation (say, roles that must alternate).
    if (chat::IsRaisedByTemplate(text.status()))
      return InvalidField("messages", text.status().message());
    return absl::InvalidArgumentError(
        absl::StrCat("the chat template failed on these messages: ", text.status().message()));
  }
  // The template writes BOS itself when the model wants one; never add a second. A textual BOS
  // at the start becomes the BOS id (tokenizers without added-token matching would spell it).
  std::vector<int32_t> ids;
  std::string_view rest = *text;
  const int32_t bos = prompt.tokenizer->bos_id();
  if (bos >= 0 && !prompt.bos_token.empty() &&
      rest.substr(0, prompt.bos_token.size()) == prompt.bos_token) {
    ids.push_back(bos);
    rest.remove_prefix(prompt.bos_token.size());
  }
  absl::StatusOr<std::vector<int32_t>> encoded = prompt.tokenizer->Encode(rest, /*add_bos=*/false);
  if (!encoded.ok()) return InvalidField("messages", encoded.status().message());
  ids.insert(ids.end(), encoded->begin(), encoded->end());
  return ids;
}

}  // namespace

absl::StatusOr<ChatPromptFn> MakeChatPrompt(const std::string& model_dir,
                                            const std::string& template_file,
                                            const Tokenizer& tokenizer) {
  nlohmann::json config = nlohmann::json::object();
  const std::string config_path =
      (std::filesystem::path(model_dir) / "tokenizer_config.json").string();
  if (!model_dir.empty() && std::filesystem::exists(config_path)) {
    ESTUARY_ASSIGN_OR_RETURN(std::string text, ReadText(config_path));
    config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, " is not a JSON object"));
    }
  }
  std::string source, origin;
  if (!template_file.empty()) {
    ESTUARY_ASSIGN_OR_RETURN(source, ReadText(template_file));
    origin = template_file;
  } else if (const auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    origin = config_path + " chat_template";
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      bool found = false;
      for (const nlohmann::json& entry : *it) {
        if (entry.is_object() && entry.contains("name") && entry["name"] == "default" &&
            entry.contains("template") && entry["template"].is_string()) {
          source = entry["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) {
        return absl::InvalidArgumentError(absl::StrCat(
            origin, " lists templates but none named \"default\": pass --chat-template FILE"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(origin, " must be a string or a list"));
    }
  } else {
    return ChatPromptFn();
  }
  absl::StatusOr<chat::ChatTemplate> parsed = chat::ChatTemplate::Parse(source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", parsed.status().message()));
  }
  std::string bos = SpecialToken(config, "bos_token"), eos = SpecialToken(config, "eos_token");
  if (!config.contains("bos_token") && tokenizer.bos_id() >= 0) bos = "<s>";
  if (!config.contains("eos_token") && !tokenizer.eos_ids().empty()) eos = "</s>";
  auto prompt = std::make_shared<const Prompt>(Prompt{std::move(*parsed), bos, eos, &tokenizer});
  return ChatPromptFn([prompt](const nlohmann::json& body) { return Render(*prompt, body); });
}

}  // namespace estuary::openai
