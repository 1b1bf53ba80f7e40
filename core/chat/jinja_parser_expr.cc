// Expression parsing, lowest precedence first: conditional, or, and, not, comparison and
// membership, + - ~, * / // %, **, `is` tests, `|` filters, unary signs, calls and member access,
// primaries. This is @huggingface/jinja's precedence (which differs from Python Jinja in that
// a unary sign binds tighter than a filter: `-x|abs` is `(-x)|abs`).

#include <charconv>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/chat/jinja_parser_impl.h"
#include "core/common/status_macros.h"

namespace estuary::chat::internal {
namespace {

NodePtr Binary(std::string op, NodePtr left, NodePtr right) {
  NodePtr node = Parser::MakeNode(NodeKind::kBinary, left->pos);
  node->text = std::move(op);
  node->args.push_back(std::move(left));
  node->args.push_back(std::move(right));
  return node;
}

}  // namespace

absl::StatusOr<NodePtr> Parser::ParseExpression() {
  DepthGuard guard(this);
  if (guard.exceeded())
    return ErrorHere(absl::StrCat("expression nesting deeper than ", kMaxNesting));
  ESTUARY_ASSIGN_OR_RETURN(NodePtr value, ParseOr());
  if (!IsName("if")) return value;
  const SourcePos pos = Next().pos;
  ESTUARY_ASSIGN_OR_RETURN(NodePtr test, ParseOr());
  if (IsName("else")) {
    ++current_;
    ESTUARY_ASSIGN_OR_RETURN(NodePtr otherwise, ParseExpression());
    NodePtr node = MakeNode(NodeKind::kTernary, pos);
    node->args.push_back(std::move(test));
    node->args.push_back(std::move(value));
    node->args.push_back(std::move(otherwise));
    return Finish(std::move(node));
  }
  NodePtr node = MakeNode(NodeKind::kSelect, pos);
  node->args.push_back(std::move(value));
  node->args.push_back(std::move(test));
  return Finish(std::move(node));
}

absl::StatusOr<NodePtr> Parser::ParseExpressionSequence(bool primary_only) {
  const SourcePos pos = AtEnd() ? SourcePos{} : Peek()->pos;
  ESTUARY_ASSIGN_OR_RETURN(NodePtr first, primary_only ? ParsePrimary() : ParseExpression());
  if (!Is(TokenType::kComma)) return first;
  NodePtr tuple = MakeNode(NodeKind::kTuple, pos);
  tuple->args.push_back(std::move(first));
  while (Is(TokenType::kComma)) {
    ++current_;
    ESTUARY_ASSIGN_OR_RETURN(NodePtr next, primary_only ? ParsePrimary() : ParseExpression());
    tuple->args.push_back(std::move(next));
  }
  return Finish(std::move(tuple));
}

absl::StatusOr<NodePtr> Parser::ParseOr() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr left, ParseAnd());
  while (IsName("or")) {
    ++current_;
    ESTUARY_ASSIGN_OR_RETURN(NodePtr right, ParseAnd());
    ESTUARY_ASSIGN_OR_RETURN(left, Finish(Binary("or", std::move(left), std::move(right))));
  }
  return left;
}

absl::StatusOr<NodePtr> Parser::ParseAnd() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr left, ParseNot());
  while (IsName("and")) {
    ++current_;
    ESTUARY_ASSIGN_OR_RETURN(NodePtr right, ParseNot());
    ESTUARY_ASSIGN_OR_RETURN(left, Finish(Binary("and", std::move(left), std::move(right))));
  }
  return left;
}

absl::StatusOr<NodePtr> Parser::ParseNot() {
  if (!IsName("not")) return ParseComparison();
  DepthGuard guard(this);
  if (guard.exceeded())
    return ErrorHere(absl::StrCat("expression nesting deeper than ", kMaxNesting));
  NodePtr node = MakeNode(NodeKind::kUnary, Next().pos);
  node->text = "not";
  ESTUARY_ASSIGN_OR_RETURN(NodePtr operand, ParseNot());
  node->args.push_back(std::move(operand));
  return Finish(std::move(node));
}

