#include "core/tokenizer/utf8.h"

#include <cstdint>

namespace estuary {
namespace utf8 {

SequenceStatus NextSequence(std::string_view text, size_t pos, size_t* length) {
  const uint8_t lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) {
    *length = 1;
    return SequenceStatus::kValid;
  }
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead == 0xE0) {
    need = 3;
    lo = 0xA0;
  } else if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) {
    need = 3;
  } else if (lead == 0xED) {
    need = 3;
    hi = 0x9F;  // no surrogates
  } else if (lead == 0xF0) {
    need = 4;
    lo = 0x90;
  } else if (lead >= 0xF1 && lead <= 0xF3) {
    need = 4;
  } else if (lead == 0xF4) {
    need = 4;
    hi = 0x8F;  // <= U+10FFFF
  } else {
    *length = 1;  // continuation byte, C0, C1 or F5..FF
    return SequenceStatus::kInvalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (pos + i >= text.size()) {
      *length = i;
      return SequenceStatus::kTruncated;
    }
    const uint8_t b = static_cast<uint8_t>(text[pos + i]);
    const uint8_t min = i == 1 ? lo : 0x80;
    const uint8_t max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) {
      *length = i;
      return SequenceStatus::kInvalid;
    }
  }
  *length = need;
  return SequenceStatus::kValid;
}

size_t CharLength(std::string_view text, size_t pos) {
  size_t length = 1;
  return NextSequence(text, pos, &length) == SequenceStatus::kValid ? length : 1;
}

void AppendCodePoint(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace utf8
}  // namespace estuary
