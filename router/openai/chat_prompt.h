#pragma once
// The router's chat template: turns a /v1/chat/completions (or /tokenize) body's messages into
// prompt token ids (OpenAiServer's ChatPromptFn). The template comes from --chat-template FILE,
// else from `chat_template` in the model folder's tokenizer_config.json (a string, or the list
// form [{"name", "template"}] of which "default" is used); bos_token/eos_token from
// tokenizer_config.json, else "<s>"/"</s>" when the tokenizer has those tokens. Requests are
// validated here (roles, content types) with OpenAI-style errors naming the field; the template
// itself is rendered by core/chat. Immutable once made; the function is thread-safe.

#include <string>

#include "absl/status/statusor.h"
#include "core/tokenizer/tokenizer.h"
#include "router/openai/openai_server.h"

namespace estuary::openai {

// Null (and OK) when neither source has a template: /v1/chat/completions then answers 400 "no
// chat template". INVALID_ARGUMENT naming the file when a template is unreadable or malformed.
// `tokenizer` must outlive the function.
absl::StatusOr<ChatPromptFn> MakeChatPrompt(const std::string& model_dir,
                                            const std::string& template_file,
                                            const Tokenizer& tokenizer);

}  // namespace estuary::openai
