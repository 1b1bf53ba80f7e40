#pragma once
// The text rewrites that @huggingface/jinja (and transformers' Jinja settings) apply before
// tokenizing: drop one trailing newline, lstrip_blocks, trim_blocks, and remove transformers'
// `{% generation %}` markers. Each output byte remembers its offset in the original source, so
// that errors point at what the template author wrote. Internal to the lexer.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/chat/jinja_lexer.h"

namespace estuary::chat {

struct PreprocessedSource {
  std::string text;
  std::vector<uint32_t> origin;  // origin[i]: source offset of text[i]; one extra for the end
};

PreprocessedSource Preprocess(std::string_view source);

// Maps source offsets to line and column.
class LineIndex {
 public:
  explicit LineIndex(std::string_view source);
  SourcePos At(uint32_t offset) const;

 private:
  std::string_view source_;
  std::vector<uint32_t> line_starts_;
};

}  // namespace estuary::chat
