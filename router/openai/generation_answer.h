#pragma once
// Answers one parsed generation request over HTTP: runs its choices (ChoiceRunner) and writes
// either the whole OpenAI body or the SSE stream. Owned by OpenAiServer's handlers; one call per
// request, on the connection's thread.

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "router/openai/generation_request.h"
#include "router/openai/response_json.h"

namespace httplib {
struct Response;
}

namespace estuary::openai {

// Fills `response` (status, body or chunked SSE provider). `on_done` runs once the answer has
// been written out or abandoned (it releases the request's concurrency slot).
void AnswerGeneration(estuary::v1::Inference::StubInterface& stub, GenerationRequest request,
                      ResponseEnvelope envelope, absl::Duration timeout,
                      httplib::Response& response, std::function<void()> on_done);

}  // namespace estuary::openai
