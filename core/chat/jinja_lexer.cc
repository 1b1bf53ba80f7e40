#include "core/chat/jinja_lexer.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/chat/jinja_preprocess.h"
#include "core/chat/jinja_text.h"

namespace estuary::chat {

std::string FormatPos(SourcePos pos) {
  return absl::StrCat("line ", pos.line, ", column ", pos.column);
}

namespace {

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Operators and punctuation in match order (longer sequences before their prefixes).
constexpr std::array<std::pair<std::string_view, TokenType>, 29> kSymbols = {{
    {"{%", TokenType::kOpenStatement},  {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},       {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenBrace},       {"}", TokenType::kCloseBrace},
    {"[", TokenType::kOpenBracket},     {"]", TokenType::kCloseBracket},
    {",", TokenType::kComma},           {".", TokenType::kDot},
    {":", TokenType::kColon},           {"|", TokenType::kPipe},
    {"<=", TokenType::kComparison},     {">=", TokenType::kComparison},
    {"==", TokenType::kComparison},     {"!=", TokenType::kComparison},
    {"<", TokenType::kComparison},      {">", TokenType::kComparison},
    {"+", TokenType::kAdditive},        {"-", TokenType::kAdditive},
    {"~", TokenType::kAdditive},        {"**", TokenType::kPower},
    {"*", TokenType::kMultiplicative},  {"//", TokenType::kMultiplicative},
    {"/", TokenType::kMultiplicative},  {"%", TokenType::kMultiplicative},
    {"=", TokenType::kEquals},
}};

class Lexer {
 public:
  explicit Lexer(std::string_view source)
      : lines_(source), pre_(Preprocess(source)), s_(pre_.text) {}

  absl::StatusOr<std::vector<Token>> Run();

 private:
  SourcePos PosAt(size_t i) const { return lines_.At(pre_.origin[i]); }
  absl::Status Error(size_t i, std::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(FormatPos(PosAt(i)), ": ", Av(message)));
  }
  void Push(TokenType type, std::string value, size_t at) {
    tokens_.push_back(Token{type, std::move(value), PosAt(at)});
  }
  TokenType LastType() const { return tokens_.empty() ? TokenType::kText : tokens_.back().type; }
  // `{%-` / `{{-` / `{#-`: strip trailing whitespace from the preceding text.
  void StripTrailingWhitespace() {
    if (!tokens_.empty() && LastType() == TokenType::kText) {
      tokens_.back().value = std::string(TrimRight(tokens_.back().value));
      if (tokens_.back().value.empty()) tokens_.pop_back();
    }
  }
  void SkipWhitespace() {
    while (size_t n = WhitespaceLengthAt(s_, pos_)) pos_ += n;
  }
  absl::Status LexString(char quote);
  absl::Status LexComment();

