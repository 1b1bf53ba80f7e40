#pragma once
// The interpreter's library: filters, tests, member access, and the builtin functions (globals
// and string/dict methods), each behaving as in @huggingface/jinja. Functions here report errors
// without a source position; the interpreter prefixes the position of the expression that
// called them. Stateless apart from the Budget the caller passes; thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/chat/jinja_value.h"

namespace estuary::chat {

// Work and size limits of one render, shared by the interpreter and the builtins.
struct Budget {
  size_t max_string_bytes = 0;  // any string a render builds, the output included
  int64_t max_list_items = 0;   // any list a render builds (range(), +)
  int64_t max_steps = 0;        // evaluation steps; big copies count by size
  int64_t steps = 0;
  std::optional<int64_t> now_epoch_seconds;  // strftime_now's clock (UTC); unset: system clock
  // Every namespace the render created. Namespaces are the one mutable container, so they can
  // hold themselves or long chains; the render empties them all when it ends, which frees such
  // structures without leaks or deep recursive destruction.
  std::vector<std::shared_ptr<Object>> namespaces;

  absl::Status Charge(int64_t n);
  absl::Status CheckString(size_t bytes) const;
  absl::Status CheckList(size_t items) const;
};

inline constexpr char kRaisedPayload[] = "estuary.chat/raise_exception";

using Kwargs = std::vector<std::pair<std::string, Value>>;

struct CallArgs {
  std::vector<Value> positional;
  Kwargs keyword;
  const Value* Keyword(std::string_view name) const;
};

// `operand | name` (called: false) or `operand | name(args)` (called: true).
absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& operand, bool called,
                                  const CallArgs& args, Budget& budget);

// `operand is name`; `arg` is the second operand of two-argument tests (equalto) when a filter
// such as selectattr applies them.
absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& operand, const Value* arg);

// `object.key` and `object[key]`: dict entries, list and string indexes (negative from the
// end), and the builtin methods and `length` of strings, lists and dicts. Undefined when absent.
absl::StatusOr<Value> GetMember(const Value& object, const Value& key);

// `object[start:stop:step]` for lists and strings; each part is an integer or undefined.
absl::StatusOr<Value> SliceValue(const Value& object, const Value& start, const Value& stop,
                                 const Value& step, Budget& budget);

// Calls a builtin function value. raise_exception returns InvalidArgument with its message and
// the kRaisedPayload payload, so that callers can pass the template author's message through.
absl::StatusOr<Value> CallFunction(const Function& fn, const CallArgs& args, Budget& budget);

// The global names every render starts with: true/false/none (also capitalized), namespace,
// range, raise_exception, strftime_now.
Object MakeGlobals();

}  // namespace estuary::chat
