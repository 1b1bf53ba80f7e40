#pragma once
// Jinja parser: tokens (jinja_lexer.h) -> syntax tree (jinja_ast.h). The grammar and operator
// precedence follow @huggingface/jinja (the reference renderer for chat templates): statements
// if/elif/else, for (with `else` and an inline `if` filter), set (also `set ns.attr`, tuple
// targets and block `set`), break and continue; expressions with or/and/not, comparisons,
// in/not in, + - ~, * / // %, **, `is` tests, `|` filters, unary signs, calls with keyword
// arguments, attribute/index/slice access, and list/tuple/dict literals.
// Refused with InvalidArgument naming the construct and its line and column: macro, call,
// filter blocks, include/import/extends/block, raw, with and any other statement; `*`/`**`
// argument unpacking; tests with arguments. Nesting is bounded (kMaxNesting) so that untrusted
// templates cannot exhaust the stack while parsing, rendering or destroying the tree.
// Stateless; thread-safe.

#include <vector>

#include "absl/status/statusor.h"
#include "core/chat/jinja_ast.h"
#include "core/chat/jinja_lexer.h"

namespace estuary::chat {

inline constexpr int kMaxNesting = 128;

// The template's top-level statements.
absl::StatusOr<std::vector<NodePtr>> Parse(const std::vector<Token>& tokens);

}  // namespace estuary::chat
