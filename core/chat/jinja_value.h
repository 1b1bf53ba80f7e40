#pragma once
// Runtime values of the Jinja interpreter and their conversions. The semantics are those of
// @huggingface/jinja (the reference renderer for chat templates), which follows JavaScript where
// Python Jinja and JavaScript differ: booleans print as `true`/`false`, `none` prints as nothing,
// integral JSON numbers are integers, `==` compares lists and dicts by identity, and lists and
// dicts print as JSON. Strings are UTF-8 bytes.
//
// Ownership: scalars and strings are held by value; lists, dicts, namespaces and functions are
// shared (shared_ptr), so copying a Value is cheap and preserves identity. Lists and dicts are
// immutable once built; a namespace is the one mutable container (`{% set ns.x = 1 %}`), owned
// by the render that created it. Values never cross renders, so no locking is needed.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace estuary::chat {

enum class ValueKind {
  kUndefined,
  kNull,
  kBool,
  kInt,
  kFloat,
  kString,
  kArray,
  kObject,
  kNamespace,
  kFunction
};

struct Value;
struct Function;
using Array = std::vector<Value>;

// A dict in insertion order (as Python and JavaScript keep them).
struct Object {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
};

struct Value {
  ValueKind kind = ValueKind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::shared_ptr<const std::string> text;  // kString; shared so that copies are cheap
  std::shared_ptr<const Array> array;
  std::shared_ptr<Object> object;  // kObject (never mutated) or kNamespace
  std::shared_ptr<const Function> function;
  // Container nesting height (0 for scalars), computed when a list or dict is built; bounded by
  // kMaxValueDepth so that destroying or walking a value cannot exhaust the stack.
  int depth = 0;

  static Value Undefined() { return Value{}; }
  static Value Null();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeArray(Array items);
  static Value MakeObject(Object object);
  static Value MakeNamespace(Object object);

  const std::string& s() const { return *text; }
  bool is(ValueKind k) const { return kind == k; }
  bool is_undefined() const { return kind == ValueKind::kUndefined; }
  bool is_numeric() const { return kind == ValueKind::kInt || kind == ValueKind::kFloat; }
  double as_double() const {
    return kind == ValueKind::kInt ? static_cast<double>(integer) : number;
  }
};

// Builtin callables: global functions and the methods of strings and dicts.
enum class Builtin {
  kRaiseException,
  kRange,
  kNamespace,
  kStrftimeNow,
  kStrUpper,
  kStrLower,
  kStrStrip,
  kStrLstrip,
  kStrRstrip,
  kStrTitle,
  kStrCapitalize,
  kStrStartswith,
  kStrEndswith,
  kStrSplit,
  kStrReplace,
  kDictGet,
  kDictItems,
  kDictKeys,
  kDictValues,
};

struct Function {
  Builtin id;
  Value receiver;  // the string or dict a method is bound to
};

Value MakeFunction(Builtin id, Value receiver = Value());

// "string", "list", ... for error messages.
const char* KindName(ValueKind kind);

// Containers nest at most this deep (input JSON, and printing or serializing values, which
// also stops a namespace that contains itself).
inline constexpr int kMaxValueDepth = 256;

absl::StatusOr<Value> ValueFromJson(const nlohmann::json& json);
absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json);

bool Truthy(const Value& v);
// `==` (JavaScript loose equality on the underlying values; containers by identity).
bool LooseEquals(const Value& a, const Value& b);
// `in` over a list, `unique`, and the `equalto` test (strict equality; containers by identity).
bool StrictEquals(const Value& a, const Value& b);

// The text `{{ v }}` prints (callers skip null and undefined): floats keep a decimal ("2.0"),
// containers print as JSON.
absl::StatusOr<std::string> ToOutputString(const Value& v, size_t max_bytes = SIZE_MAX);
// The text `+` and `~` concatenate: like ToOutputString except floats ("2") and containers
// (a list joins its items with ",", a dict is "[object Map]", as in JavaScript).
absl::StatusOr<std::string> ToConcatString(const Value& v, size_t max_bytes = SIZE_MAX);

struct JsonOptions {
  std::optional<int> indent;  // pretty-print with this many spaces
  bool ensure_ascii = false;
  bool sort_keys = false;  // approximates JavaScript's localeCompare with ASCII case folding
  std::optional<std::pair<std::string, std::string>> separators;  // item, key
  bool undefined_as_null = true;
  size_t max_bytes = SIZE_MAX;  // refuse (InvalidArgument) output longer than this
};
// The `tojson` filter (Python json.dumps layout, JavaScript number and string escaping).
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

}  // namespace estuary::chat
