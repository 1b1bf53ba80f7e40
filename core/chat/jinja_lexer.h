#pragma once
// Jinja lexer: template source -> tokens, the first of the renderer's three stages (lexer,
// parser, interpreter). It reproduces @huggingface/jinja's tokenizer, which is what Hugging Face
// tooling renders chat templates with, including its preprocessing: one trailing newline is
// dropped, lstrip_blocks and trim_blocks are on (as transformers configures Jinja), and
// transformers' `{% generation %}` / `{% endgeneration %}` markers are removed. Whitespace control
// (`{%-`, `-%}`, `{{-`, `-}}`, `{#-`, `-#}`) is applied here, so the parser sees final text.
// Every token keeps its position in the original source for error messages.
// Stateless; thread-safe.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace estuary::chat {

// 1-based line and column (columns count characters) in the original template source.
struct SourcePos {
  int line = 0;
  int column = 0;
};

// "line 3, column 7"
std::string FormatPos(SourcePos pos);

enum class TokenType {
  kText,             // literal text between tags
  kComment,          // {# ... #}
  kNumber,           // 12, 1.5, and a signed literal such as -1 where the sign is unary
  kString,           // the unescaped contents of '...' or "..."
  kIdentifier,       // names, keywords and operators such as `and`, `in`, `is`
  kOpenStatement,    // {%
  kCloseStatement,   // %}
  kOpenExpression,   // {{
  kCloseExpression,  // }}
  kOpenParen,
  kCloseParen,
  kOpenBracket,
  kCloseBracket,
  kOpenBrace,
  kCloseBrace,
  kComma,
  kDot,
  kColon,
  kPipe,
  kEquals,          // =
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kComparison,      // == != < > <= >=
  kUnary,           // a unary + or - not followed by digits
};

struct Token {
  TokenType type;
  std::string value;
  SourcePos pos;
};

// Templates larger than this are refused (chat templates are a few KiB).
inline constexpr size_t kMaxTemplateBytes = 4 << 20;

// InvalidArgument naming the line and column on malformed input (unterminated string or
// comment, unknown character, bad escape).
absl::StatusOr<std::vector<Token>> Lex(std::string_view source);

}  // namespace estuary::chat
