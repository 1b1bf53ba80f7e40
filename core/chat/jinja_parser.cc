#include "core/chat/jinja_parser.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/chat/jinja_parser_impl.h"
#include "core/chat/jinja_text.h"
#include "core/common/status_macros.h"

namespace estuary::chat {
namespace internal {
namespace {

// Statements the reference knows but this renderer does not implement, and Jinja statements
// chat templates do not use. Named in the error so the template author knows what to change.
constexpr std::string_view kUnsupportedStatements[] = {
    "macro", "call", "filter", "include", "import",     "from", "extends",
    "block", "raw",  "with",   "do",      "autoescape", "trans"};

}  // namespace

NodePtr Parser::MakeNode(NodeKind kind, SourcePos pos) {
  auto node = std::make_unique<Node>();
  node->kind = kind;
  node->pos = pos;
  return node;
}

absl::Status Parser::ErrorAt(SourcePos pos, std::string_view message) const {
  return absl::InvalidArgumentError(absl::StrCat(FormatPos(pos), ": ", Av(message)));
}

absl::Status Parser::ErrorHere(std::string_view message) const {
  if (AtEnd()) {
    const SourcePos end = tokens_.empty() ? SourcePos{1, 1} : tokens_.back().pos;
    return ErrorAt(end, absl::StrCat(Av(message), " (reached the end of the template)"));
  }
  return ErrorAt(Peek()->pos, absl::StrCat(Av(message), ", found '", Peek()->value, "'"));
}

absl::Status Parser::Expect(TokenType type, std::string_view what) {
  if (!Is(type)) return ErrorHere(absl::StrCat("expected ", Av(what)));
  ++current_;
  return absl::OkStatus();
}

bool Parser::IsStatement(std::initializer_list<std::string_view> names) const {
  if (!Is(TokenType::kOpenStatement)) return false;
  return std::any_of(names.begin(), names.end(), [&](std::string_view n) { return IsName(n, 1); });
}

absl::StatusOr<NodePtr> Parser::Finish(NodePtr node) const {
  int depth = 0;
  for (const auto* list : {&node->args, &node->body, &node->alternate}) {
    for (const NodePtr& child : *list) {
      if (child) depth = std::max(depth, child->depth);
    }
  }
  node->depth = depth + 1;
  if (node->depth > kMaxNesting) {
    return ErrorAt(node->pos, absl::StrCat("template nesting deeper than ", kMaxNesting));
  }
  return node;
}

absl::StatusOr<std::vector<NodePtr>> Parser::ParseTemplate() {
  std::vector<NodePtr> program;
  while (!AtEnd()) {
    ESTUARY_ASSIGN_OR_RETURN(NodePtr statement, ParseStatement());
    if (statement) program.push_back(std::move(statement));
  }
  return program;
}

// Parses statements until `{% <one of stops>` (not consumed); `opener` names the unterminated
// block if the template ends first.
absl::StatusOr<std::vector<NodePtr>> Parser::ParseBody(
    std::initializer_list<std::string_view> stops, const Token& opener) {
  std::vector<NodePtr> body;
  while (!IsStatement(stops)) {
    if (AtEnd()) {
      return ErrorAt(opener.pos,
                     absl::StrCat("unterminated '{% ", opener.value, " %}': expected '{% ",
                                  Av(*(stops.end() - 1)), " %}'"));
    }
    ESTUARY_ASSIGN_OR_RETURN(NodePtr statement, ParseStatement());
    if (statement) body.push_back(std::move(statement));
  }
  return body;
}

absl::Status Parser::ExpectEnd(std::string_view name, const Token& opener) {
  ++current_;  // {%
  if (!IsName(name)) return ErrorHere(absl::StrCat("expected '", Av(name), "'"));
  ++current_;
  return Expect(TokenType::kCloseStatement, "'%}'");
}

// One body element; null for a comment.
absl::StatusOr<NodePtr> Parser::ParseStatement() {
  DepthGuard guard(this);
  if (guard.exceeded())
    return ErrorHere(absl::StrCat("template nesting deeper than ", kMaxNesting));
  const Token& token = Next();
  switch (token.type) {
    case TokenType::kComment:
      return nullptr;
    case TokenType::kText: {
      NodePtr text = MakeNode(NodeKind::kText, token.pos);
      text->text = token.value;
      return text;
    }
    case TokenType::kOpenExpression: {
      NodePtr output = MakeNode(NodeKind::kOutput, token.pos);
      ESTUARY_ASSIGN_OR_RETURN(NodePtr expr, ParseExpression());
      output->args.push_back(std::move(expr));
      if (!Is(TokenType::kCloseExpression)) {
        return AtEnd() ? ErrorAt(token.pos, "unterminated '{{': expected '}}'")
                       : ErrorHere("expected '}}'");
      }
      ++current_;
      return Finish(std::move(output));
    }
    case TokenType::kOpenStatement:
      break;
    default:
      return ErrorAt(token.pos, absl::StrCat("unexpected '", token.value, "' outside a tag"));
  }
  if (AtEnd()) return ErrorAt(token.pos, "unterminated '{%': expected a statement");
  const Token& name = *Peek();
  if (name.type != TokenType::kIdentifier) return ErrorHere("expected a statement name");
  ++current_;
  const std::string& n = name.value;
  if (n == "if") return ParseIf(name);
  if (n == "for") return ParseFor(name);
  if (n == "set") return ParseSet(name);
  if (n == "break" || n == "continue") {
    if (loop_depth_ == 0) return ErrorAt(name.pos, absl::StrCat("'", n, "' outside a for loop"));
    ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    return MakeNode(n == "break" ? NodeKind::kBreak : NodeKind::kContinue, name.pos);
  }
  for (std::string_view unsupported : kUnsupportedStatements) {
    if (n == unsupported) {
      return ErrorAt(name.pos, absl::StrCat("unsupported construct '{% ", n,
                                            " %}' (this renderer implements if, for, set, "
                                            "break and continue)"));
    }
  }
  return ErrorAt(name.pos, absl::StrCat("unknown or misplaced statement '{% ", n, " %}'"));
}

// After `{% if` (or `{% elif`); the caller consumes `{% endif %}`.
absl::StatusOr<NodePtr> Parser::ParseIf(const Token& opener) {
  NodePtr node = MakeNode(NodeKind::kIf, opener.pos);
  ESTUARY_ASSIGN_OR_RETURN(NodePtr test, ParseExpression());
  node->args.push_back(std::move(test));
  ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
  ESTUARY_ASSIGN_OR_RETURN(node->body, ParseBody({"elif", "else", "endif"}, opener));
  if (IsStatement({"elif"})) {
    current_ += 2;
    DepthGuard guard(this);
    if (guard.exceeded()) return ErrorHere("too many elif branches");
    ESTUARY_ASSIGN_OR_RETURN(NodePtr elif, ParseIf(tokens_[current_ - 1]));
    node->alternate.push_back(std::move(elif));
    // The chain shares one `{% endif %}`, consumed by the `if` that opened it.
    if (opener.value == "if") ESTUARY_RETURN_IF_ERROR(ExpectEnd("endif", opener));
    return Finish(std::move(node));
  }
  if (IsStatement({"else"})) {
    current_ += 2;
    ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    ESTUARY_ASSIGN_OR_RETURN(node->alternate, ParseBody({"endif"}, opener));
  }
  if (opener.value == "if") ESTUARY_RETURN_IF_ERROR(ExpectEnd("endif", opener));
  return Finish(std::move(node));
}

absl::StatusOr<NodePtr> Parser::ParseFor(const Token& opener) {
  NodePtr node = MakeNode(NodeKind::kFor, opener.pos);
  ESTUARY_ASSIGN_OR_RETURN(NodePtr target, ParseExpressionSequence(/*primary_only=*/true));
  bool valid = target->kind == NodeKind::kName;
  if (target->kind == NodeKind::kTuple) {
    valid = std::all_of(target->args.begin(), target->args.end(),
                        [](const NodePtr& n) { return n->kind == NodeKind::kName; });
  }
  if (!valid) return ErrorAt(target->pos, "expected a name or names for the loop variable");
  if (!IsName("in")) return ErrorHere("expected 'in' after the loop variable");
  ++current_;
  ESTUARY_ASSIGN_OR_RETURN(NodePtr iterable, ParseExpression());
  NodePtr condition;
  if (iterable->kind == NodeKind::kSelect) {  // for x in xs if cond
    condition = std::move(iterable->args[1]);
    iterable = std::move(iterable->args[0]);
  }
  if (IsName("recursive")) return ErrorHere("unsupported construct 'recursive' loop");
  node->args.push_back(std::move(target));
  node->args.push_back(std::move(iterable));
  node->args.push_back(std::move(condition));
  ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
  ++loop_depth_;
  auto body = ParseBody({"endfor", "else"}, opener);
  --loop_depth_;
  if (!body.ok()) return body.status();
  node->body = std::move(*body);
  if (IsStatement({"else"})) {
    current_ += 2;
    ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    ESTUARY_ASSIGN_OR_RETURN(node->alternate, ParseBody({"endfor"}, opener));
  }
  ESTUARY_RETURN_IF_ERROR(ExpectEnd("endfor", opener));
  return Finish(std::move(node));
}

absl::StatusOr<NodePtr> Parser::ParseSet(const Token& opener) {
  NodePtr node = MakeNode(NodeKind::kSet, opener.pos);
  ESTUARY_ASSIGN_OR_RETURN(NodePtr target, ParseExpressionSequence(/*primary_only=*/false));
  bool valid = target->kind == NodeKind::kName ||
               (target->kind == NodeKind::kAttribute && target->args[0]->kind == NodeKind::kName);
  if (target->kind == NodeKind::kTuple) {
    valid = std::all_of(target->args.begin(), target->args.end(),
                        [](const NodePtr& n) { return n->kind == NodeKind::kName; });
  }
  if (!valid) {
    return ErrorAt(target->pos, "expected a name, names, or 'namespace.attribute' to assign to");
  }
  node->args.push_back(std::move(target));
  if (Is(TokenType::kEquals)) {
    ++current_;
    ESTUARY_ASSIGN_OR_RETURN(NodePtr value, ParseExpressionSequence(/*primary_only=*/false));
    node->args.push_back(std::move(value));
    ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
  } else {
    ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'=' or '%}'"));
    ESTUARY_ASSIGN_OR_RETURN(node->body, ParseBody({"endset"}, opener));
    ESTUARY_RETURN_IF_ERROR(ExpectEnd("endset", opener));
  }
  return Finish(std::move(node));
}

}  // namespace internal

absl::StatusOr<std::vector<NodePtr>> Parse(const std::vector<Token>& tokens) {
  return internal::Parser(tokens).ParseTemplate();
}

}  // namespace estuary::chat
