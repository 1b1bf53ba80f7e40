#pragma once
// The HTTP door's one way to answer an error (openai_server.cc before a stream starts,
// generation_answer.cc when the first event is one): OpenAI's error body with the status
// HttpStatusOf gives, and for the statuses a client retries on (429 RESOURCE_EXHAUSTED, 503
// UNAVAILABLE) a Retry-After header, as vLLM-style gateways and the openai client's back-off
// expect.

#include "absl/status/status.h"

namespace httplib {
struct Response;
}  // namespace httplib

namespace estuary::openai {

// Seconds a refused client is told to wait (Retry-After).
inline constexpr int kRetryAfterSeconds = 1;

void SetErrorResponse(httplib::Response& response, const absl::Status& status);

}  // namespace estuary::openai
