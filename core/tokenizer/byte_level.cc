#include "core/tokenizer/byte_level.h"

#include <array>

#include "core/tokenizer/utf8.h"

namespace estuary {
namespace {

struct Tables {
  std::array<std::string, 256> chars;  // byte -> UTF-8 of its character
  std::array<int, 512> bytes;          // code point (< 512) -> byte, or -1

  Tables() {
    bytes.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? b : next++;
      utf8::AppendCodePoint(cp, &chars[b]);
      bytes[cp] = b;
    }
  }
};

const Tables& GetTables() {
  static const Tables* const tables = new Tables();
  return *tables;
}

}  // namespace

const std::string& ByteLevelChar(unsigned char byte) { return GetTables().chars[byte]; }

std::string ByteLevelEncode(std::string_view bytes) {
  const Tables& tables = GetTables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += tables.chars[static_cast<unsigned char>(c)];
  return out;
}

bool ByteLevelDecode(std::string_view token, std::string* out) {
  const Tables& tables = GetTables();
  out->clear();
  for (size_t pos = 0; pos < token.size();) {
    const unsigned char lead = static_cast<unsigned char>(token[pos]);
    char32_t cp;
    size_t length = 1;
    if (lead < 0x80) {
      cp = lead;
    } else if (utf8::NextSequence(token, pos, &length) == utf8::SequenceStatus::kValid &&
               length == 2) {
      cp = ((lead & 0x1F) << 6) | (static_cast<unsigned char>(token[pos + 1]) & 0x3F);
    } else {
      return false;  // all characters of the alphabet are below U+0800
    }
    if (cp >= tables.bytes.size() || tables.bytes[cp] < 0) return false;
    out->push_back(static_cast<char>(tables.bytes[cp]));
    pos += length;
  }
  return true;
}

}  // namespace estuary
