// libFuzzer target for core/chat: arbitrary bytes are a chat template. Whatever parses is
// rendered with a small conversation under tight RenderLimits; errors are fine, crashes, hangs,
// sanitizer findings and unbounded memory are not (the limits must hold for any template).
// Seeds: fuzz/corpus/chat_template/ (the published templates of tests/chat/templates). Run (see
// fuzz/CMakeLists.txt for the build):
//   ./build-fuzz/fuzz/chat_template_fuzzer -max_total_time=60 fuzz/corpus/chat_template

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto parsed = estuary::chat::ChatTemplate::Parse(source);
  if (!parsed.ok()) return 0;
  estuary::chat::ChatRenderInput input;
  input.messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi {{ x }}"},
          {"role": "assistant", "content": "ok"}, {"role": "user", "content": "é"}])");
  input.bos_token = "<s>";
  input.eos_token = "</s>";
  input.variables["tools"] = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2.5, null]}}}])");
  estuary::chat::RenderLimits limits;
  limits.max_output_bytes = 1 << 16;
  limits.max_steps = 200000;
  limits.max_list_items = 10000;
  limits.now_epoch_seconds = 0;
  auto text = parsed->Render(input, limits);
  if (text.ok() && text->size() > limits.max_output_bytes) __builtin_trap();
  return 0;
}
