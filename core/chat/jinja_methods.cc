// Member access, slicing, and the builtin functions: globals (range, namespace,
// raise_exception, strftime_now) and the methods of strings and dicts.

#include <algorithm>
#include <cmath>
#include <ctime>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_text.h"
#include "core/common/status_macros.h"

namespace estuary::chat {
namespace {

absl::Status Error(std::string_view message) { return absl::InvalidArgumentError(Av(message)); }

// Python-style slice bounds, as @huggingface/jinja computes them.
std::vector<int64_t> SliceIndexes(int64_t n, const Value& start_v, const Value& stop_v,
                                  int64_t step) {
  std::vector<int64_t> indexes;
  const bool has_start = !start_v.is_undefined(), has_stop = !stop_v.is_undefined();
  int64_t start = start_v.integer, stop = stop_v.integer;
  if (step >= 0) {
    start = !has_start ? 0 : start < 0 ? std::max<int64_t>(n + start, 0) : std::min(start, n);
    stop = !has_stop ? n : stop < 0 ? std::max<int64_t>(n + stop, 0) : std::min(stop, n);
    if (step == 0) return indexes;
    for (int64_t i = start; i < stop; i += step) indexes.push_back(i);
  } else {
    start = !has_start  ? n - 1
            : start < 0 ? std::max<int64_t>(n + start, -1)
                        : std::min(start, n - 1);
    stop = !has_stop ? -1 : stop < -1 ? std::max<int64_t>(n + stop, -1) : std::min(stop, n - 1);
    for (int64_t i = start; i > stop; i += step) indexes.push_back(i);
  }
  return indexes;
}

std::string TitleCase(std::string_view s) {
  std::string out(s);
  const auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  for (size_t i = 0; i < out.size(); ++i) {
    if (word(out[i]) && (i == 0 || !word(out[i - 1])) && out[i] >= 'a' && out[i] <= 'z') {
      out[i] = static_cast<char>(out[i] - 'a' + 'A');
    }
  }
  return out;
}

bool MatchesAffix(const Value& s, const Value& pattern, bool prefix, absl::Status* error) {
  const auto test = [&](const std::string& p) {
    const std::string& v = s.s();
    if (p.size() > v.size()) return false;
    return prefix ? v.compare(0, p.size(), p) == 0
                  : v.compare(v.size() - p.size(), p.size(), p) == 0;
  };
  if (pattern.is(ValueKind::kString)) return test(pattern.s());
  if (pattern.is(ValueKind::kArray)) {
    for (const Value& item : *pattern.array) {
      if (!item.is(ValueKind::kString)) {
        *error = Error("startswith()/endswith() tuple elements must be strings");
        return false;
      }
      if (test(item.s())) return true;
    }
    return false;
  }
  *error = Error("startswith()/endswith() argument must be a string or tuple of strings");
  return false;
}

absl::StatusOr<Value> Split(const std::string& s, const CallArgs& args) {
  const Value sep = args.positional.size() > 0 ? args.positional[0] : Value::Null();
  const Value max = args.positional.size() > 1 ? args.positional[1] : Value::Int(-1);
  if (!sep.is(ValueKind::kString) && !sep.is(ValueKind::kNull)) {
    return Error("split(): the separator must be a string or none");
  }
  if (!max.is(ValueKind::kInt)) return Error("split(): maxsplit must be an integer");
  Array parts;
  if (sep.is(ValueKind::kNull)) {
    std::string_view rest = TrimLeft(s);
    while (!rest.empty()) {
      if (max.integer >= 0 && static_cast<int64_t>(parts.size()) >= max.integer) {
        parts.push_back(Value::String(std::string(rest)));
        break;
      }
      size_t end = 0;
      while (end < rest.size() && WhitespaceLengthAt(rest, end) == 0)
        end += CharLengthAt(rest, end);
      parts.push_back(Value::String(std::string(rest.substr(0, end))));
      rest = TrimLeft(rest.substr(end));
    }
  } else {
    if (sep.s().empty()) return Error("split(): empty separator");
    std::vector<std::string> pieces = absl::StrSplit(s, sep.s());
    if (max.integer >= 0 && static_cast<int64_t>(pieces.size()) > max.integer) {
      std::vector<std::string> tail(pieces.begin() + max.integer, pieces.end());
      pieces.resize(max.integer);
      pieces.push_back(absl::StrJoin(tail, sep.s()));
    }
    for (std::string& p : pieces) parts.push_back(Value::String(std::move(p)));
  }
  return Value::MakeArray(std::move(parts));
}

absl::StatusOr<Value> Replace(const std::string& s, const CallArgs& args, Budget& budget) {
  if (args.positional.size() < 2) return Error("replace() needs two arguments");
  const Value& from = args.positional[0];
  const Value& to = args.positional[1];
  if (!from.is(ValueKind::kString) || !to.is(ValueKind::kString)) {
    return Error("replace() arguments must be strings");
  }
  Value count = Value::Null();
  if (args.positional.size() > 2) count = args.positional[2];
  if (const Value* kw = args.Keyword("count")) count = *kw;
  if (!count.is(ValueKind::kInt) && !count.is(ValueKind::kNull)) {
    return Error("replace() count must be an integer or none");
  }
  int64_t remaining = count.is(ValueKind::kInt) && count.integer >= 0 ? count.integer : INT64_MAX;
  std::string out;
  const std::string& f = from.s();
  if (f.empty()) {  // inserts between characters, as JavaScript's empty-pattern replace does
    const auto chars = SplitChars(s);
    for (size_t i = 0; i <= chars.size(); ++i) {
      if (remaining > 0) out += to.s(), --remaining;
      if (i < chars.size()) out += chars[i];
      ESTUARY_RETURN_IF_ERROR(budget.CheckString(out.size()));
    }
  } else {
    size_t pos = 0;
    for (size_t hit; remaining > 0 && (hit = s.find(f, pos)) != std::string::npos; --remaining) {
      out.append(s, pos, hit - pos).append(to.s());
      pos = hit + f.size();
      ESTUARY_RETURN_IF_ERROR(budget.CheckString(out.size()));
    }
    out.append(s, pos);
  }
  ESTUARY_RETURN_IF_ERROR(budget.CheckString(out.size()));
  ESTUARY_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(out.size() / 16)));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Range(const CallArgs& args, Budget& budget) {
  if (!args.keyword.empty()) return Error("range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3)
    return Error("range() takes 1 to 3 integers");
  for (const Value& v : args.positional) {
    if (!v.is(ValueKind::kInt)) return Error("range() arguments must be integers");
  }
  int64_t start = 0, stop = args.positional[0].integer, step = 1;
  if (args.positional.size() >= 2) start = stop, stop = args.positional[1].integer;
  if (args.positional.size() == 3) step = args.positional[2].integer;
  if (step == 0) return Error("range() step must not be zero");
  const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - start) / step));
  ESTUARY_RETURN_IF_ERROR(budget.CheckList(static_cast<size_t>(std::min(count, 1e18))));
  ESTUARY_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(count)));
  Array items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::Int(i));
  return Value::MakeArray(std::move(items));
}