absl::StatusOr<NodePtr> Parser::ParseComparison() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr left, ParseAdditive());
  while (true) {
    std::string op;
    if (IsName("not") && IsName("in", 1)) {
      op = "not in";
      current_ += 2;
    } else if (IsName("in") || Is(TokenType::kComparison)) {
      op = Next().value;
    } else {
      return left;
    }
    ESTUARY_ASSIGN_OR_RETURN(NodePtr right, ParseAdditive());
    ESTUARY_ASSIGN_OR_RETURN(left, Finish(Binary(op, std::move(left), std::move(right))));
  }
}

absl::StatusOr<NodePtr> Parser::ParseAdditive() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr left, ParseMultiplicative());
  while (Is(TokenType::kAdditive)) {
    std::string op = Next().value;
    ESTUARY_ASSIGN_OR_RETURN(NodePtr right, ParseMultiplicative());
    ESTUARY_ASSIGN_OR_RETURN(left, Finish(Binary(op, std::move(left), std::move(right))));
  }
  return left;
}

absl::StatusOr<NodePtr> Parser::ParseMultiplicative() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr left, ParsePower());
  while (Is(TokenType::kMultiplicative)) {
    std::string op = Next().value;
    ESTUARY_ASSIGN_OR_RETURN(NodePtr right, ParsePower());
    ESTUARY_ASSIGN_OR_RETURN(left, Finish(Binary(op, std::move(left), std::move(right))));
  }
  return left;
}

absl::StatusOr<NodePtr> Parser::ParsePower() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr left, ParseTest());
  while (Is(TokenType::kPower)) {
    std::string op = Next().value;
    ESTUARY_ASSIGN_OR_RETURN(NodePtr right, ParseTest());
    ESTUARY_ASSIGN_OR_RETURN(left, Finish(Binary(op, std::move(left), std::move(right))));
  }
  return left;
}

absl::StatusOr<NodePtr> Parser::ParseTest() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr operand, ParseFilter());
  while (IsName("is")) {
    const SourcePos pos = Next().pos;
    NodePtr node = MakeNode(NodeKind::kTest, pos);
    node->flag = IsName("not");
    if (node->flag) ++current_;
    if (!Is(TokenType::kIdentifier)) return ErrorHere("expected a test name after 'is'");
    node->text = Next().value;
    if (Is(TokenType::kOpenParen)) {
      return ErrorHere(
          absl::StrCat("unsupported construct: test '", node->text, "' with arguments"));
    }
    node->args.push_back(std::move(operand));
    ESTUARY_ASSIGN_OR_RETURN(operand, Finish(std::move(node)));
  }
  return operand;
}

absl::StatusOr<NodePtr> Parser::ParseFilter() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr operand, ParseUnarySign());
  while (Is(TokenType::kPipe)) {
    ++current_;
    if (!Is(TokenType::kIdentifier)) return ErrorHere("expected a filter name after '|'");
    const Token& name = Next();
    NodePtr node = MakeNode(NodeKind::kFilter, name.pos);
    node->text = name.value;
    node->args.push_back(std::move(operand));
    if (Is(TokenType::kOpenParen)) {
      node->flag = true;
      ESTUARY_RETURN_IF_ERROR(ParseArguments(*node));
    }
    ESTUARY_ASSIGN_OR_RETURN(operand, Finish(std::move(node)));
  }
  return operand;
}

absl::StatusOr<NodePtr> Parser::ParseUnarySign() {
  if (!(Is(TokenType::kUnary) || Is(TokenType::kAdditive)) ||
      (Peek()->value != "-" && Peek()->value != "+")) {
    return ParseCallMember();
  }
  DepthGuard guard(this);
  if (guard.exceeded())
    return ErrorHere(absl::StrCat("expression nesting deeper than ", kMaxNesting));
  const Token& sign = Next();
  NodePtr node = MakeNode(NodeKind::kUnary, sign.pos);
  node->text = sign.value;
  ESTUARY_ASSIGN_OR_RETURN(NodePtr operand, ParseUnarySign());
  node->args.push_back(std::move(operand));
  return Finish(std::move(node));
}

