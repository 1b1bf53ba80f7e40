#pragma once
// Typed reads of an OpenAI request body's fields: a field of the wrong JSON type, or out of the
// range the reader states, is InvalidField naming it; an absent or null field gives the
// default. Unknown fields are never looked at (OpenAI and vLLM ignore them).

#include <cstdint>
#include <optional>
#include <string>

#include <vector>

#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace estuary::openai {

// The field, or nullptr when absent or null.
const nlohmann::json* Field(const nlohmann::json& body, absl::string_view name);

absl::StatusOr<bool> BoolField(const nlohmann::json& body, absl::string_view name, bool otherwise);
absl::StatusOr<std::string> StringField(const nlohmann::json& body, absl::string_view name,
                                        std::string otherwise);
// A JSON number in [low, high].
absl::StatusOr<double> NumberField(const nlohmann::json& body, absl::string_view name,
                                   double otherwise, double low, double high);
// A JSON integer (no fraction) in [low, high].
absl::StatusOr<int64_t> IntField(const nlohmann::json& body, absl::string_view name,
                                 int64_t otherwise, int64_t low, int64_t high);
// A string or a list of strings ("stop"): at most `max_items`.
absl::StatusOr<std::vector<std::string>> StringsField(const nlohmann::json& body,
                                                      absl::string_view name, size_t max_items);
// A list of integers in [low, high], at most `max_items`.
absl::StatusOr<std::vector<int64_t>> IntsField(const nlohmann::json& body, absl::string_view name,
                                               size_t max_items, int64_t low, int64_t high);

// Fields Estuary does not implement yet: present with anything but its neutral value
// (`neutral`: null, false, 0, {} or [] as given) is InvalidField saying so, so that no request
// silently gets less than it asked for.
absl::Status RefuseUnsupported(const nlohmann::json& body, absl::string_view name,
                               const nlohmann::json& neutral);

}  // namespace estuary::openai