absl::StatusOr<Value> Namespace(const CallArgs& args, Budget& budget) {
  if (args.positional.size() > 1) return Error("namespace() takes at most one positional argument");
  Object entries;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is(ValueKind::kObject)) {
      entries.entries = source.object->entries;
    } else if (source.is(ValueKind::kArray)) {
      for (const Value& pair : *source.array) {
        if (!pair.is(ValueKind::kArray) || pair.array->size() != 2 ||
            !(*pair.array)[0].is(ValueKind::kString)) {
          return Error("namespace() expects a dict or a list of [key, value] pairs");
        }
        entries.Set((*pair.array)[0].s(), (*pair.array)[1]);
      }
    } else {
      return Error(absl::StrCat("namespace() cannot take a ", KindName(source.kind)));
    }
  }
  for (const auto& [key, value] : args.keyword) entries.Set(key, value);
  Value ns = Value::MakeNamespace(std::move(entries));
  if (ns.depth > kMaxValueDepth) return Error("namespace() value nests too deeply");
  budget.namespaces.push_back(ns.object);
  return ns;
}

// The directives @huggingface/jinja implements (%Y %m %d %b %B %H %M %%), in UTC and English;
// anything else is copied as written.
absl::StatusOr<Value> StrftimeNow(const CallArgs& args, const Budget& budget) {
  if (args.positional.empty() || !args.positional[0].is(ValueKind::kString)) {
    return Error("strftime_now() takes a format string");
  }
  static constexpr const char* kMonths[] = {"January",   "February", "March",    "April",
                                            "May",       "June",     "July",     "August",
                                            "September", "October",  "November", "December"};
  const std::time_t now = budget.now_epoch_seconds ? *budget.now_epoch_seconds : std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  const auto pad2 = [](int n) { return absl::StrCat(n < 10 ? "0" : "", n); };
  const std::string& format = args.positional[0].s();
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    switch (format[++i]) {
      case 'Y':
        out += absl::StrCat(tm.tm_year + 1900);
        break;
      case 'm':
        out += pad2(tm.tm_mon + 1);
        break;
      case 'd':
        out += pad2(tm.tm_mday);
        break;
      case 'b':
        out += std::string(kMonths[tm.tm_mon]).substr(0, 3);
        break;
      case 'B':
        out += kMonths[tm.tm_mon];
        break;
      case 'H':
        out += pad2(tm.tm_hour);
        break;
      case 'M':
        out += pad2(tm.tm_min);
        break;
      case '%':
        out += "%";
        break;
      default:
        out.push_back('%'), out.push_back(format[i]);
    }
  }
  return Value::String(std::move(out));
}

}  // namespace

