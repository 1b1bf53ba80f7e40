#pragma once
// A model's chat template (the Jinja `chat_template` of its tokenizer_config.json): parsed once,
// rendered per request into the prompt text. The renderer implements the subset of Jinja that
// Hugging Face chat templates use, with the semantics of @huggingface/jinja (see
// tests/chat/ for the byte-for-byte comparison against it); anything else is refused at Parse
// with its line and column. Knows nothing of HTTP, roles of servers or tokenizers: callers
// (router/openai/chat_prompt.h) validate requests and tokenize the result.
// Immutable after Parse; Render is thread-safe and bounded by RenderLimits.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/chat/jinja_ast.h"
#include "core/chat/jinja_render.h"
#include "nlohmann/json.hpp"

namespace estuary::chat {

struct ChatRenderInput {
  // [{"role": ..., "content": ...}, ...]; other message fields (name, tool_calls, ...) pass
  // through to the template as they are.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // Keys keep their order (tojson prints them as given). Further template variables (tools,
  // date_string, ...); a JSON object. Entries named like the fields above are overridden by them.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // InvalidArgument "chat template: line L, column C: ..." when the text is not a template this
  // renderer supports.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // The prompt text. A message content given as a list of parts ([{"type": "text", "text":
  // ...}, ...]) is passed as the text parts joined by "\n" (what vLLM does for templates that
  // expect string content); other part types are refused. InvalidArgument when the template
  // fails: raise_exception's message as the template wrote it, otherwise "chat template: line L,
  // column C: ..."; also when a RenderLimits bound is exceeded.
  absl::StatusOr<std::string> Render(const ChatRenderInput& input,
                                     const RenderLimits& limits = RenderLimits()) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const std::vector<NodePtr>> program)
      : program_(std::move(program)) {}

  std::shared_ptr<const std::vector<NodePtr>> program_;
};

// True when a Render error came from the template's own raise_exception (a problem with the
// request, such as roles that do not alternate) rather than from the template itself.
bool IsRaisedByTemplate(const absl::Status& status);

}  // namespace estuary::chat