  LineIndex lines_;
  PreprocessedSource pre_;
  std::string_view s_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

absl::Status Lexer::LexComment() {
  const size_t start = pos_;
  pos_ += 2;
  const bool strip_before = pos_ < s_.size() && s_[pos_] == '-';
  if (strip_before) ++pos_;
  const size_t end = s_.find("#}", pos_);
  if (end == std::string_view::npos) return Error(start, "unterminated comment '{#'");
  std::string_view comment = s_.substr(pos_, end - pos_);
  const bool strip_after = !comment.empty() && comment.back() == '-';
  if (strip_after) comment.remove_suffix(1);
  if (strip_before) StripTrailingWhitespace();
  Push(TokenType::kComment, std::string(comment), start);
  pos_ = end + 2;
  if (strip_after) SkipWhitespace();
  return absl::OkStatus();
}

absl::Status Lexer::LexString(char quote) {
  const size_t start = pos_++;
  std::string value;
  uint32_t pending_high_surrogate = 0;
  const auto flush_surrogate = [&] {
    if (pending_high_surrogate) AppendUtf8(value, pending_high_surrogate);
    pending_high_surrogate = 0;
  };
  while (true) {
    if (pos_ >= s_.size()) return Error(start, "unterminated string literal");
    const char c = s_[pos_];
    if (c == quote) break;
    ++pos_;
    if (c != '\\') {
      flush_surrogate();
      value.push_back(c);
      continue;
    }
    if (pos_ >= s_.size()) return Error(start, "unterminated string literal");
    const char e = s_[pos_++];
    if (e == 'x' || e == 'u') {
      const size_t digits = e == 'x' ? 2 : 4;
      uint32_t cp = 0;
      for (size_t k = 0; k < digits; ++k) {
        const int h = pos_ + k < s_.size() ? HexValue(s_[pos_ + k]) : -1;
        if (h < 0) return Error(pos_ - 2, "invalid hexadecimal escape in string literal");
        cp = cp * 16 + h;
      }
      pos_ += digits;
      if (cp >= 0xDC00 && cp <= 0xDFFF && pending_high_surrogate) {
        cp = 0x10000 + ((pending_high_surrogate - 0xD800) << 10) + (cp - 0xDC00);
        pending_high_surrogate = 0;
        AppendUtf8(value, cp);
      } else if (cp >= 0xD800 && cp <= 0xDBFF) {
        flush_surrogate();
        pending_high_surrogate = cp;
      } else {
        flush_surrogate();
        AppendUtf8(value, cp);
      }
      continue;
    }
    flush_surrogate();
    switch (e) {
      case 'n':
        value.push_back('\n');
        break;
      case 't':
        value.push_back('\t');
        break;
      case 'r':
        value.push_back('\r');
        break;
      case 'b':
        value.push_back('\b');
        break;
      case 'f':
        value.push_back('\f');
        break;
      case 'v':
        value.push_back('\v');
        break;
      case '\'':
      case '"':
      case '\\':
        value.push_back(e);
        break;
      default:
        return Error(pos_ - 2,
                     absl::StrCat("unknown escape '\\", std::string(1, e), "' in string literal"));
    }
  }
  flush_surrogate();
  ++pos_;  // the closing quote
  Push(TokenType::kString, std::move(value), start);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Token>> Lexer::Run() {
  while (pos_ < s_.size()) {
    const bool outside = tokens_.empty() || LastType() == TokenType::kCloseStatement ||
                         LastType() == TokenType::kCloseExpression ||
                         LastType() == TokenType::kComment;
    if (outside) {
      size_t end = pos_;
      while (true) {
        end = s_.find('{', end);
        if (end == std::string_view::npos) {
          end = s_.size();
          break;
        }
        const char next = end + 1 < s_.size() ? s_[end + 1] : '\0';
        if (next == '%' || next == '{' || next == '#') break;
        ++end;
      }
      if (end > pos_) {
        Push(TokenType::kText, std::string(s_.substr(pos_, end - pos_)), pos_);
        pos_ = end;
        continue;
      }
    }
    if (s_[pos_] == '{' && pos_ + 1 < s_.size()) {
      const char next = s_[pos_ + 1];
      if (next == '#') {
        if (absl::Status st = LexComment(); !st.ok()) return st;
        continue;
      }
      if (pos_ + 2 < s_.size() && s_[pos_ + 2] == '-' && (next == '%' || next == '{')) {
        StripTrailingWhitespace();
        Push(next == '%' ? TokenType::kOpenStatement : TokenType::kOpenExpression,
             next == '%' ? "{%" : "{{", pos_);
        if (next == '{') curly_depth_ = 0;
        pos_ += 3;
        continue;
      }
    }
    SkipWhitespace();
    if (pos_ >= s_.size()) break;  // the parser reports the unterminated tag
    const char c = s_[pos_];
    if (c == '-' && pos_ + 2 < s_.size() && s_[pos_ + 2] == '}' &&
        (s_[pos_ + 1] == '%' || s_[pos_ + 1] == '}')) {
      const bool statement = s_[pos_ + 1] == '%';
      Push(statement ? TokenType::kCloseStatement : TokenType::kCloseExpression,
           statement ? "%}" : "}}", pos_);
      pos_ += 3;
      SkipWhitespace();
      continue;
    }
    if (c == '-' || c == '+') {
      const TokenType last = LastType();
      const bool binary = last == TokenType::kIdentifier || last == TokenType::kNumber ||
                          last == TokenType::kString || last == TokenType::kCloseParen ||
                          last == TokenType::kCloseBracket;
      if (!binary) {
        const size_t start = pos_++;
        std::string num;
        while (pos_ < s_.size() && IsDigit(s_[pos_])) num.push_back(s_[pos_++]);
        if (!num.empty() && pos_ + 1 < s_.size() && s_[pos_] == '.' && IsDigit(s_[pos_ + 1])) {
          num.push_back(s_[pos_++]);
          while (pos_ < s_.size() && IsDigit(s_[pos_])) num.push_back(s_[pos_++]);
        }
        Push(num.empty() ? TokenType::kUnary : TokenType::kNumber, std::string(1, c) + num, start);
        continue;
      }
    }
    bool matched = false;
    for (const auto& [symbol, type] : kSymbols) {
      if (symbol == "}}" && curly_depth_ > 0) continue;
      if (s_.substr(pos_, symbol.size()) != symbol) continue;
      Push(type, std::string(symbol), pos_);
      if (type == TokenType::kOpenExpression) curly_depth_ = 0;
      if (type == TokenType::kOpenBrace) ++curly_depth_;
      if (type == TokenType::kCloseBrace) --curly_depth_;
      pos_ += symbol.size();
      matched = true;
      break;
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      if (absl::Status st = LexString(c); !st.ok()) return st;
      continue;
    }
    if (IsDigit(c)) {
      const size_t start = pos_;
      while (pos_ < s_.size() && IsDigit(s_[pos_])) ++pos_;
      if (LastType() != TokenType::kDot && pos_ + 1 < s_.size() && s_[pos_] == '.' &&
          IsDigit(s_[pos_ + 1])) {
        ++pos_;
        while (pos_ < s_.size() && IsDigit(s_[pos_])) ++pos_;
      }
      Push(TokenType::kNumber, std::string(s_.substr(start, pos_ - start)), start);
      continue;
    }
    if (IsWordChar(c)) {
      const size_t start = pos_;
      while (pos_ < s_.size() && IsWordChar(s_[pos_])) ++pos_;
      Push(TokenType::kIdentifier, std::string(s_.substr(start, pos_ - start)), start);
      continue;
    }
    return Error(
        pos_, absl::StrCat("unexpected character '",
                           std::string(s_.substr(pos_, CharLengthAt(s_, pos_))), "' inside a tag"));
  }
  return std::move(tokens_);
}

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(std::string_view source) {
  if (source.size() > kMaxTemplateBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("template is ", source.size(), " bytes; the limit is ", kMaxTemplateBytes));
  }
  return Lexer(source).Run();
}

}  // namespace estuary::chat
