// JSON in and out of the interpreter: request context (nlohmann JSON) -> Value, and the
// `tojson` filter / container printing (Value -> text). The output layout is Python
// json.dumps's (", " and ": ", or "," with indent), with JavaScript's number formatting and
// string escaping, as @huggingface/jinja produces.

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/chat/jinja_text.h"
#include "core/chat/jinja_value.h"
#include "core/common/status_macros.h"

namespace estuary::chat {
namespace {

template <typename Json>
absl::StatusOr<Value> Convert(const Json& json, int depth) {
  if (depth > kMaxValueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template context nests deeper than ", kMaxValueDepth));
  }
  switch (json.type()) {
    case nlohmann::json::value_t::null:
      return Value::Null();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = json.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::Int(static_cast<int64_t>(u));
      return Value::Float(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float: {
      // As in JavaScript (the reference), an integral number is an integer: 2.0 is 2.
      const double f = json.template get<double>();
      if (std::isfinite(f) && f == std::trunc(f) && std::fabs(f) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(f));
      }
      return Value::Float(f);
    }
    case nlohmann::json::value_t::string:
      return Value::String(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Array items;
      items.reserve(json.size());
      for (const auto& item : json) {
        ESTUARY_ASSIGN_OR_RETURN(Value v, Convert(item, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::MakeArray(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Object object;
      object.entries.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) {
        ESTUARY_ASSIGN_OR_RETURN(Value v, Convert(it.value(), depth + 1));
        object.entries.emplace_back(it.key(), std::move(v));
      }
      return Value::MakeObject(std::move(object));
    }
    default:
      return absl::InvalidArgumentError("chat template context holds binary data");
  }
}

void AppendHex4(std::string& out, uint32_t unit) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", unit);
  out += buf;
}

// JSON.stringify's string escaping; with ensure_ascii, every UTF-16 unit >= 0x7f is escaped.
void AppendJsonString(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (c < 0x20 || (c == 0x7f && ensure_ascii)) {
            AppendHex4(out, c);
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    const size_t n = CharLengthAt(s, i);
    uint32_t cp = 0xFFFD;
    if (n > 1) {
      cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    const bool lone_surrogate = cp >= 0xD800 && cp <= 0xDFFF;
    if (ensure_ascii || lone_surrogate) {
      if (cp >= 0x10000) {
        AppendHex4(out, 0xD800 + ((cp - 0x10000) >> 10));
        AppendHex4(out, 0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        AppendHex4(out, cp);
      }
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  out.push_back('"');
}

bool KeyLess(const std::string& a, const std::string& b) {
  const std::string la = AsciiLower(a), lb = AsciiLower(b);
  if (la != lb) return la < lb;
  return a > b;  // lower case first, as in a locale collation
}

absl::Status Write(const Value& v, const JsonOptions& options, int depth, std::string& out) {
  if (depth > kMaxValueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("value nests deeper than ", kMaxValueDepth, " (or contains itself)"));
  }
  const bool indent = options.indent.has_value() && *options.indent > 0;
  const std::string item_sep =
      options.separators ? options.separators->first : (indent ? "," : ", ");
  const std::string key_sep = options.separators ? options.separators->second : ": ";
  const std::string unit = indent ? std::string(*options.indent, ' ') : "";
  std::string base = "\n";
  for (int i = 0; i < depth; ++i) base += unit;
  const std::string child = base + unit;
  if (out.size() > options.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("template output exceeds ", options.max_bytes, " bytes"));
  }
  switch (v.kind) {
    case ValueKind::kUndefined:
      out += options.undefined_as_null ? "null" : "undefined";
      break;
    case ValueKind::kNull:
      out += "null";
      break;
    case ValueKind::kBool:
      out += v.boolean ? "true" : "false";
      break;
    case ValueKind::kInt:
      out += absl::StrCat(v.integer);
      break;
    case ValueKind::kFloat:
      out += std::isfinite(v.number) ? FormatJsNumber(v.number) : "null";
      break;
    case ValueKind::kString:
      AppendJsonString(out, v.s(), options.ensure_ascii);
      break;
    case ValueKind::kArray: {
      out.push_back('[');
      for (size_t i = 0; i < v.array->size(); ++i) {
        if (i > 0) out += item_sep;
        if (indent) out += child;
        ESTUARY_RETURN_IF_ERROR(Write((*v.array)[i], options, depth + 1, out));
      }
      if (indent && !v.array->empty()) out += base;
      out.push_back(']');
      break;
    }
    case ValueKind::kObject:
    case ValueKind::kNamespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.object->entries) entries.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return KeyLess(a->first, b->first); });
      }
      out.push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_sep;
        if (indent) out += child;
        AppendJsonString(out, entries[i]->first, options.ensure_ascii);
        out += key_sep;
        ESTUARY_RETURN_IF_ERROR(Write(entries[i]->second, options, depth + 1, out));
      }
      if (indent && !entries.empty()) out += base;
      out.push_back('}');
      break;
    }
    case ValueKind::kFunction:
      return absl::InvalidArgumentError("cannot convert a function to JSON");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Value> ValueFromJson(const nlohmann::json& json) { return Convert(json, 0); }
absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json) { return Convert(json, 0); }

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  ESTUARY_RETURN_IF_ERROR(Write(v, options, 0, out));
  if (out.size() > options.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("template output exceeds ", options.max_bytes, " bytes"));
  }
  return out;
}

}  // namespace estuary::chat
