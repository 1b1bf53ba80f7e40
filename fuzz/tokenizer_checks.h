#pragma once
// What a fuzz target checks on any tokenizer that loaded (tokenizer_json_fuzzer,
// llama2c_files_fuzzer): a few fixed texts and a slice of the input are encoded and decoded, and
// the results must be consistent. A violation traps (libFuzzer reports it as a crash).

#include <cstdint>
#include <string>
#include <string_view>

#include "core/tokenizer/tokenizer.h"

namespace estuary::fuzz {

// Encodes `text`; every id lies in the vocabulary, decoding gives valid UTF-8, and streaming
// through an IncrementalDetokenizer gives the same text as decoding at once.
inline void CheckRoundTrip(const Tokenizer& tokenizer, std::string_view text) {
  auto ids = tokenizer.Encode(text, /*add_bos=*/true);
  if (!ids.ok()) return;  // e.g. a pre-tokenizer regex that hit its match limit
  for (const int32_t id : *ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
  }
  const std::string decoded = tokenizer.Decode(*ids);
  if (SanitizeUtf8(decoded) != decoded) __builtin_trap();
  IncrementalDetokenizer detokenizer(tokenizer);
  std::string streamed;
  for (const int32_t id : *ids) streamed += detokenizer.Push(id);
  streamed += detokenizer.Flush();
  if (streamed != decoded) __builtin_trap();
}

// CheckRoundTrip on fixed texts (spaces, newlines, multi-byte and invalid UTF-8, special-token
// spellings) and on the start of `input`; then TokenBytes on ids at and beyond the vocabulary.
inline void CheckTokenizer(const Tokenizer& t, std::string_view input) {
  static const char* const kTexts[] = {
      "",
      "Hello world!  \n\n  multiple   spaces \xC2\xBD \xE2\x85\xAB 12345",
      "caf\xC3\xA9 \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD <s></s><|begin_of_text|><|eot_id|>",
      "a\xFF\xC3 \x80 it's DON'T \t\r\n",
  };
  for (const char* text : kTexts) CheckRoundTrip(t, text);
  CheckRoundTrip(t, input.substr(0, 256));
  for (const int32_t id : {-1, 0, 1, 2, t.vocab_size() - 1, t.vocab_size(), 1 << 30}) {
    (void)t.TokenBytes(t.bos_id(), id);
    (void)t.TokenBytes(-1, id);
  }
}

}  // namespace estuary::fuzz
