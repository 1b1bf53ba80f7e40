#include "core/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/chat/jinja_text.h"
#include "core/common/status_macros.h"

namespace estuary::chat {

const Value* Object::Find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::Set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::Null() {
  Value v;
  v.kind = ValueKind::kNull;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind = ValueKind::kBool;
  v.boolean = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind = ValueKind::kInt;
  v.integer = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind = ValueKind::kFloat;
  v.number = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind = ValueKind::kString;
  v.text = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::MakeArray(Array items) {
  Value v;
  v.kind = ValueKind::kArray;
  for (const Value& item : items) v.depth = std::max(v.depth, item.depth + 1);
  if (items.empty()) v.depth = 1;
  v.array = std::make_shared<const Array>(std::move(items));
  return v;
}
Value Value::MakeObject(Object object) {
  Value v;
  v.kind = ValueKind::kObject;
  v.depth = 1;
  for (const auto& entry : object.entries) v.depth = std::max(v.depth, entry.second.depth + 1);
  v.object = std::make_shared<Object>(std::move(object));
  return v;
}
Value Value::MakeNamespace(Object object) {
  Value v = MakeObject(std::move(object));
  v.kind = ValueKind::kNamespace;
  return v;
}

Value MakeFunction(Builtin id, Value receiver) {
  Value v;
  v.kind = ValueKind::kFunction;
  v.function = std::make_shared<const Function>(Function{id, std::move(receiver)});
  return v;
}

const char* KindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::kUndefined:
      return "undefined";
    case ValueKind::kNull:
      return "none";
    case ValueKind::kBool:
      return "boolean";
    case ValueKind::kInt:
      return "integer";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kString:
      return "string";
    case ValueKind::kArray:
      return "list";
    case ValueKind::kObject:
      return "dict";
    case ValueKind::kNamespace:
      return "namespace";
    case ValueKind::kFunction:
      return "function";
  }
  return "value";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case ValueKind::kUndefined:
    case ValueKind::kNull:
      return false;
    case ValueKind::kBool:
      return v.boolean;
    case ValueKind::kInt:
      return v.integer != 0;
    case ValueKind::kFloat:
      return v.number != 0 && !std::isnan(v.number);
    case ValueKind::kString:
      return !v.s().empty();
    case ValueKind::kArray:
      return !v.array->empty();
    case ValueKind::kObject:
      return !v.object->entries.empty();
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      return true;
  }
  return false;
}

namespace {

bool IsContainer(const Value& v) {
  return v.is(ValueKind::kArray) || v.is(ValueKind::kObject) || v.is(ValueKind::kNamespace) ||
         v.is(ValueKind::kFunction);
}

bool SameContainer(const Value& a, const Value& b) {
  if (a.is(ValueKind::kArray) || b.is(ValueKind::kArray)) return a.array == b.array;
  if (a.is(ValueKind::kFunction) || b.is(ValueKind::kFunction)) return a.function == b.function;
  return a.object == b.object;
}

// JavaScript's ToNumber for strings: whitespace trimmed, "" is 0, NaN when malformed.
double StringToNumber(std::string_view s) {
  s = Trim(s);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0' &&
      (s[1] == 'x' || s[1] == 'X' || s[1] == 'o' || s[1] == 'O' || s[1] == 'b' || s[1] == 'B')) {
    const int base = (s[1] == 'x' || s[1] == 'X') ? 16 : (s[1] == 'o' || s[1] == 'O') ? 8 : 2;
    uint64_t value = 0;
    const auto r = std::from_chars(s.data() + 2, s.data() + s.size(), value, base);
    return r.ptr == s.data() + s.size() && r.ec == std::errc() ? static_cast<double>(value) : NAN;
  }
  double sign = 1;
  if (s[0] == '+' || s[0] == '-') {
    sign = s[0] == '-' ? -1 : 1;
    s.remove_prefix(1);
  }
  if (s == "Infinity") return sign * INFINITY;
  if (s.find_first_not_of("0123456789.eE+-") != std::string_view::npos) return NAN;
  double value = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), value);
  return r.ptr == s.data() + s.size() ? sign * value : NAN;
}

}  // namespace

bool StrictEquals(const Value& a, const Value& b) {
  if (a.is_numeric() && b.is_numeric()) return a.as_double() == b.as_double();
  if (IsContainer(a) && IsContainer(b)) return SameContainer(a, b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case ValueKind::kUndefined:
    case ValueKind::kNull:
      return true;
    case ValueKind::kBool:
      return a.boolean == b.boolean;
    case ValueKind::kString:
      return a.s() == b.s();
    default:
      return false;
  }
}

bool LooseEquals(const Value& a, const Value& b) {
  const bool a_nullish = a.is_undefined() || a.is(ValueKind::kNull);
  const bool b_nullish = b.is_undefined() || b.is(ValueKind::kNull);
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (IsContainer(a) && IsContainer(b)) return SameContainer(a, b);
  if (IsContainer(a) || IsContainer(b)) {
    // JavaScript converts the container to a primitive string and compares again.
    const Value& container = IsContainer(a) ? a : b;
    const Value& other = IsContainer(a) ? b : a;
    if (!container.is(ValueKind::kArray) && !container.is(ValueKind::kObject)) return false;
    auto text = ToConcatString(container);
    return text.ok() && LooseEquals(Value::String(*text), other);
  }
  if (a.kind == b.kind || (a.is_numeric() && b.is_numeric())) return StrictEquals(a, b);
  // Booleans and strings compare as numbers with anything of another type.
  const auto to_number = [](const Value& v) {
    if (v.is(ValueKind::kBool)) return v.boolean ? 1.0 : 0.0;
    if (v.is(ValueKind::kString)) return StringToNumber(v.s());
    return v.as_double();
  };
  return to_number(a) == to_number(b);
}

absl::StatusOr<std::string> ToOutputString(const Value& v, size_t max_bytes) {
  switch (v.kind) {
    case ValueKind::kUndefined:
      return std::string("undefined");
    case ValueKind::kNull:
      return std::string("null");
    case ValueKind::kBool:
      return std::string(v.boolean ? "true" : "false");
    case ValueKind::kInt:
      return absl::StrCat(v.integer);
    case ValueKind::kFloat:
      return FormatFloatValue(v.number);
    case ValueKind::kString:
      return v.s();
    case ValueKind::kFunction:
      return std::string("[function]");
    default: {
      JsonOptions options;
      options.undefined_as_null = false;
      options.max_bytes = max_bytes;
      return ToJson(v, options);
    }
  }
}

absl::StatusOr<std::string> ToConcatString(const Value& v, size_t max_bytes) {
  switch (v.kind) {
    case ValueKind::kFloat:
      return FormatJsNumber(v.number);
    case ValueKind::kArray: {
      std::string out;
      for (size_t i = 0; i < v.array->size(); ++i) {
        if (i > 0) out += ",";
        ESTUARY_ASSIGN_OR_RETURN(std::string part, ToOutputString((*v.array)[i], max_bytes));
        out += part;
        if (out.size() > max_bytes) {
          return absl::InvalidArgumentError(
              absl::StrCat("template output exceeds ", max_bytes, " bytes"));
        }
      }
      return out;
    }
    case ValueKind::kObject:
    case ValueKind::kNamespace:
      return std::string("[object Map]");
    default:
      return ToOutputString(v, max_bytes);
  }
}

}  // namespace estuary::chat