absl::StatusOr<NodePtr> Parser::ParseCallMember() {
  ESTUARY_ASSIGN_OR_RETURN(NodePtr primary, ParsePrimary());
  ESTUARY_ASSIGN_OR_RETURN(NodePtr member, ParseMember(std::move(primary)));
  if (Is(TokenType::kOpenParen)) return ParseCall(std::move(member));
  return member;
}

absl::StatusOr<NodePtr> Parser::ParseCall(NodePtr callee) {
  // Iterative: f(a)(b).c(d) chains do not recurse.
  while (Is(TokenType::kOpenParen)) {
    NodePtr call = MakeNode(NodeKind::kCall, callee->pos);
    call->args.push_back(std::move(callee));
    ESTUARY_RETURN_IF_ERROR(ParseArguments(*call));
    ESTUARY_ASSIGN_OR_RETURN(NodePtr finished, Finish(std::move(call)));
    ESTUARY_ASSIGN_OR_RETURN(callee, ParseMember(std::move(finished)));
  }
  return callee;
}

// `( args )` appended to `call.args`; keyword arguments become kKeyword nodes.
absl::Status Parser::ParseArguments(Node& call) {
  ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kOpenParen, "'('"));
  bool saw_keyword = false;
  while (!Is(TokenType::kCloseParen)) {
    if (AtEnd()) return ErrorHere("expected ')'");
    if (Is(TokenType::kPower) || (Is(TokenType::kMultiplicative) && Peek()->value == "*")) {
      return ErrorHere("unsupported construct: argument unpacking");
    }
    ESTUARY_ASSIGN_OR_RETURN(NodePtr argument, ParseExpression());
    if (Is(TokenType::kEquals)) {
      if (argument->kind != NodeKind::kName) {
        return ErrorAt(argument->pos, "expected a name for the keyword argument");
      }
      ++current_;
      NodePtr keyword = MakeNode(NodeKind::kKeyword, argument->pos);
      keyword->text = argument->text;
      ESTUARY_ASSIGN_OR_RETURN(NodePtr value, ParseExpression());
      keyword->args.push_back(std::move(value));
      ESTUARY_ASSIGN_OR_RETURN(argument, Finish(std::move(keyword)));
      saw_keyword = true;
    } else if (saw_keyword) {
      return ErrorAt(argument->pos, "positional argument after a keyword argument");
    }
    call.args.push_back(std::move(argument));
    if (Is(TokenType::kComma)) ++current_;
  }
  ++current_;
  return absl::OkStatus();
}

absl::StatusOr<NodePtr> Parser::ParseMember(NodePtr object) {
  while (Is(TokenType::kDot) || Is(TokenType::kOpenBracket)) {
    const Token& op = Next();
    if (op.type == TokenType::kOpenBracket) {
      ESTUARY_ASSIGN_OR_RETURN(object, ParseSubscript(std::move(object), op));
      continue;
    }
    const Token* name = Peek();
    const bool digits = name && name->type == TokenType::kNumber &&
                        name->value.find_first_not_of("0123456789") == std::string::npos;
    if (!name || (name->type != TokenType::kIdentifier && !digits)) {
      return ErrorHere("expected an attribute name after '.'");
    }
    NodePtr node = MakeNode(NodeKind::kAttribute, name->pos);
    node->text = Next().value;
    node->args.push_back(std::move(object));
    ESTUARY_ASSIGN_OR_RETURN(object, Finish(std::move(node)));
  }
  return object;
}

