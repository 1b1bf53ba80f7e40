#pragma once
// Text helpers for the Jinja renderer. Strings are UTF-8 bytes; where the reference renderer
// (@huggingface/jinja, JavaScript) works on UTF-16, these reproduce its results on UTF-8:
// JavaScript's whitespace set for trim/strip, `length` in UTF-16 code units, and JavaScript's
// Number-to-string rules. Invalid UTF-8 never fails: each bad byte counts as one character.
// Stateless free functions; thread-safe.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"

namespace estuary::chat {

// Debian's Abseil has its own string_view type; Abseil's APIs take it, this code uses std's.
inline absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Length in bytes of the JavaScript whitespace character (\s) starting at text[pos], or 0.
size_t WhitespaceLengthAt(std::string_view text, size_t pos);
// Length in bytes of the JavaScript whitespace character ending just before text[end], or 0.
size_t WhitespaceLengthBefore(std::string_view text, size_t end);

std::string_view TrimLeft(std::string_view text);
std::string_view TrimRight(std::string_view text);
inline std::string_view Trim(std::string_view text) { return TrimLeft(TrimRight(text)); }

// Byte length of the UTF-8 sequence starting at text[pos] (1 for an invalid byte).
size_t CharLengthAt(std::string_view text, size_t pos);
// Splits into characters (code points; an invalid byte is its own character).
std::vector<std::string_view> SplitChars(std::string_view text);
// JavaScript's String.length: UTF-16 code units.
int64_t Utf16Length(std::string_view text);
void AppendUtf8(std::string& out, uint32_t code_point);

// ASCII-only case mapping (non-ASCII bytes pass through unchanged).
std::string AsciiUpper(std::string_view text);
std::string AsciiLower(std::string_view text);

// JavaScript Number.prototype.toString: 2 -> "2", 0.5 -> "0.5", 1e21 -> "1e+21", NaN -> "NaN".
std::string FormatJsNumber(double value);
// @huggingface/jinja's float rendering: integral values keep one decimal ("2.0"), -0 is "-0.0".
std::string FormatFloatValue(double value);

}  // namespace estuary::chat
