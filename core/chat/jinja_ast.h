#pragma once
// The Jinja syntax tree built by the parser (jinja_parser.h) and walked by the interpreter
// (jinja_render.h). One node type with a kind tag keeps the tree small and the interpreter a
// plain switch. Nodes own their children (unique_ptr); a parsed tree is immutable and shared by
// concurrent renders.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/chat/jinja_lexer.h"

namespace estuary::chat {

enum class NodeKind {
  // Statements (appear in bodies).
  kText,    // literal text: `text`
  kOutput,  // {{ args[0] }}
  kIf,      // if args[0]: body, else alternate (an `elif` is a nested kIf in alternate)
  kFor,     // for args[0] (identifier or tuple) in args[1] [if args[2]]: body, else alternate
  kSet,     // set args[0] = args[1], or set args[0] %}body{% endset
  kBreak,
  kContinue,
  // Expressions.
  kString,     // text
  kInteger,    // int_value
  kFloat,      // float_value
  kName,       // text (variable, also true/false/none which resolve like variables)
  kList,       // [args...]
  kTuple,      // (args...) or a, b
  kDict,       // {args[0]: args[1], args[2]: args[3], ...}
  kAttribute,  // args[0].text (text is a name or digits)
  kIndex,      // args[0][args[1]]
  kSlice,      // args[0][args[1]:args[2]:args[3]] (missing parts are null)
  kCall,       // args[0](args[1...]); keyword arguments are kKeyword nodes
  kKeyword,    // text=args[0] (only as a call argument)
  kFilter,     // args[0] | text(args[1...]); flag: written with parentheses
  kTest,       // args[0] is [not] text; flag: negated
  kUnary,      // text args[0], text in {not, -, +}
  kBinary,     // args[0] text args[1]
  kTernary,    // args[1] if args[0] else args[2]
  kSelect,     // args[0] if args[1] (no else: undefined when false; filters a for loop)
};

struct Node {
  NodeKind kind;
  SourcePos pos;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  bool flag = false;
  int depth = 1;                            // height of the subtree, bounded by the parser
  std::vector<std::unique_ptr<Node>> args;  // operands; a null entry is an omitted slice part
  std::vector<std::unique_ptr<Node>> body;
  std::vector<std::unique_ptr<Node>> alternate;
};

using NodePtr = std::unique_ptr<Node>;

}  // namespace estuary::chat
