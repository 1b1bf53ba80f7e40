// libFuzzer target for the tokenizer.json loader: arbitrary bytes are a whole tokenizer.json.
// Whatever loads is used: a few fixed strings and the start of the input itself are encoded and
// decoded, and the results are checked for internal consistency.
// Seeds: fuzz/corpus/tokenizer_json/. Run (see fuzz/CMakeLists.txt for the build):
//   ./build-fuzz/fuzz/tokenizer_json_fuzzer -max_total_time=60 fuzz/corpus/tokenizer_json

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer/hf_tokenizer.h"
#include "core/tokenizer/tokenizer.h"

namespace {

void Check(const estuary::Tokenizer& tokenizer, std::string_view text) {
  auto ids = tokenizer.Encode(text, /*add_bos=*/true);
  if (!ids.ok()) return;  // e.g. a pre-tokenizer regex that hit its match limit
  for (const int32_t id : *ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
  }
  const std::string decoded = tokenizer.Decode(*ids);
  if (estuary::SanitizeUtf8(decoded) != decoded) __builtin_trap();
  // Streaming gives the same text as decoding at once.
  estuary::IncrementalDetokenizer detokenizer(tokenizer);
  std::string streamed;
  for (const int32_t id : *ids) streamed += detokenizer.Push(id);
  streamed += detokenizer.Flush();
  if (streamed != decoded) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto tokenizer = estuary::ParseHfTokenizerJson(absl::string_view(input.data(), input.size()));
  if (!tokenizer.ok()) return 0;
  const estuary::Tokenizer& t = **tokenizer;
  static const char* const kTexts[] = {
      "",
      "Hello world!  \n\n  multiple   spaces \xC2\xBD \xE2\x85\xAB 12345",
      "caf\xC3\xA9 \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD <s></s><|begin_of_text|><|eot_id|>",
      "a\xFF\xC3 \x80 it's DON'T \t\r\n",
  };
  for (const char* text : kTexts) Check(t, text);
  Check(t, input.substr(0, 256));
  for (const int32_t id : {-1, 0, 1, 2, t.vocab_size() - 1, t.vocab_size(), 1 << 30}) {
    (void)t.TokenBytes(t.bos_id(), id);
    (void)t.TokenBytes(-1, id);
  }
  return 0;
}
