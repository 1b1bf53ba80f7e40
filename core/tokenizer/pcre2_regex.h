#pragma once
// A compiled PCRE2 pattern used by the tokenizer.json "Split" pre-tokenizer. Compiled with
// PCRE2_UTF | PCRE2_UCP (Unicode \s, \p{L}, ... as the Hugging Face/Oniguruma patterns expect)
// and PCRE2_MATCH_INVALID_UTF (ill-formed UTF-8 in the subject never matches instead of being
// an error), JIT-compiled when the platform supports it. Patterns come from untrusted files, so
// every match runs under match/depth/heap limits; exceeding them is an error, not a hang.
//
// Immutable after Compile; SplitIsolated may be called from many threads at once (each call uses
// its own match data).

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct pcre2_real_code_8;
struct pcre2_real_match_context_8;

namespace estuary {

class Pcre2Regex {
 public:
  // `literal`: the pattern is a plain string (PCRE2_LITERAL).
  static absl::StatusOr<std::unique_ptr<Pcre2Regex>> Compile(absl::string_view pattern,
                                                             bool literal);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Hugging Face Split behaviour "Isolated": appends to `pieces` the matches and the text between
  // them, in order, leaving out empty pieces. The views point into `text`.
  absl::Status SplitIsolated(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  Pcre2Regex(pcre2_real_code_8* code, pcre2_real_match_context_8* context)
      : code_(code), context_(context) {}
  pcre2_real_code_8* const code_;             // owned
  pcre2_real_match_context_8* const context_;  // owned; read-only while matching
};

}  // namespace estuary
