#include "core/chat/jinja_preprocess.h"

#include <algorithm>

#include "core/chat/jinja_text.h"

namespace estuary::chat {
namespace {

// True where a JavaScript multiline `^` matches: the start, or after \n, \r, U+2028, U+2029.
bool AtLineStart(std::string_view text, size_t pos) {
  if (pos == 0) return true;
  const char prev = text[pos - 1];
  if (prev == '\n' || prev == '\r') return true;
  return pos >= 3 && text.substr(pos - 3, 2) == "\xE2\x80" &&
         (text[pos - 1] == '\xA8' || text[pos - 1] == '\xA9');
}

// lstrip_blocks: spaces and tabs from a line start up to `{%`, `{#` (and, as in the reference,
// `{-`) are removed.
PreprocessedSource LstripBlocks(const PreprocessedSource& in) {
  PreprocessedSource out;
  const std::string& s = in.text;
  for (size_t i = 0; i < s.size();) {
    if (AtLineStart(s, i)) {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j > i && j + 1 < s.size() && s[j] == '{' &&
          (s[j + 1] == '%' || s[j + 1] == '#' || s[j + 1] == '-')) {
        i = j;
      }
    }
    out.text.push_back(s[i]);
    out.origin.push_back(in.origin[i]);
    ++i;
  }
  out.origin.push_back(in.origin.back());
  return out;
}

// trim_blocks: the newline right after `%}`, `#}` or `-}` is removed.
PreprocessedSource TrimBlocks(const PreprocessedSource& in) {
  PreprocessedSource out;
  const std::string& s = in.text;
  for (size_t i = 0; i < s.size();) {
    if (i + 2 < s.size() && (s[i] == '%' || s[i] == '#' || s[i] == '-') && s[i + 1] == '}' &&
        s[i + 2] == '\n') {
      for (size_t k = i; k < i + 2; ++k) {
        out.text.push_back(s[k]);
        out.origin.push_back(in.origin[k]);
      }
      i += 3;
      continue;
    }
    out.text.push_back(s[i]);
    out.origin.push_back(in.origin[i]);
    ++i;
  }
  out.origin.push_back(in.origin.back());
  return out;
}

size_t SkipWhitespace(std::string_view s, size_t pos) {
  while (size_t n = WhitespaceLengthAt(s, pos)) pos += n;
  return pos;
}

// Matches `{%-? \s* (end)?generation \s* -?%} \s*` at `pos`; returns its end or 0.
size_t MatchGenerationTag(std::string_view s, size_t pos, bool* lstrip, bool* rstrip,
                          size_t* after_start) {
  if (s.substr(pos, 2) != "{%") return 0;
  size_t i = pos + 2;
  *lstrip = i < s.size() && s[i] == '-';
  if (*lstrip) ++i;
  i = SkipWhitespace(s, i);
  if (s.substr(i, 3) == "end") i += 3;
  if (s.substr(i, 10) != "generation") return 0;
  i = SkipWhitespace(s, i + 10);
  *rstrip = i < s.size() && s[i] == '-';
  if (*rstrip) ++i;
  if (s.substr(i, 2) != "%}") return 0;
  *after_start = i + 2;
  return SkipWhitespace(s, i + 2);
}

PreprocessedSource RemoveGenerationTags(const PreprocessedSource& in) {
  PreprocessedSource out;
  const std::string& s = in.text;
  size_t last = 0;  // end of the previous tag
  const auto copy = [&](size_t from, size_t to) {
    out.text.append(s, from, to - from);
    out.origin.insert(out.origin.end(), in.origin.begin() + from, in.origin.begin() + to);
  };
  for (size_t i = s.find("{%"); i != std::string::npos; i = s.find("{%", i)) {
    bool lstrip = false, rstrip = false;
    size_t after = 0;
    const size_t end = MatchGenerationTag(s, i, &lstrip, &rstrip, &after);
    if (end == 0) {
      i += 2;
      continue;
    }
    size_t text_end = i;
    while (lstrip && text_end > last) {
      const size_t n = WhitespaceLengthBefore(std::string_view(s).substr(last), text_end - last);
      if (n == 0) break;
      text_end -= n;
    }
    copy(last, text_end);
    if (!rstrip) copy(after, end);
    last = i = end;
  }
  copy(last, s.size());
  out.origin.push_back(in.origin.back());
  return out;
}

}  // namespace

PreprocessedSource Preprocess(std::string_view source) {
  PreprocessedSource p;
  if (!source.empty() && source.back() == '\n') source.remove_suffix(1);
  p.text = std::string(source);
  p.origin.resize(source.size() + 1);
  for (size_t i = 0; i <= source.size(); ++i) p.origin[i] = static_cast<uint32_t>(i);
  return RemoveGenerationTags(TrimBlocks(LstripBlocks(p)));
}

LineIndex::LineIndex(std::string_view source) : source_(source) {
  line_starts_.push_back(0);
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\n') line_starts_.push_back(static_cast<uint32_t>(i + 1));
  }
}

SourcePos LineIndex::At(uint32_t offset) const {
  offset = std::min<uint32_t>(offset, static_cast<uint32_t>(source_.size()));
  const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
  int column = 1;
  for (uint32_t i = *it; i < offset; ++i) {
    if ((static_cast<uint8_t>(source_[i]) & 0xC0) != 0x80) ++column;
  }
  return SourcePos{static_cast<int>(it - line_starts_.begin()) + 1, column};
}

}  // namespace estuary::chat
