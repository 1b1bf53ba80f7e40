#pragma once
// The HTTP door's answers as the transport takes them (rpc/http_exchange.h): a JSON body, and
// OpenAI's error body with the status HttpStatusOf gives; for the statuses a client retries on
// (429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE) a Retry-After header, as vLLM-style gateways and the
// openai client's back-off expect. Used before a stream starts (openai_server.cc), when its
// first event is an error (generation_answer.cc), and for the errors the server finds itself.

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "rpc/http_exchange.h"

namespace estuary::openai {

// Seconds a refused client is told to wait (Retry-After).
inline constexpr int kRetryAfterSeconds = 1;

rpc::HttpResponse JsonResponse(int status, const nlohmann::json& body);

// `status` (not OK) as OpenAI's error answer.
rpc::HttpResponse ErrorResponse(const absl::Status& status);

// An error the HTTP server finds itself (rpc::HttpErrorPage: 400 malformed, 413, 431, 500, 503
// busy): OpenAI's shape.
rpc::HttpResponse ErrorPage(int http_status, const std::string& message);

}  // namespace estuary::openai
