#pragma once
// Conversions between the worker protos (worker.proto) and the engines' request types, shared
// by the decode and prefill services. Validation stays with the engines (Submit / Reserve),
// which name the limit that was broken.

#include "absl/time/time.h"
#include "core/sampling/finish_reason.h"
#include "core/sampling/sampler.h"
#include "estuary/v1/worker.pb.h"

namespace estuary::rpc {

// Absent temperature: 1.0 (the router fills the model's default in before it calls a worker).
SamplingParams SamplingFromProto(const estuary::v1::SamplingParams& proto);
// proto's 0 means "the default" for the fields where 0 is not a valid value.
void SamplingToProto(const SamplingParams& params, int max_tokens, estuary::v1::SamplingParams* proto);
// Per-token log-probabilities, both ways (DecodeResponse, Chunk, KvCompletion).
void LogprobsToProto(const TokenLogprobs& logprobs, estuary::v1::TokenLogprobs* proto);
TokenLogprobs LogprobsFromProto(const estuary::v1::TokenLogprobs& proto);
// InfiniteFuture for 0.
absl::Time DeadlineFromUnixMs(int64_t unix_ms);
int64_t DeadlineToUnixMs(absl::Time deadline);
// kContext reports as LENGTH; kError as UNSPECIFIED (the status says why).
estuary::v1::FinishReason FinishReasonToProto(FinishReason reason);

}  // namespace estuary::rpc
