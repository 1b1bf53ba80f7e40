#include "core/chat/jinja_render.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_text.h"
#include "core/common/status_macros.h"

namespace estuary::chat {
namespace {

// A variable scope: the template's top level, or one for loop (as in Jinja, `set` inside a
// loop does not leak out of it; namespaces are how templates carry state across iterations).
struct Scope {
  Object vars;
  const Scope* parent = nullptr;

  Value Lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      if (const Value* v = s->vars.Find(name)) return *v;
    }
    return Value::Undefined();
  }
};

enum class Flow { kNormal, kBreak, kContinue };

absl::Status Raise(SourcePos pos, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(FormatPos(pos), ": ", Av(message)));
}

// Errors from the builtins carry no position: prefix the expression's. raise_exception's message
// is the template author's and passes through unchanged.
absl::Status Locate(SourcePos pos, absl::Status status) {
  if (status.ok() || status.GetPayload(kRaisedPayload).has_value()) return status;
  if (status.message().rfind("line ", 0) == 0) return status;  // already located
  return absl::Status(status.code(), absl::StrCat(FormatPos(pos), ": ", status.message()));
}

template <typename T>
absl::StatusOr<T> Locate(SourcePos pos, absl::StatusOr<T> result) {
  if (result.ok()) return result;
  return Locate(pos, result.status());
}

bool IsNullish(const Value& v) { return v.is_undefined() || v.is(ValueKind::kNull); }

class Interpreter {
 public:
  explicit Interpreter(const RenderLimits& limits) {
    budget_.max_string_bytes = limits.max_output_bytes;
    budget_.max_steps = limits.max_steps;
    budget_.max_list_items = limits.max_list_items;
    budget_.now_epoch_seconds = limits.now_epoch_seconds;
  }
  ~Interpreter() {
    for (const auto& ns : budget_.namespaces) ns->entries.clear();
  }

  absl::Status Exec(const std::vector<NodePtr>& body, Scope& scope, std::string& out, Flow& flow);

 private:
  absl::Status ExecFor(const Node& node, Scope& scope, std::string& out);
  absl::Status ExecSet(const Node& node, Scope& scope);
  absl::Status Append(std::string& out, std::string_view text, SourcePos pos) {
    out += text;
    return Locate(pos, budget_.CheckString(out.size()));
  }

  absl::StatusOr<Value> Eval(const Node& node, const Scope& scope);
  absl::StatusOr<Value> EvalBinary(const Node& node, const Scope& scope);
  absl::StatusOr<Value> Arithmetic(const Node& node, const Value& a, const Value& b);
  absl::StatusOr<CallArgs> EvalArgs(const Node& node, size_t first, const Scope& scope);
  absl::StatusOr<Value> Container(const Node& node, const Scope& scope);

  Budget budget_;
};

absl::Status Interpreter::Exec(const std::vector<NodePtr>& body, Scope& scope, std::string& out,
                               Flow& flow) {
  for (const NodePtr& statement : body) {
    ESTUARY_RETURN_IF_ERROR(Locate(statement->pos, budget_.Charge(1)));
    const Node& node = *statement;
    switch (node.kind) {
      case NodeKind::kText:
        ESTUARY_RETURN_IF_ERROR(Append(out, node.text, node.pos));
        break;
      case NodeKind::kOutput: {
        ESTUARY_ASSIGN_OR_RETURN(Value v, Eval(*node.args[0], scope));
        if (IsNullish(v)) break;
        ESTUARY_ASSIGN_OR_RETURN(std::string text,
                                 Locate(node.pos, ToOutputString(v, budget_.max_string_bytes)));
        ESTUARY_RETURN_IF_ERROR(Append(out, text, node.pos));
        break;
      }
      case NodeKind::kIf: {
        ESTUARY_ASSIGN_OR_RETURN(Value test, Eval(*node.args[0], scope));
        ESTUARY_RETURN_IF_ERROR(Exec(Truthy(test) ? node.body : node.alternate, scope, out, flow));
        if (flow != Flow::kNormal) return absl::OkStatus();
        break;
      }
      case NodeKind::kFor:
        ESTUARY_RETURN_IF_ERROR(ExecFor(node, scope, out));
        break;
      case NodeKind::kSet:
        ESTUARY_RETURN_IF_ERROR(ExecSet(node, scope));
        break;
      case NodeKind::kBreak:
        flow = Flow::kBreak;
        return absl::OkStatus();
      case NodeKind::kContinue:
        flow = Flow::kContinue;
        return absl::OkStatus();
      default:
        return Raise(node.pos, "internal error: expression in statement position");
    }
  }
  return absl::OkStatus();
}

