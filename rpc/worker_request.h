#pragma once
// Conversions between the worker protos (worker.proto) and the engines' request types, shared
// by the decode and prefill services (and the router's request validation). Validation stays
// with the engines (Submit / Reserve; core/model/request_checks.h), which name the limit that
// was broken. Its own target (estuary::worker_request: protobuf messages, no gRPC), so that the
// fuzz build decodes requests as the workers do.

#include <optional>

#include "absl/time/time.h"
#include "core/sampling/finish_reason.h"
#include "core/sampling/sampler.h"
#include "estuary/v1/worker.pb.h"

namespace estuary::rpc {

// Absent temperature: 1.0 (the router fills the model's default in before it calls a worker).
SamplingParams SamplingFromProto(const estuary::v1::SamplingParams& proto);
// proto's 0 means "the default" for the fields where 0 is not a valid value.
void SamplingToProto(const SamplingParams& params, int max_tokens, estuary::v1::SamplingParams* proto);
// The exit threshold τ a request sets; unset (the engine's default) for the proto's 0.
std::optional<float> ExitThresholdFromProto(const estuary::v1::ExitParams& proto);
// Per-token log-probabilities, both ways (DecodeResponse, Chunk, KvCompletion).
void LogprobsToProto(const TokenLogprobs& logprobs, estuary::v1::TokenLogprobs* proto);
TokenLogprobs LogprobsFromProto(const estuary::v1::TokenLogprobs& proto);
// InfiniteFuture for 0.
absl::Time DeadlineFromUnixMs(int64_t unix_ms);
int64_t DeadlineToUnixMs(absl::Time deadline);
// kContext reports as LENGTH; kError as UNSPECIFIED (the status says why).
estuary::v1::FinishReason FinishReasonToProto(FinishReason reason);

}  // namespace estuary::rpc
