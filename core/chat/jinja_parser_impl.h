#pragma once
// The parser's internals, shared by jinja_parser.cc (statements) and jinja_parser_expr.cc
// (expressions). Not part of the library's interface.

#include <initializer_list>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/chat/jinja_ast.h"
#include "core/chat/jinja_lexer.h"
#include "core/chat/jinja_parser.h"

namespace estuary::chat::internal {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  absl::StatusOr<std::vector<NodePtr>> ParseTemplate();

  // Expressions (jinja_parser_expr.cc).
  absl::StatusOr<NodePtr> ParseExpression();
  absl::StatusOr<NodePtr> ParseExpressionSequence(bool primary_only);

 private:
  // Statements (jinja_parser.cc).
  absl::StatusOr<std::vector<NodePtr>> ParseBody(std::initializer_list<std::string_view> stops,
                                                 const Token& opener);
  absl::StatusOr<NodePtr> ParseStatement();
  absl::StatusOr<NodePtr> ParseIf(const Token& opener);
  absl::StatusOr<NodePtr> ParseFor(const Token& opener);
  absl::StatusOr<NodePtr> ParseSet(const Token& opener);
  absl::Status ExpectEnd(std::string_view name, const Token& opener);

  absl::StatusOr<NodePtr> ParseOr();
  absl::StatusOr<NodePtr> ParseAnd();
  absl::StatusOr<NodePtr> ParseNot();
  absl::StatusOr<NodePtr> ParseComparison();
  absl::StatusOr<NodePtr> ParseAdditive();
  absl::StatusOr<NodePtr> ParseMultiplicative();
  absl::StatusOr<NodePtr> ParsePower();
  absl::StatusOr<NodePtr> ParseTest();
  absl::StatusOr<NodePtr> ParseFilter();
  absl::StatusOr<NodePtr> ParseUnarySign();
  absl::StatusOr<NodePtr> ParseCallMember();
  absl::StatusOr<NodePtr> ParseCall(NodePtr callee);
  absl::StatusOr<NodePtr> ParseMember(NodePtr object);
  absl::StatusOr<NodePtr> ParseSubscript(NodePtr object, const Token& bracket);
  absl::StatusOr<NodePtr> ParsePrimary();
  absl::Status ParseArguments(Node& call);

 public:
  // Token helpers.
  bool AtEnd() const { return current_ >= tokens_.size(); }
  const Token* Peek(size_t ahead = 0) const {
    return current_ + ahead < tokens_.size() ? &tokens_[current_ + ahead] : nullptr;
  }
  bool Is(TokenType type) const { return Peek() && Peek()->type == type; }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    const Token* t = Peek(ahead);
    return t && t->type == TokenType::kIdentifier && t->value == name;
  }
  // At `{% name`, for one of `names`.
  bool IsStatement(std::initializer_list<std::string_view> names) const;
  const Token& Next() { return tokens_[current_++]; }
  absl::Status Expect(TokenType type, std::string_view what);
  absl::Status ErrorAt(SourcePos pos, std::string_view message) const;
  absl::Status ErrorHere(std::string_view message) const;
  // Sets the node's depth from its children and refuses trees deeper than kMaxNesting.
  absl::StatusOr<NodePtr> Finish(NodePtr node) const;
  static NodePtr MakeNode(NodeKind kind, SourcePos pos);

  // Bounds the parser's own recursion.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* p) : p_(p) { ++p_->depth_; }
    ~DepthGuard() { --p_->depth_; }
    bool exceeded() const { return p_->depth_ > kMaxNesting; }

   private:
    Parser* p_;
  };

 private:
  const std::vector<Token>& tokens_;
  size_t current_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // for break/continue
};

}  // namespace estuary::chat::internal