void BindTarget(const Node& target, const Value& value, Scope& scope) {
  if (target.kind == NodeKind::kName) {
    scope.vars.Set(target.text, value);
    return;
  }
  for (size_t i = 0; i < target.args.size(); ++i) {  // a tuple, validated against the value
    scope.vars.Set(target.args[i]->text, (*value.array)[i]);
  }
}

absl::Status CheckUnpack(const Node& target, const Value& value) {
  if (target.kind != NodeKind::kTuple) return absl::OkStatus();
  if (!value.is(ValueKind::kArray)) {
    return Raise(target.pos, absl::StrCat("cannot unpack a ", KindName(value.kind)));
  }
  if (value.array->size() != target.args.size()) {
    return Raise(target.pos, absl::StrCat("expected ", target.args.size(),
                                          " values to unpack, got ", value.array->size()));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ExecFor(const Node& node, Scope& scope, std::string& out) {
  const Node& target = *node.args[0];
  const Node* condition = node.args[2].get();
  Scope loop_scope{Object{}, &scope};
  ESTUARY_ASSIGN_OR_RETURN(Value iterable, Eval(*node.args[1], loop_scope));
  Array candidates;
  if (iterable.is(ValueKind::kArray)) {
    candidates = *iterable.array;
  } else if (iterable.is(ValueKind::kObject)) {
    for (const auto& entry : iterable.object->entries)
      candidates.push_back(Value::String(entry.first));
  } else {
    return Raise(node.args[1]->pos, absl::StrCat("cannot loop over a ", KindName(iterable.kind)));
  }
  Array items;
  for (const Value& item : candidates) {
    ESTUARY_RETURN_IF_ERROR(CheckUnpack(target, item));
    if (condition) {
      Scope test_scope{Object{}, &loop_scope};
      BindTarget(target, item, test_scope);
      ESTUARY_ASSIGN_OR_RETURN(Value pass, Eval(*condition, test_scope));
      if (!Truthy(pass)) continue;
    }
    items.push_back(item);
  }
  bool iterated = false;
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    ESTUARY_RETURN_IF_ERROR(Locate(node.pos, budget_.Charge(1)));
    Object loop;
    loop.entries = {
        {"index", Value::Int(i + 1)},
        {"index0", Value::Int(i)},
        {"revindex", Value::Int(n - i)},
        {"revindex0", Value::Int(n - i - 1)},
        {"first", Value::Bool(i == 0)},
        {"last", Value::Bool(i == n - 1)},
        {"length", Value::Int(n)},
        {"previtem", i > 0 ? items[i - 1] : Value::Undefined()},
        {"nextitem", i + 1 < n ? items[i + 1] : Value::Undefined()},
    };
    loop_scope.vars.Set("loop", Value::MakeObject(std::move(loop)));
    BindTarget(target, items[i], loop_scope);
    Flow flow = Flow::kNormal;
    ESTUARY_RETURN_IF_ERROR(Exec(node.body, loop_scope, out, flow));
    if (flow == Flow::kBreak) break;
    // As in the reference, an iteration left by `continue` does not count as one for `else`.
    if (flow == Flow::kContinue) continue;
    iterated = true;
  }
  if (!iterated) {
    Flow flow = Flow::kNormal;
    ESTUARY_RETURN_IF_ERROR(Exec(node.alternate, loop_scope, out, flow));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ExecSet(const Node& node, Scope& scope) {
  const Node& target = *node.args[0];
  Value value;
  if (node.args.size() > 1) {
    ESTUARY_ASSIGN_OR_RETURN(value, Eval(*node.args[1], scope));
  } else {
    std::string text;
    Flow flow = Flow::kNormal;
    ESTUARY_RETURN_IF_ERROR(Exec(node.body, scope, text, flow));
    value = Value::String(std::move(text));
  }
  if (target.kind == NodeKind::kAttribute) {
    Value object = scope.Lookup(target.args[0]->text);
    if (!object.is(ValueKind::kNamespace)) {
      return Raise(target.pos, absl::StrCat("cannot set an attribute of a ", KindName(object.kind),
                                            " (only of a namespace)"));
    }
    if (value.depth >= kMaxValueDepth) return Raise(target.pos, "value nests too deeply");
    object.object->Set(target.text, std::move(value));
    return absl::OkStatus();
  }
  ESTUARY_RETURN_IF_ERROR(CheckUnpack(target, value));
  BindTarget(target, value, scope);
  return absl::OkStatus();
}

absl::StatusOr<CallArgs> Interpreter::EvalArgs(const Node& node, size_t first, const Scope& scope) {
  CallArgs args;
  for (size_t i = first; i < node.args.size(); ++i) {
    const Node& arg = *node.args[i];
    if (arg.kind == NodeKind::kKeyword) continue;
    ESTUARY_ASSIGN_OR_RETURN(Value v, Eval(arg, scope));
    args.positional.push_back(std::move(v));
  }
  for (size_t i = first; i < node.args.size(); ++i) {
    const Node& arg = *node.args[i];
    if (arg.kind != NodeKind::kKeyword) continue;
    if (args.Keyword(arg.text)) {
      return Raise(arg.pos, absl::StrCat("keyword argument '", arg.text, "' given twice"));
    }
    ESTUARY_ASSIGN_OR_RETURN(Value v, Eval(*arg.args[0], scope));
    args.keyword.emplace_back(arg.text, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Interpreter::Container(const Node& node, const Scope& scope) {
  if (node.kind == NodeKind::kDict) {
    Object object;
    for (size_t i = 0; i + 1 < node.args.size(); i += 2) {
      ESTUARY_ASSIGN_OR_RETURN(Value key, Eval(*node.args[i], scope));
      if (!key.is(ValueKind::kString)) {
        return Raise(node.args[i]->pos,
                     absl::StrCat("dict keys must be strings, got a ", KindName(key.kind)));
      }
      ESTUARY_ASSIGN_OR_RETURN(Value value, Eval(*node.args[i + 1], scope));
      object.Set(key.s(), std::move(value));
    }
    Value v = Value::MakeObject(std::move(object));
    if (v.depth > kMaxValueDepth) return Raise(node.pos, "value nests too deeply");
    return v;
  }
  Array items;
  for (const NodePtr& item : node.args) {
    ESTUARY_ASSIGN_OR_RETURN(Value v, Eval(*item, scope));
    items.push_back(std::move(v));
  }
  Value v = Value::MakeArray(std::move(items));
  if (v.depth > kMaxValueDepth) return Raise(node.pos, "value nests too deeply");
  return v;
}

absl::StatusOr<Value> Interpreter::Eval(const Node& node, const Scope& scope) {
  ESTUARY_RETURN_IF_ERROR(Locate(node.pos, budget_.Charge(1)));
  switch (node.kind) {
    case NodeKind::kString:
      return Value::String(node.text);
    case NodeKind::kInteger:
      return Value::Int(node.int_value);
    case NodeKind::kFloat:
      return Value::Float(node.float_value);
    case NodeKind::kName:
      return scope.Lookup(node.text);
    case NodeKind::kList:
    case NodeKind::kTuple:
    case NodeKind::kDict:
      return Container(node, scope);
    case NodeKind::kAttribute: {
      ESTUARY_ASSIGN_OR_RETURN(Value object, Eval(*node.args[0], scope));
      const bool digits = !node.text.empty() && node.text[0] >= '0' && node.text[0] <= '9';
      Value key = digits ? Value::Int(std::stoll(node.text)) : Value::String(node.text);
      return Locate(node.pos, GetMember(object, key));
    }
    case NodeKind::kIndex: {
      ESTUARY_ASSIGN_OR_RETURN(Value object, Eval(*node.args[0], scope));
      ESTUARY_ASSIGN_OR_RETURN(Value key, Eval(*node.args[1], scope));
      return Locate(node.pos, GetMember(object, key));
    }
    case NodeKind::kSlice: {
      ESTUARY_ASSIGN_OR_RETURN(Value object, Eval(*node.args[0], scope));
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (node.args[i + 1]) {
          ESTUARY_ASSIGN_OR_RETURN(parts[i], Eval(*node.args[i + 1], scope));
        }
      }
      return Locate(node.pos, SliceValue(object, parts[0], parts[1], parts[2], budget_));
    }
    case NodeKind::kCall: {
      ESTUARY_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(node, 1, scope));
      ESTUARY_ASSIGN_OR_RETURN(Value callee, Eval(*node.args[0], scope));
      if (!callee.is(ValueKind::kFunction)) {
        return Raise(node.pos, absl::StrCat("cannot call a ", KindName(callee.kind)));
      }
      return Locate(node.pos, CallFunction(*callee.function, args, budget_));
    }
    case NodeKind::kFilter: {
      ESTUARY_ASSIGN_OR_RETURN(Value operand, Eval(*node.args[0], scope));
      ESTUARY_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(node, 1, scope));
      return Locate(node.pos, ApplyFilter(node.text, operand, node.flag, args, budget_));
    }
    case NodeKind::kTest: {
      ESTUARY_ASSIGN_OR_RETURN(Value operand, Eval(*node.args[0], scope));
      ESTUARY_ASSIGN_OR_RETURN(bool pass, Locate(node.pos, ApplyTest(node.text, operand, nullptr)));
      return Value::Bool(pass != node.flag);
    }
    case NodeKind::kUnary: {
      ESTUARY_ASSIGN_OR_RETURN(Value v, Eval(*node.args[0], scope));
      if (node.text == "not") return Value::Bool(!Truthy(v));
      const bool negate = node.text == "-";
      if (v.is(ValueKind::kFloat)) return Value::Float(negate ? -v.number : v.number);
      if (v.is(ValueKind::kInt) || v.is(ValueKind::kBool)) {
        const int64_t i = v.is(ValueKind::kBool) ? v.boolean : v.integer;
        if (negate && i == INT64_MIN) return Raise(node.pos, "integer overflow");
        return Value::Int(negate ? -i : i);
      }
      return Raise(node.pos,
                   absl::StrCat("cannot apply unary '", node.text, "' to a ", KindName(v.kind)));
    }
    case NodeKind::kBinary:
      return EvalBinary(node, scope);
    case NodeKind::kTernary: {
      ESTUARY_ASSIGN_OR_RETURN(Value test, Eval(*node.args[0], scope));
      return Eval(*node.args[Truthy(test) ? 1 : 2], scope);
    }
    case NodeKind::kSelect: {
      ESTUARY_ASSIGN_OR_RETURN(Value test, Eval(*node.args[1], scope));
      if (!Truthy(test)) return Value::Undefined();
      return Eval(*node.args[0], scope);
    }
    default:
      return Raise(node.pos, "internal error: statement in expression position");
  }
}

absl::StatusOr<Value> Interpreter::Arithmetic(const Node& node, const Value& a, const Value& b) {
  const std::string& op = node.text;
  const bool is_float = a.is(ValueKind::kFloat) || b.is(ValueKind::kFloat);
  if (op == "<") return Value::Bool(a.as_double() < b.as_double());
  if (op == ">") return Value::Bool(a.as_double() > b.as_double());
  if (op == "<=") return Value::Bool(a.as_double() <= b.as_double());
  if (op == ">=") return Value::Bool(a.as_double() >= b.as_double());
  if (op == "/") return Value::Float(a.as_double() / b.as_double());
  if (is_float) {
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "//") return Value::Float(std::floor(x / y));
    if (op == "%") return Value::Float(std::fmod(x, y));
  } else {
    const int64_t x = a.integer, y = b.integer;
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
    if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
    if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
    if (op == "//" || op == "%") {
      if (y == 0) return Raise(node.pos, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return Raise(node.pos, "integer overflow");
      if (op == "//") {
        r = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --r;  // floor, as Python
      } else {
        r = x % y;  // the sign of the dividend, as JavaScript's %
      }
    }
    if (overflow) return Raise(node.pos, "integer overflow");
    if (op == "+" || op == "-" || op == "*" || op == "//" || op == "%") return Value::Int(r);
  }
  return Raise(node.pos, absl::StrCat("unknown operator '", op, "'"));
}

absl::StatusOr<Value> Interpreter::EvalBinary(const Node& node, const Scope& scope) {
  const std::string& op = node.text;
  ESTUARY_ASSIGN_OR_RETURN(Value a, Eval(*node.args[0], scope));
  if (op == "and") return Truthy(a) ? Eval(*node.args[1], scope) : a;
  if (op == "or") return Truthy(a) ? a : Eval(*node.args[1], scope);
  ESTUARY_ASSIGN_OR_RETURN(Value b, Eval(*node.args[1], scope));
  if (op == "==") return Value::Bool(LooseEquals(a, b));
  if (op == "!=") return Value::Bool(!LooseEquals(a, b));
  const size_t max_bytes = budget_.max_string_bytes;
  const auto concat = [&](const Value& x, const Value& y) -> absl::StatusOr<Value> {
    std::string left, right;
    if (!x.is_undefined()) {
      ESTUARY_ASSIGN_OR_RETURN(left, Locate(node.pos, ToConcatString(x, max_bytes)));
    }
    if (!y.is_undefined()) {
      ESTUARY_ASSIGN_OR_RETURN(right, Locate(node.pos, ToConcatString(y, max_bytes)));
    }
    ESTUARY_RETURN_IF_ERROR(Locate(node.pos, budget_.CheckString(left.size() + right.size())));
    ESTUARY_RETURN_IF_ERROR(
        Locate(node.pos, budget_.Charge(static_cast<int64_t>((left.size() + right.size()) / 64))));
    return Value::String(left + right);
  };
  if (a.is_numeric() && b.is_numeric() && op != "~" && op != "**") return Arithmetic(node, a, b);
  if (a.is_undefined() || b.is_undefined()) {
    if (b.is_undefined() && (op == "in" || op == "not in")) return Value::Bool(op == "not in");
    if (op == "~" && !a.is(ValueKind::kNull) && !b.is(ValueKind::kNull)) return concat(a, b);
    return Raise(node.pos, absl::StrCat("cannot apply '", op, "' to an undefined value"));
  }
  if (a.is(ValueKind::kNull) || b.is(ValueKind::kNull)) {
    return Raise(node.pos, absl::StrCat("cannot apply '", op, "' to none"));
  }
  if (op == "~") return concat(a, b);
  if (op == "**") {
    const auto numeric = [](const Value& v) { return v.is_numeric() || v.is(ValueKind::kBool); };
    if (numeric(a) && numeric(b)) {
      const double x = a.is(ValueKind::kBool) ? a.boolean : a.as_double();
      const double y = b.is(ValueKind::kBool) ? b.boolean : b.as_double();
      if (x == 0 && y < 0) return Raise(node.pos, "0.0 cannot be raised to a negative power");
      const double r = std::pow(x, y);
      if (!std::isfinite(r)) return Raise(node.pos, "exponentiation result is not a finite number");
      if (a.is(ValueKind::kFloat) || b.is(ValueKind::kFloat) || y < 0) return Value::Float(r);
      if (std::fabs(r) >= 9.2e18) return Raise(node.pos, "integer overflow");
      return Value::Int(static_cast<int64_t>(r));
    }
  }
  if (a.is(ValueKind::kArray) && b.is(ValueKind::kArray)) {
    if (op == "+") {
      ESTUARY_RETURN_IF_ERROR(
          Locate(node.pos, budget_.CheckList(a.array->size() + b.array->size())));
      ESTUARY_RETURN_IF_ERROR(Locate(
          node.pos, budget_.Charge(static_cast<int64_t>(a.array->size() + b.array->size()))));
      Array items = *a.array;
      items.insert(items.end(), b.array->begin(), b.array->end());
      return Value::MakeArray(std::move(items));
    }
  } else if (b.is(ValueKind::kArray) && (op == "in" || op == "not in")) {
    ESTUARY_RETURN_IF_ERROR(
        Locate(node.pos, budget_.Charge(static_cast<int64_t>(b.array->size()))));
    bool member = false;
    for (const Value& item : *b.array) member = member || StrictEquals(item, a);
    return Value::Bool(member == (op == "in"));
  }
  if ((a.is(ValueKind::kString) || b.is(ValueKind::kString)) && op == "+") return concat(a, b);
  if (a.is(ValueKind::kString) && b.is(ValueKind::kString) && (op == "in" || op == "not in")) {
    return Value::Bool((b.s().find(a.s()) != std::string::npos) == (op == "in"));
  }
  if (a.is(ValueKind::kString) && (b.is(ValueKind::kObject) || b.is(ValueKind::kNamespace)) &&
      (op == "in" || op == "not in")) {
    return Value::Bool((b.object->Find(a.s()) != nullptr) == (op == "in"));
  }
  return Raise(node.pos, absl::StrCat("unsupported operator '", op, "' between a ",
                                      KindName(a.kind), " and a ", KindName(b.kind)));
}

}  // namespace

absl::StatusOr<std::string> RenderProgram(const std::vector<NodePtr>& program,
                                          const Object& context, const RenderLimits& limits) {
  Interpreter interpreter(limits);
  Scope globals{MakeGlobals(), nullptr};
  for (const auto& [name, value] : context.entries) globals.vars.Set(name, value);
  std::string out;
  Flow flow = Flow::kNormal;
  ESTUARY_RETURN_IF_ERROR(interpreter.Exec(program, globals, out, flow));
  return out;
}

}  // namespace estuary::chat
