#include "core/chat/jinja_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

namespace estuary::chat {
namespace {

// Decodes the UTF-8 character at text[pos]. An invalid or truncated sequence decodes as one
// byte with code point 0xFFFD, so that every caller makes progress.
uint32_t DecodeAt(std::string_view text, size_t pos, size_t* length) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  size_t n = 0;
  uint32_t cp = 0;
  if (lead < 0x80) {
    *length = 1;
    return lead;
  } else if ((lead & 0xE0) == 0xC0) {
    n = 2, cp = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    n = 3, cp = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    n = 4, cp = lead & 0x07;
  } else {
    *length = 1;
    return 0xFFFD;
  }
  if (pos + n > text.size()) {
    *length = 1;
    return 0xFFFD;
  }
  for (size_t i = 1; i < n; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) {
      *length = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (byte(pos + i) & 0x3F);
  }
  *length = n;
  return cp;
}

bool IsJsWhitespace(uint32_t cp) {
  return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

}  // namespace

size_t WhitespaceLengthAt(std::string_view text, size_t pos) {
  if (pos >= text.size()) return 0;
  size_t length = 0;
  return IsJsWhitespace(DecodeAt(text, pos, &length)) ? length : 0;
}

size_t WhitespaceLengthBefore(std::string_view text, size_t end) {
  // Every JavaScript whitespace character is 1 to 3 bytes long in UTF-8.
  for (size_t n = 1; n <= 3 && n <= end; ++n) {
    size_t length = 0;
    const uint32_t cp = DecodeAt(text, end - n, &length);
    if (length == n) return IsJsWhitespace(cp) ? n : 0;
  }
  return 0;
}

std::string_view TrimLeft(std::string_view text) {
  size_t pos = 0;
  while (size_t n = WhitespaceLengthAt(text, pos)) pos += n;
  return text.substr(pos);
}

std::string_view TrimRight(std::string_view text) {
  size_t end = text.size();
  while (size_t n = WhitespaceLengthBefore(text, end)) end -= n;
  return text.substr(0, end);
}

size_t CharLengthAt(std::string_view text, size_t pos) {
  size_t length = 0;
  DecodeAt(text, pos, &length);
  return length;
}

std::vector<std::string_view> SplitChars(std::string_view text) {
  std::vector<std::string_view> chars;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = CharLengthAt(text, pos);
    chars.push_back(text.substr(pos, n));
    pos += n;
  }
  return chars;
}

int64_t Utf16Length(std::string_view text) {
  int64_t units = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t n = 0;
    const uint32_t cp = DecodeAt(text, pos, &n);
    units += cp >= 0x10000 ? 2 : 1;
    pos += n;
  }
  return units;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string AsciiUpper(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string FormatJsNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return "0";  // also -0, as in JavaScript
  // The shortest round-trip digits, as d.ddde[+-]x; then ECMA-262 Number::toString's layout.
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string_view sci(buf, result.ptr - buf);
  std::string sign;
  if (sci.front() == '-') sign = "-", sci.remove_prefix(1);
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;  // value = 0.digits * 10^n
  if (k <= n && n <= 21) return sign + digits + std::string(n - k, '0');
  if (0 < n && n <= 21) return sign + digits.substr(0, n) + "." + digits.substr(n);
  if (-6 < n && n <= 0) return sign + "0." + std::string(-n, '0') + digits;
  std::string mantissa = digits.substr(0, 1);
  if (k > 1) mantissa += "." + digits.substr(1);
  return sign + mantissa + "e" + (n - 1 >= 0 ? "+" : "-") + std::to_string(std::abs(n - 1));
}

std::string FormatFloatValue(double value) {
  if (value == 0 && std::signbit(value)) return "-0.0";
  if (std::isfinite(value) && value == std::trunc(value)) {
    if (std::fabs(value) >= 1e21) return FormatJsNumber(value);  // toFixed falls back here too
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%.1f", value);
    return buf;
  }
  return FormatJsNumber(value);
}

}  // namespace estuary::chat
