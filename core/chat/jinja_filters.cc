// Filters (`x | name`, `x | name(args)`) and tests (`x is name`), as @huggingface/jinja
// implements them: which filters exist depends on the operand's type, and an unknown
// filter/type pair is an error rather than a silent pass-through.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_text.h"
#include "core/common/status_macros.h"

namespace estuary::chat {
namespace {

absl::Status Error(std::string_view message) { return absl::InvalidArgumentError(Av(message)); }

absl::Status CannotApply(std::string_view name, const Value& operand) {
  return Error(absl::StrCat("cannot apply filter '", Av(name), "' to a ", KindName(operand.kind)));
}

// Positional argument `i`, else the keyword `name`, else `fallback`.
Value Arg(const CallArgs& args, size_t i, std::string_view name, Value fallback) {
  if (i < args.positional.size()) return args.positional[i];
  if (const Value* v = args.Keyword(name)) return *v;
  return fallback;
}

bool IsAttributeContainer(const Value& v) {
  return v.is(ValueKind::kObject) || v.is(ValueKind::kNamespace);
}

// `a.b.c` lookups for map(attribute=...) and sort(attribute=...); undefined when absent.
Value AttributePath(const Value& item, std::string_view path) {
  Value current = item;
  for (absl::string_view part : absl::StrSplit(Av(path), '.')) {
    if (IsAttributeContainer(current)) {
      const Value* next = current.object->Find(std::string_view(part.data(), part.size()));
      if (!next) return Value::Undefined();
      current = *next;
    } else if (current.is(ValueKind::kArray)) {
      int64_t index = 0;
      if (!absl::SimpleAtoi(part, &index) || index < 0 ||
          index >= static_cast<int64_t>(current.array->size())) {
        return Value::Undefined();
      }
      current = (*current.array)[index];
    } else {
      return Value::Undefined();
    }
  }
  return current;
}

// JavaScript's parseInt(s, 10) / parseFloat(s): a leading numeric prefix, or nothing.
std::optional<double> ParseLeadingNumber(std::string_view s, bool integer) {
  s = TrimLeft(s);
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  const size_t digits_start = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  bool any = i > digits_start;
  if (!integer) {
    if (i < s.size() && s[i] == '.') {
      ++i;
      const size_t frac = i;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      any = any || i > frac;
    }
    if (any && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      size_t j = i + 1;
      if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
      const size_t exp = j;
      while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
      if (j > exp) i = j;
    }
  }
  if (!any) return std::nullopt;
  return std::strtod(std::string(s.substr(0, i)).c_str(), nullptr);
}

absl::StatusOr<Value> ToJsonFilter(const Value& operand, bool called, const CallArgs& args,
                                   const Budget& budget) {
  JsonOptions options;
  options.max_bytes = budget.max_string_bytes;
  if (called) {
    const Value indent = Arg(args, SIZE_MAX, "indent", Value::Null());
    if (!indent.is(ValueKind::kInt) && !indent.is(ValueKind::kNull)) {
      return Error("tojson: indent must be an integer");
    }
    if (indent.is(ValueKind::kInt)) {
      if (indent.integer < 0 || indent.integer > 64) return Error("tojson: indent must be 0 to 64");
      options.indent = static_cast<int>(indent.integer);
    }
    const Value ascii = Arg(args, SIZE_MAX, "ensure_ascii", Value::Bool(false));
    const Value sort = Arg(args, SIZE_MAX, "sort_keys", Value::Bool(false));
    if (!ascii.is(ValueKind::kBool)) return Error("tojson: ensure_ascii must be a boolean");
    if (!sort.is(ValueKind::kBool)) return Error("tojson: sort_keys must be a boolean");
    options.ensure_ascii = ascii.boolean;
    options.sort_keys = sort.boolean;
    const Value separators = Arg(args, SIZE_MAX, "separators", Value::Null());
    if (separators.is(ValueKind::kArray)) {
      const Array& parts = *separators.array;
      if (parts.size() != 2 || !parts[0].is(ValueKind::kString) ||
          !parts[1].is(ValueKind::kString)) {
        return Error("tojson: separators must be a tuple of two strings");
      }
      options.separators = std::make_pair(parts[0].s(), parts[1].s());
    } else if (!separators.is(ValueKind::kNull)) {
      return Error("tojson: separators must be a tuple of two strings");
    }
  }
  ESTUARY_ASSIGN_OR_RETURN(std::string text, ToJson(operand, options));
  return Value::String(std::move(text));
}

absl::StatusOr<Value> Join(const Value& operand, const CallArgs& args, const Budget& budget) {
  const Value separator = Arg(args, 0, "separator", Value::String(""));
  if (!separator.is(ValueKind::kString)) return Error("join: the separator must be a string");
  std::string out;
  const auto append = [&](std::string_view piece, bool first) -> absl::Status {
    if (!first) out += separator.s();
    out += piece;
    return budget.CheckString(out.size());
  };
  if (operand.is(ValueKind::kString)) {
    bool first = true;
    for (std::string_view c : SplitChars(operand.s())) {
      ESTUARY_RETURN_IF_ERROR(append(c, first));
      first = false;
    }
  } else if (operand.is(ValueKind::kArray)) {
    for (size_t i = 0; i < operand.array->size(); ++i) {
      const Value& item = (*operand.array)[i];
      std::string piece;
      if (!item.is_undefined() && !item.is(ValueKind::kNull)) {  // JavaScript joins them as ""
        ESTUARY_ASSIGN_OR_RETURN(piece, ToConcatString(item, budget.max_string_bytes));
      }
      ESTUARY_RETURN_IF_ERROR(append(piece, i == 0));
    }
  } else {
    return CannotApply("join", operand);
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Indent(const std::string& s, const CallArgs& args, const Budget& budget) {
  const Value width = Arg(args, 0, "width", Value::Int(4));
  const Value first = Arg(args, 1, "first", Value::Bool(false));
  const Value blank = Arg(args, 2, "blank", Value::Bool(false));
  std::string pad;
  if (width.is(ValueKind::kString)) {
    pad = width.s();
  } else if (width.is(ValueKind::kInt)) {
    pad.assign(static_cast<size_t>(std::clamp<int64_t>(width.integer, 0, 1024)), ' ');
  } else {
    return Error("indent: width must be an integer or a string");
  }
  std::string out;
  size_t line = 0;
  for (absl::string_view part : absl::StrSplit(s, '\n')) {
    if (line > 0) out += '\n';
    const bool skip = (line == 0 && !Truthy(first)) || (part.empty() && !Truthy(blank));
    if (!skip) out += pad;
    out.append(part.data(), part.size());
    ESTUARY_RETURN_IF_ERROR(budget.CheckString(out.size()));
    ++line;
  }
  return Value::String(std::move(out));
}

// selectattr / rejectattr: items whose attribute passes the test (truthiness by default).
absl::StatusOr<Value> SelectAttr(const Value& operand, bool select, const CallArgs& args) {
  std::string_view name = select ? "selectattr" : "rejectattr";
  for (const Value& item : *operand.array) {
    if (!IsAttributeContainer(item)) {
      return Error(absl::StrCat(Av(name), " can only be applied to a list of dicts"));
    }
  }
  if (args.positional.empty() || !args.keyword.empty()) {
    return Error(absl::StrCat(Av(name),
                              " takes an attribute name, then optionally a test and its argument"));
  }
  for (const Value& a : args.positional) {
    if (!a.is(ValueKind::kString))
      return Error(absl::StrCat("the arguments of ", Av(name), " must be strings"));
  }
  const std::string& attribute = args.positional[0].s();
  const Value* test = args.positional.size() > 1 ? &args.positional[1] : nullptr;
  const Value* test_arg = args.positional.size() > 2 ? &args.positional[2] : nullptr;
  Array kept;
  for (const Value& item : *operand.array) {
    const Value* a = item.object->Find(attribute);
    bool pass = false;
    if (a) {
      if (test) {
        ESTUARY_ASSIGN_OR_RETURN(pass, ApplyTest(test->s(), *a, test_arg));
      } else {
        pass = Truthy(*a);
      }
    }
    if (pass == select) kept.push_back(item);
  }
  return Value::MakeArray(std::move(kept));
}

absl::StatusOr<Value> MapAttribute(const Value& operand, const CallArgs& args) {
  const Value* attribute = args.Keyword("attribute");
  if (!attribute) return Error("map is only supported with attribute=...");
  if (!attribute->is(ValueKind::kString)) return Error("map: attribute must be a string");
  const Value* fallback = args.Keyword("default");
  Array out;
  for (const Value& item : *operand.array) {
    if (!IsAttributeContainer(item)) return Error("map: the items must be dicts");
    Value v = AttributePath(item, attribute->s());
    out.push_back(v.is_undefined() && fallback ? *fallback : v);
  }
  return Value::MakeArray(std::move(out));
}

// Ordering for sort: numbers, strings (case-insensitively unless asked), booleans; mixed kinds
// and containers are refused, as in the reference.
absl::StatusOr<int> Compare(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_numeric() && b.is_numeric()) {
    return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  }
  if (a.is(ValueKind::kBool) && b.is(ValueKind::kBool)) return int(a.boolean) - int(b.boolean);
  if (a.is(ValueKind::kString) && b.is(ValueKind::kString)) {
    const std::string x = case_sensitive ? a.s() : AsciiLower(a.s());
    const std::string y = case_sensitive ? b.s() : AsciiLower(b.s());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  return Error(absl::StrCat("cannot compare a ", KindName(a.kind), " with a ", KindName(b.kind)));
}

absl::StatusOr<Value> Sort(const Value& operand, const CallArgs& args, Budget& budget) {
  const Value reverse = Arg(args, 0, "reverse", Value::Bool(false));
  const Value case_sensitive = Arg(args, 1, "case_sensitive", Value::Bool(false));
  const Value attribute = Arg(args, 2, "attribute", Value::Null());
  if (!reverse.is(ValueKind::kBool) || !case_sensitive.is(ValueKind::kBool)) {
    return Error("sort: reverse and case_sensitive must be booleans");
  }
  std::vector<std::pair<Value, Value>> keyed;  // (sort key, item)
  for (const Value& item : *operand.array) {
    Value key = item;
    if (attribute.is(ValueKind::kString)) key = AttributePath(item, attribute.s());
    if (attribute.is(ValueKind::kInt)) key = AttributePath(item, absl::StrCat(attribute.integer));
    keyed.emplace_back(std::move(key), item);
  }
  ESTUARY_RETURN_IF_ERROR(
      budget.Charge(static_cast<int64_t>(keyed.size() * (1 + std::log2(keyed.size() + 1)))));
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    if (!error.ok()) return false;
    absl::StatusOr<int> c = Compare(x.first, y.first, case_sensitive.boolean);
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return reverse.boolean ? *c > 0 : *c < 0;
  });
  ESTUARY_RETURN_IF_ERROR(error);
  Array out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::MakeArray(std::move(out));
}

absl::StatusOr<Value> NumberFilter(std::string_view name, const Value& operand,
                                   const CallArgs& args) {
  const bool integer = name == "int";
  const Value fallback = Arg(args, 0, "default", integer ? Value::Int(0) : Value::Float(0));
  if (operand.is(ValueKind::kString)) {
    std::optional<double> v = ParseLeadingNumber(operand.s(), integer);
    if (!v) return fallback;
    if (integer) return Value::Int(static_cast<int64_t>(std::clamp(*v, -9.2e18, 9.2e18)));
    return Value::Float(*v);
  }
  if (operand.is_numeric()) {
    if (!integer) return Value::Float(operand.as_double());
    return Value::Int(
        operand.is(ValueKind::kInt)
            ? operand.integer
            : static_cast<int64_t>(std::clamp(std::trunc(operand.number), -9.2e18, 9.2e18)));
  }
  if (operand.is(ValueKind::kBool)) {
    return integer ? Value::Int(operand.boolean) : Value::Float(operand.boolean ? 1 : 0);
  }
  return CannotApply(name, operand);
}

absl::StatusOr<Value> StringFilter(const Value& operand, const Budget& budget) {
  switch (operand.kind) {
    case ValueKind::kString:
      return operand;
    case ValueKind::kInt:
    case ValueKind::kFloat:
    case ValueKind::kBool: {
      ESTUARY_ASSIGN_OR_RETURN(std::string s, ToOutputString(operand));
      return Value::String(std::move(s));
    }
    case ValueKind::kArray: {
      JsonOptions options;
      options.undefined_as_null = false;
      options.max_bytes = budget.max_string_bytes;
      ESTUARY_ASSIGN_OR_RETURN(std::string s, ToJson(operand, options));
      return Value::String(std::move(s));
    }
    default:
      return CannotApply("string", operand);
  }
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& operand, bool called,
                                  const CallArgs& args, Budget& budget) {
  if (name == "safe") return operand;
  if (name == "tojson") return ToJsonFilter(operand, called, args, budget);
  if (called) {
    if (name == "join") return Join(operand, args, budget);
    if (name == "int" || name == "float") return NumberFilter(name, operand, args);
    if (name == "default") {
      const Value fallback = args.positional.empty() ? Value::String("") : args.positional[0];
      const Value boolean = Arg(args, 1, "boolean", Value::Bool(false));
      if (!boolean.is(ValueKind::kBool)) return Error("default: the flag must be a boolean");
      if (operand.is_undefined() || (boolean.boolean && !Truthy(operand))) return fallback;
      return operand;
    }
  }
  const CallArgs none;
  const CallArgs& a = called ? args : none;
  switch (operand.kind) {
    case ValueKind::kArray: {
      const Array& items = *operand.array;
      if (name == "list") return operand;
      if (name == "first") return items.empty() ? Value::Undefined() : items.front();
      if (name == "last") return items.empty() ? Value::Undefined() : items.back();
      if (name == "length") return Value::Int(static_cast<int64_t>(items.size()));
      if (name == "reverse") return Value::MakeArray(Array(items.rbegin(), items.rend()));
      if (name == "sort") return Sort(operand, a, budget);
      if (name == "join") return Join(operand, a, budget);
      if (name == "string") return StringFilter(operand, budget);
      if (name == "unique") {
        Array out;
        ESTUARY_RETURN_IF_ERROR(
            budget.Charge(static_cast<int64_t>(items.size() * items.size() / 64)));
        for (const Value& item : items) {
          const bool seen = std::any_of(out.begin(), out.end(),
                                        [&](const Value& o) { return StrictEquals(o, item); });
          if (!seen) out.push_back(item);
        }
        return Value::MakeArray(std::move(out));
      }
      if (called && (name == "selectattr" || name == "rejectattr")) {
        return SelectAttr(operand, name == "selectattr", args);
      }
      if (called && name == "map") return MapAttribute(operand, args);
      break;
    }
    case ValueKind::kString: {
      const std::string& s = operand.s();
      if (name == "length") return Value::Int(Utf16Length(s));
      if (name == "upper") return Value::String(AsciiUpper(s));
      if (name == "lower") return Value::String(AsciiLower(s));
      if (name == "title" || name == "capitalize") {
        ESTUARY_ASSIGN_OR_RETURN(Value method,
                                 GetMember(operand, Value::String(std::string(name))));
        return CallFunction(*method.function, CallArgs{}, budget);
      }
      if (name == "trim") return Value::String(std::string(Trim(s)));
      if (name == "indent") return Indent(s, a, budget);
      if (name == "join") return Join(operand, a, budget);
      if (name == "string") return operand;
      if (name == "int" || name == "float") return NumberFilter(name, operand, a);
      if (called && name == "replace") {
        ESTUARY_ASSIGN_OR_RETURN(Value method, GetMember(operand, Value::String("replace")));
        return CallFunction(*method.function, args, budget);
      }
      break;
    }
    case ValueKind::kInt:
    case ValueKind::kFloat: {
      if (name == "abs") {
        if (operand.is(ValueKind::kInt)) {
          if (operand.integer == INT64_MIN) return Error("abs: integer overflow");
          return Value::Int(std::llabs(operand.integer));
        }
        return Value::Float(std::fabs(operand.number));
      }
      if (name == "int" || name == "float") return NumberFilter(name, operand, a);
      if (name == "string") return StringFilter(operand, budget);
      break;
    }
    case ValueKind::kBool: {
      if (name == "bool") return operand;
      if (name == "int" || name == "float") return NumberFilter(name, operand, a);
      if (name == "string") return StringFilter(operand, budget);
      break;
    }
    case ValueKind::kObject:
    case ValueKind::kNamespace: {
      if (name == "items" && !called) {
        Array pairs;
        for (const auto& [k, v] : operand.object->entries) {
          pairs.push_back(Value::MakeArray({Value::String(k), v}));
        }
        return Value::MakeArray(std::move(pairs));
      }
      if (name == "length" && !called) {
        return Value::Int(static_cast<int64_t>(operand.object->entries.size()));
      }
      if (operand.is(ValueKind::kObject) &&
          (name == "keys" || name == "values" || name == "items" || name == "get")) {
        ESTUARY_ASSIGN_OR_RETURN(Value method,
                                 GetMember(operand, Value::String(std::string(name))));
        if (method.is(ValueKind::kFunction)) return CallFunction(*method.function, a, budget);
      }
      break;
    }
    default:
      break;
  }
  return Error(absl::StrCat("unknown filter '", Av(name), "' for a ", KindName(operand.kind)));
}

absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& operand, const Value* arg) {
  const auto lower_upper = [&](bool upper) {
    if (!operand.is(ValueKind::kString)) return false;
    return operand.s() == (upper ? AsciiUpper(operand.s()) : AsciiLower(operand.s()));
  };
  if (name == "defined") return !operand.is_undefined();
  if (name == "undefined") return operand.is_undefined();
  if (name == "none") return operand.is(ValueKind::kNull);
  if (name == "boolean") return operand.is(ValueKind::kBool);
  if (name == "true") return operand.is(ValueKind::kBool) && operand.boolean;
  if (name == "false") return operand.is(ValueKind::kBool) && !operand.boolean;
  if (name == "callable") return operand.is(ValueKind::kFunction);
  if (name == "string") return operand.is(ValueKind::kString);
  if (name == "number") return operand.is_numeric();
  if (name == "integer") return operand.is(ValueKind::kInt);
  if (name == "float") return operand.is(ValueKind::kFloat);
  if (name == "iterable") return operand.is(ValueKind::kArray) || operand.is(ValueKind::kString);
  if (name == "mapping") return operand.is(ValueKind::kObject);
  if (name == "sequence") {
    return operand.is(ValueKind::kArray) || operand.is(ValueKind::kObject) ||
           operand.is(ValueKind::kString);
  }
  if (name == "lower") return lower_upper(false);
  if (name == "upper") return lower_upper(true);
  if (name == "odd" || name == "even") {
    if (!operand.is(ValueKind::kInt)) {
      return Error(
          absl::StrCat("test '", Av(name), "' needs an integer, got a ", KindName(operand.kind)));
    }
    return (operand.integer % 2 != 0) == (name == "odd");
  }
  if (name == "equalto" || name == "eq") {
    return StrictEquals(operand, arg ? *arg : Value::Undefined());
  }
  return Error(absl::StrCat("unknown test '", Av(name), "'"));
}

}  // namespace estuary::chat
