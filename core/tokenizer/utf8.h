#pragma once
// UTF-8 scanning shared by the tokenizers and the detokenizer. Stateless; thread-safe.
//
// Ill-formed input is handled the way the Unicode standard recommends ("maximal subparts",
// also what Python's and WHATWG's decoders do): each maximal prefix of a would-be sequence is
// one error, replaced by one U+FFFD.

#include <cstddef>
#include <string>
#include <string_view>

namespace estuary {
namespace utf8 {

enum class SequenceStatus {
  kValid,      // a complete, well-formed code point
  kInvalid,    // an ill-formed maximal subpart (never becomes valid)
  kTruncated,  // a well-formed prefix cut off by the end of the input
};

// Classifies the sequence that starts at `text[pos]` (pos < text.size()) and sets `*length` to
// its length in bytes (always >= 1): the code point, the maximal subpart, or the bytes up to the
// end of the input.
SequenceStatus NextSequence(std::string_view text, size_t pos, size_t* length);

// Length in bytes of the "character" at `text[pos]` as the tokenizers split text: a well-formed
// code point, or a single byte when the bytes there are not one.
size_t CharLength(std::string_view text, size_t pos);

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Appends the UTF-8 encoding of `code_point` (<= 0x10FFFF) to `out`.
void AppendCodePoint(char32_t code_point, std::string* out);

}  // namespace utf8
}  // namespace estuary
