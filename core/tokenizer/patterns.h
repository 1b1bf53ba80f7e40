#pragma once
// Pre-tokenizer regexes of well-known byte-level BPE tokenizers (PCRE2 syntax, UTF + UCP).

#include "absl/strings/string_view.h"

namespace estuary {

// GPT-2's pattern: the ByteLevel pre-tokenizer's split when "use_regex" is true.
inline constexpr absl::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3's Split pattern (tiktoken cl100k-style: numbers in groups of up to 3 digits).
inline constexpr absl::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace estuary
