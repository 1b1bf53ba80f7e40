#include "core/tokenizer/pcre2_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/utf8.h"

namespace estuary {
namespace {

// Generous for tokenizer patterns (the Llama 3 pattern needs a few dozen steps per piece), small
// enough that a catastrophic pattern fails in well under a second.
constexpr uint32_t kMatchLimit = 2'000'000;
constexpr uint32_t kDepthLimit = 10'000;
constexpr uint32_t kHeapLimitKib = 16 * 1024;

std::string ErrorText(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return std::string(reinterpret_cast<const char*>(buffer));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Pcre2Regex>> Pcre2Regex::Compile(absl::string_view pattern,
                                                                bool literal) {
  // PCRE2_LITERAL does not allow PCRE2_UCP (which only matters for escapes anyway).
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex does not compile at offset ", offset, ": ", ErrorText(error)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure just means the interpreter is used
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  if (context == nullptr) {
    pcre2_code_free(code);
    return absl::ResourceExhaustedError("cannot allocate a PCRE2 match context");
  }
  pcre2_set_match_limit(context, kMatchLimit);
  pcre2_set_depth_limit(context, kDepthLimit);
  pcre2_set_heap_limit(context, kHeapLimitKib);
  return std::unique_ptr<Pcre2Regex>(new Pcre2Regex(code, context));
}

Pcre2Regex::~Pcre2Regex() {
  pcre2_match_context_free(context_);
  pcre2_code_free(code_);
}

absl::Status Pcre2Regex::SplitIsolated(std::string_view text,
                                       std::vector<std::string_view>* pieces) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(code_, nullptr));
  if (data == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t emitted = 0;  // end of the last piece appended
  size_t start = 0;    // where the next search begins
  while (start <= text.size()) {
    int rc = pcre2_match(code_, subject, text.size(), start, 0, data.get(), context_);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_, subject, text.size(), start, PCRE2_NO_JIT, data.get(), context_);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("pre-tokenizer regex failed at byte ", start, ": ", ErrorText(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t match_begin = ovector[0];
    const size_t match_end = ovector[1];
    if (match_begin < start || match_end < match_begin || match_end > text.size()) {
      break;  // \K in a lookahead can report such matches; treat as the end of matching
    }
    if (match_end == match_begin) {
      // An empty match splits nothing; move on by one character.
      if (match_begin >= text.size()) break;
      start = match_begin + utf8::CharLength(text, match_begin);
      continue;
    }
    if (match_begin > emitted) pieces->push_back(text.substr(emitted, match_begin - emitted));
    pieces->push_back(text.substr(match_begin, match_end - match_begin));
    emitted = start = match_end;
  }
  if (emitted < text.size()) pieces->push_back(text.substr(emitted));
  return absl::OkStatus();
}

}  // namespace estuary
