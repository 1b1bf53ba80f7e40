#include "router/openai/request_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "router/openai/api_error.h"

namespace estuary::openai {
namespace {

std::string TypeName(const nlohmann::json& value) { return value.type_name(); }

bool IsInteger(const nlohmann::json& value) {
  if (value.is_number_integer()) return true;
  if (!value.is_number_float()) return false;
  const double d = value.get<double>();
  return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15;
}

int64_t AsInteger(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return static_cast<int64_t>(value.get<double>());
}

}  // namespace

const nlohmann::json* Field(const nlohmann::json& body, absl::string_view name) {
  const auto it = body.find(std::string(name));
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> BoolField(const nlohmann::json& body, absl::string_view name, bool otherwise) {
  const nlohmann::json* value = Field(body, name);
  if (value == nullptr) return otherwise;
  if (!value->is_boolean()) {
    return InvalidField(name, absl::StrCat("must be a boolean, not ", TypeName(*value)));
  }
  return value->get<bool>();
}

absl::StatusOr<std::string> StringField(const nlohmann::json& body, absl::string_view name,
                                        std::string otherwise) {
  const nlohmann::json* value = Field(body, name);
  if (value == nullptr) return otherwise;
  if (!value->is_string()) {
    return InvalidField(name, absl::StrCat("must be a string, not ", TypeName(*value)));
  }
  return value->get<std::string>();
}

absl::StatusOr<double> NumberField(const nlohmann::json& body, absl::string_view name,
                                   double otherwise, double low, double high) {
  const nlohmann::json* value = Field(body, name);
  if (value == nullptr) return otherwise;
  if (!value->is_number()) {
    return InvalidField(name, absl::StrCat("must be a number, not ", TypeName(*value)));
  }
  const double d = value->get<double>();
  if (!(d >= low && d <= high)) {
    return InvalidField(name, absl::StrCat("= ", value->dump(), " must be in [", low, ", ", high, "]"));
  }
  return d;
}

absl::StatusOr<int64_t> IntField(const nlohmann::json& body, absl::string_view name,
                                 int64_t otherwise, int64_t low, int64_t high) {
  const nlohmann::json* value = Field(body, name);
  if (value == nullptr) return otherwise;
  if (!IsInteger(*value)) {
    return InvalidField(name, absl::StrCat("must be an integer, not ", value->dump()));
  }
  const int64_t i = AsInteger(*value);
  if (i < low || i > high) {
    return InvalidField(name, absl::StrCat("= ", value->dump(), " must be in [", low, ", ", high, "]"));
  }
  return i;
}

absl::StatusOr<std::vector<std::string>> StringsField(const nlohmann::json& body,
                                                      absl::string_view name, size_t max_items) {
  const nlohmann::json* value = Field(body, name);
  std::vector<std::string> out;
  if (value == nullptr) return out;
  if (value->is_string()) {
    out.push_back(value->get<std::string>());
    return out;
  }
  if (!value->is_array()) {
    return InvalidField(name, absl::StrCat("must be a string or a list of strings, not ",
                                           TypeName(*value)));
  }
  if (value->size() > max_items) {
    return InvalidField(name, absl::StrCat("has ", value->size(), " items; at most ", max_items));
  }
  for (size_t i = 0; i < value->size(); ++i) {
    if (!(*value)[i].is_string()) {
      return InvalidField(name, absl::StrCat("[", i, "] must be a string, not ",
                                             TypeName((*value)[i])));
    }
    out.push_back((*value)[i].get<std::string>());
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> IntsField(const nlohmann::json& body, absl::string_view name,
                                               size_t max_items, int64_t low, int64_t high) {
  const nlohmann::json* value = Field(body, name);
  std::vector<int64_t> out;
  if (value == nullptr) return out;
  if (!value->is_array()) {
    return InvalidField(name, absl::StrCat("must be a list of integers, not ", TypeName(*value)));
  }
  if (value->size() > max_items) {
    return InvalidField(name, absl::StrCat("has ", value->size(), " items; at most ", max_items));
  }
  for (size_t i = 0; i < value->size(); ++i) {
    const nlohmann::json& item = (*value)[i];
    if (!IsInteger(item) || AsInteger(item) < low || AsInteger(item) > high) {
      return InvalidField(name, absl::StrCat("[", i, "] = ", item.dump(),
                                             " must be an integer in [", low, ", ", high, "]"));
    }
    out.push_back(AsInteger(item));
  }
  return out;
}

absl::Status RefuseUnsupported(const nlohmann::json& body, absl::string_view name,
                               const nlohmann::json& neutral) {
  const nlohmann::json* value = Field(body, name);
  if (value == nullptr || *value == neutral) return absl::OkStatus();
  if (neutral.is_number() && value->is_number() && value->get<double>() == neutral.get<double>()) {
    return absl::OkStatus();
  }
  return InvalidField(name, absl::StrCat("is not supported by this server yet (got ",
                                         value->dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace),
                                         ")"));
}

}  // namespace estuary::openai