absl::Status Budget::Charge(int64_t n) {
  steps += n;
  if (steps > max_steps) {
    return Error(absl::StrCat("template rendering exceeded ", max_steps, " evaluation steps"));
  }
  return absl::OkStatus();
}

absl::Status Budget::CheckString(size_t bytes) const {
  if (bytes > max_string_bytes) {
    return Error(absl::StrCat("template output exceeds ", max_string_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status Budget::CheckList(size_t items) const {
  if (items > static_cast<size_t>(max_list_items)) {
    return Error(absl::StrCat("template builds a list longer than ", max_list_items, " items"));
  }
  return absl::OkStatus();
}

const Value* CallArgs::Keyword(std::string_view name) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

absl::StatusOr<Value> GetMember(const Value& object, const Value& key) {
  static constexpr std::pair<std::string_view, Builtin> kStringMethods[] = {
      {"upper", Builtin::kStrUpper},           {"lower", Builtin::kStrLower},
      {"strip", Builtin::kStrStrip},           {"lstrip", Builtin::kStrLstrip},
      {"rstrip", Builtin::kStrRstrip},         {"title", Builtin::kStrTitle},
      {"capitalize", Builtin::kStrCapitalize}, {"startswith", Builtin::kStrStartswith},
      {"endswith", Builtin::kStrEndswith},     {"split", Builtin::kStrSplit},
      {"replace", Builtin::kStrReplace}};
  static constexpr std::pair<std::string_view, Builtin> kDictMethods[] = {
      {"get", Builtin::kDictGet},
      {"items", Builtin::kDictItems},
      {"keys", Builtin::kDictKeys},
      {"values", Builtin::kDictValues}};
  const bool dict = object.is(ValueKind::kObject) || object.is(ValueKind::kNamespace);
  const bool sequence = object.is(ValueKind::kArray) || object.is(ValueKind::kString);
  if (key.is(ValueKind::kInt) && sequence) {
    if (object.is(ValueKind::kArray)) {
      const int64_t n = static_cast<int64_t>(object.array->size());
      const int64_t i = key.integer < 0 ? key.integer + n : key.integer;
      return i >= 0 && i < n ? (*object.array)[i] : Value::Undefined();
    }
    const auto chars = SplitChars(object.s());
    const int64_t n = static_cast<int64_t>(chars.size());
    const int64_t i = key.integer < 0 ? key.integer + n : key.integer;
    return i >= 0 && i < n ? Value::String(std::string(chars[i])) : Value::Undefined();
  }
  if (!key.is(ValueKind::kString)) {
    return Error(
        absl::StrCat("cannot index a ", KindName(object.kind), " with a ", KindName(key.kind)));
  }
  const std::string& name = key.s();
  if (dict) {
    if (const Value* v = object.object->Find(name)) return *v;
    if (object.is(ValueKind::kObject)) {
      for (const auto& [n, id] : kDictMethods) {
        if (n == name) return MakeFunction(id, object);
      }
    }
    return Value::Undefined();
  }
  if (object.is(ValueKind::kArray) && name == "length") {
    return Value::Int(static_cast<int64_t>(object.array->size()));
  }
  if (object.is(ValueKind::kString)) {
    if (name == "length") return Value::Int(Utf16Length(object.s()));
    for (const auto& [n, id] : kStringMethods) {
      if (n == name) return MakeFunction(id, object);
    }
  }
  return Value::Undefined();
}

absl::StatusOr<Value> SliceValue(const Value& object, const Value& start, const Value& stop,
                                 const Value& step, Budget& budget) {
  if (!object.is(ValueKind::kArray) && !object.is(ValueKind::kString)) {
    return Error(absl::StrCat("cannot slice a ", KindName(object.kind)));
  }
  for (const Value* part : {&start, &stop, &step}) {
    if (!part->is(ValueKind::kInt) && !part->is_undefined()) {
      return Error("slice bounds must be integers");
    }
  }
  const int64_t s = step.is_undefined() ? 1 : step.integer;
  if (object.is(ValueKind::kArray)) {
    const auto indexes = SliceIndexes(static_cast<int64_t>(object.array->size()), start, stop, s);
    ESTUARY_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(indexes.size())));
    Array items;
    items.reserve(indexes.size());
    for (int64_t i : indexes) items.push_back((*object.array)[i]);
    return Value::MakeArray(std::move(items));
  }
  const auto chars = SplitChars(object.s());
  std::string out;
  for (int64_t i : SliceIndexes(static_cast<int64_t>(chars.size()), start, stop, s))
    out += chars[i];
  ESTUARY_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(out.size() / 16)));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> CallFunction(const Function& fn, const CallArgs& args, Budget& budget) {
  const Value& self = fn.receiver;
  const auto arg = [&](size_t i) {
    return i < args.positional.size() ? args.positional[i] : Value();
  };
  switch (fn.id) {
    case Builtin::kRaiseException: {
      std::vector<std::string> parts;
      for (const Value& v : args.positional) {
        ESTUARY_ASSIGN_OR_RETURN(std::string part, ToOutputString(v));
        parts.push_back(std::move(part));
      }
      absl::Status raised = absl::InvalidArgumentError(absl::StrJoin(parts, ","));
      raised.SetPayload(kRaisedPayload, absl::Cord("1"));
      return raised;
    }
    case Builtin::kRange:
      return Range(args, budget);
    case Builtin::kNamespace:
      return Namespace(args, budget);
    case Builtin::kStrftimeNow:
      return StrftimeNow(args, budget);
    case Builtin::kStrUpper:
      return Value::String(AsciiUpper(self.s()));
    case Builtin::kStrLower:
      return Value::String(AsciiLower(self.s()));
    case Builtin::kStrStrip:
      return Value::String(std::string(Trim(self.s())));
    case Builtin::kStrLstrip:
      return Value::String(std::string(TrimLeft(self.s())));
    case Builtin::kStrRstrip:
      return Value::String(std::string(TrimRight(self.s())));
    case Builtin::kStrTitle:
      return Value::String(TitleCase(self.s()));
    case Builtin::kStrCapitalize: {
      std::string s = self.s();
      if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
      return Value::String(std::move(s));
    }
    case Builtin::kStrStartswith:
    case Builtin::kStrEndswith: {
      if (args.positional.empty()) return Error("startswith()/endswith() need an argument");
      absl::Status error;
      const bool hit = MatchesAffix(self, arg(0), fn.id == Builtin::kStrStartswith, &error);
      if (!error.ok()) return error;
      return Value::Bool(hit);
    }
    case Builtin::kStrSplit:
      return Split(self.s(), args);
    case Builtin::kStrReplace:
      return Replace(self.s(), args, budget);
    case Builtin::kDictGet: {
      if (!arg(0).is(ValueKind::kString)) return Error("dict.get() key must be a string");
      if (const Value* v = self.object->Find(arg(0).s())) return *v;
      return args.positional.size() > 1 ? arg(1) : Value::Null();
    }
    case Builtin::kDictItems:
    case Builtin::kDictKeys:
    case Builtin::kDictValues: {
      Array items;
      for (const auto& [k, v] : self.object->entries) {
        if (fn.id == Builtin::kDictKeys) {
          items.push_back(Value::String(k));
        } else if (fn.id == Builtin::kDictValues) {
          items.push_back(v);
        } else {
          items.push_back(Value::MakeArray({Value::String(k), v}));
        }
      }
      return Value::MakeArray(std::move(items));
    }
  }
  return Error("unknown function");
}

Object MakeGlobals() {
  Object globals;
  for (const char* name : {"true", "True"}) globals.Set(name, Value::Bool(true));
  for (const char* name : {"false", "False"}) globals.Set(name, Value::Bool(false));
  for (const char* name : {"none", "None"}) globals.Set(name, Value::Null());
  globals.Set("raise_exception", MakeFunction(Builtin::kRaiseException));
  globals.Set("range", MakeFunction(Builtin::kRange));
  globals.Set("namespace", MakeFunction(Builtin::kNamespace));
  globals.Set("strftime_now", MakeFunction(Builtin::kStrftimeNow));
  return globals;
}

}  // namespace estuary::chat