// After `[`: an index `[e]` or a slice `[a:b:c]` (parts optional).
absl::StatusOr<NodePtr> Parser::ParseSubscript(NodePtr object, const Token& bracket) {
  std::vector<NodePtr> parts;
  bool is_slice = false;
  while (!Is(TokenType::kCloseBracket)) {
    if (AtEnd()) return ErrorHere("expected ']'");
    if (Is(TokenType::kColon)) {
      parts.push_back(nullptr);
      ++current_;
      is_slice = true;
      continue;
    }
    ESTUARY_ASSIGN_OR_RETURN(NodePtr part, ParseExpression());
    parts.push_back(std::move(part));
    if (Is(TokenType::kColon)) {
      ++current_;
      is_slice = true;
    } else if (!Is(TokenType::kCloseBracket)) {
      return ErrorHere("expected ':' or ']'");
    }
  }
  ++current_;
  if (parts.empty()) return ErrorAt(bracket.pos, "expected an index or slice inside '[]'");
  if (parts.size() > 3) return ErrorAt(bracket.pos, "a slice has at most three parts");
  NodePtr node = MakeNode(is_slice ? NodeKind::kSlice : NodeKind::kIndex, bracket.pos);
  node->args.push_back(std::move(object));
  for (NodePtr& part : parts) node->args.push_back(std::move(part));
  if (is_slice) node->args.resize(4);
  return Finish(std::move(node));
}

absl::StatusOr<NodePtr> Parser::ParsePrimary() {
  if (AtEnd()) return ErrorHere("expected an expression");
  const Token& token = Next();
  switch (token.type) {
    case TokenType::kNumber: {
      const std::string& v = token.value;
      const char* end = v.data() + v.size();
      if (v.find('.') == std::string::npos) {
        NodePtr node = MakeNode(NodeKind::kInteger, token.pos);
        const char* begin = v.data() + (v[0] == '+' ? 1 : 0);
        if (std::from_chars(begin, end, node->int_value).ptr != end) {
          return ErrorAt(token.pos, absl::StrCat("integer literal out of range: ", v));
        }
        return node;
      }
      NodePtr node = MakeNode(NodeKind::kFloat, token.pos);
      const char* begin = v.data() + (v[0] == '+' ? 1 : 0);
      std::from_chars(begin, end, node->float_value);
      return node;
    }
    case TokenType::kString: {
      NodePtr node = MakeNode(NodeKind::kString, token.pos);
      node->text = token.value;
      while (Is(TokenType::kString)) node->text += Next().value;  // "a" "b" is "ab"
      return node;
    }
    case TokenType::kIdentifier: {
      NodePtr node = MakeNode(NodeKind::kName, token.pos);
      node->text = token.value;
      return node;
    }
    case TokenType::kOpenParen: {
      ESTUARY_ASSIGN_OR_RETURN(NodePtr inner, ParseExpressionSequence(/*primary_only=*/false));
      ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kCloseParen, "')'"));
      return inner;
    }
    case TokenType::kOpenBracket:
    case TokenType::kOpenBrace: {
      const bool list = token.type == TokenType::kOpenBracket;
      const TokenType close = list ? TokenType::kCloseBracket : TokenType::kCloseBrace;
      NodePtr node = MakeNode(list ? NodeKind::kList : NodeKind::kDict, token.pos);
      while (!Is(close)) {
        if (AtEnd()) return ErrorHere(list ? "expected ']'" : "expected '}'");
        ESTUARY_ASSIGN_OR_RETURN(NodePtr item, ParseExpression());
        node->args.push_back(std::move(item));
        if (!list) {
          ESTUARY_RETURN_IF_ERROR(Expect(TokenType::kColon, "':' in a dict literal"));
          ESTUARY_ASSIGN_OR_RETURN(NodePtr value, ParseExpression());
          node->args.push_back(std::move(value));
        }
        if (Is(TokenType::kComma)) ++current_;
      }
      ++current_;
      return Finish(std::move(node));
    }
    default:
      --current_;
      return ErrorHere("expected an expression");
  }
}

}  // namespace estuary::chat::internal
