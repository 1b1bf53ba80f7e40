#pragma once
// Answers one parsed generation request over HTTP: runs its choices (ChoiceRunner) and writes
// either the whole OpenAI body or the SSE stream through the request's responder. Called by
// OpenAiServer's handlers on a thread of the HTTP server's long pool; returns once the answer is
// written or abandoned. A client that goes away, streaming or not, is noticed by the server at
// once and cancels every choice (the router then aborts them on both workers).

#include "absl/time/time.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "router/openai/generation_request.h"
#include "router/openai/response_json.h"
#include "rpc/http_exchange.h"

namespace estuary::openai {

void AnswerGeneration(estuary::v1::Inference::StubInterface& stub, GenerationRequest request,
                      ResponseEnvelope envelope, absl::Duration timeout,
                      rpc::HttpResponder& responder);

}  // namespace estuary::openai
