#pragma once
// OpenAI's error answer for the HTTP front door: {"error": {"message", "type", "param",
// "code"}} with the HTTP status a client retries on (429, 503) or fixes (400, 404, 413).
// Parsers name the offending request field with InvalidField; the name travels on the Status
// as a payload, so router errors (which carry none) and parser errors share one path.

#include <string>


#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace estuary::openai {

// INVALID_ARGUMENT "`param`: message", with `param` kept for the error's "param" field.
absl::Status InvalidField(absl::string_view param, absl::string_view message);

// 400 INVALID_ARGUMENT / OUT_OF_RANGE / FAILED_PRECONDITION, 401 UNAUTHENTICATED,
// 403 PERMISSION_DENIED, 404 NOT_FOUND, 413 (a body over the limit: the server's own),
// 429 RESOURCE_EXHAUSTED, 499 CANCELLED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, else 500.
int HttpStatusOf(const absl::Status& status);

// The error body for `status` (not OK).
nlohmann::json ErrorJson(const absl::Status& status);
// The same for an error the HTTP layer makes itself (413, 404 of an unknown path).
nlohmann::json ErrorJson(int http_status, absl::string_view message);

}  // namespace estuary::openai
