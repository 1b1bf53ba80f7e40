#include "process/byte_size.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace estuary::process {
namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 62;

struct Unit {
  const char* name;
  int64_t scale;
};
constexpr Unit kUnits[] = {
    {"", 1},
    {"b", 1},
    {"kib", int64_t{1} << 10},
    {"mib", int64_t{1} << 20},
    {"gib", int64_t{1} << 30},
    {"tib", int64_t{1} << 40},
    {"kb", 1000},
    {"mb", 1000 * 1000},
    {"gb", 1000 * 1000 * 1000},
    {"tb", int64_t{1000} * 1000 * 1000 * 1000},
};

absl::Status Refuse(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a memory size (", why,
                   "; use bytes, or a number with KiB, MiB, GiB, TiB, KB, MB, GB or TB)"));
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  size_t end = 0;
  while (end < trimmed.size() &&
         (absl::ascii_isdigit(static_cast<unsigned char>(trimmed[end])) || trimmed[end] == '.')) {
    ++end;
  }
  if (end == 0) return Refuse(text, "no number");
  const std::string number = trimmed.substr(0, end);
  const std::string unit =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(absl::string_view(trimmed).substr(end)));
  int64_t scale = 0;
  for (const Unit& u : kUnits) {
    if (unit == u.name) scale = u.scale;
  }
  if (scale == 0) return Refuse(text, absl::StrCat("unknown unit '", unit, "'"));
  char* parsed_end = nullptr;
  const double value = std::strtod(number.c_str(), &parsed_end);
  if (*parsed_end != '\0' || !std::isfinite(value)) return Refuse(text, "a malformed number");
  const double bytes = value * static_cast<double>(scale);
  if (bytes >= static_cast<double>(kMaxBytes)) return Refuse(text, "too large");
  if (bytes != std::floor(bytes)) return Refuse(text, "not a whole number of bytes");
  return static_cast<int64_t>(bytes);
}

std::string FormatByteSize(int64_t bytes) {
  // Binary units first (memory is sized in them), then decimal ones, from the largest.
  constexpr Unit kSpellings[] = {{"TiB", int64_t{1} << 40},
                                 {"GiB", int64_t{1} << 30},
                                 {"MiB", int64_t{1} << 20},
                                 {"TB", int64_t{1000} * 1000 * 1000 * 1000},
                                 {"GB", 1000 * 1000 * 1000},
                                 {"MB", 1000 * 1000},
                                 {"KiB", int64_t{1} << 10},
                                 {"KB", 1000}};
  if (bytes > 0) {
    for (const Unit& u : kSpellings) {
      if (bytes % u.scale == 0) return absl::StrCat(bytes / u.scale, u.name);
    }
  }
  return absl::StrCat(bytes);
}

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<int64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  size->bytes = *bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return FormatByteSize(size.bytes); }

}  // namespace estuary::process
