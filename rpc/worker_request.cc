#include "rpc/worker_request.h"

namespace estuary::rpc {

SamplingParams SamplingFromProto(const estuary::v1::SamplingParams& proto) {
  SamplingParams params;
  params.temperature = proto.temperature();
  params.top_k = proto.top_k();
  params.top_p = proto.top_p() == 0.0f ? 1.0f : proto.top_p();
  params.min_p = proto.min_p();
  params.repetition_penalty = proto.repetition_penalty() == 0.0f ? 1.0f : proto.repetition_penalty();
  params.seed = proto.seed();
  params.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  return params;
}

void SamplingToProto(const SamplingParams& params, int max_tokens,
                     estuary::v1::SamplingParams* proto) {
  proto->set_temperature(params.temperature);
  proto->set_top_k(params.top_k);
  proto->set_top_p(params.top_p);
  proto->set_min_p(params.min_p);
  proto->set_repetition_penalty(params.repetition_penalty);
  proto->set_seed(params.seed);
  proto->set_max_tokens(max_tokens);
  for (int32_t id : params.stop_token_ids) proto->add_stop_token_ids(id);
}

absl::Time DeadlineFromUnixMs(int64_t unix_ms) {
  return unix_ms <= 0 ? absl::InfiniteFuture() : absl::FromUnixMillis(unix_ms);
}

int64_t DeadlineToUnixMs(absl::Time deadline) {
  return deadline == absl::InfiniteFuture() ? 0 : absl::ToUnixMillis(deadline);
}

estuary::v1::FinishReason FinishReasonToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
      return estuary::v1::FINISH_REASON_EOS;
    case FinishReason::kStopToken:
      return estuary::v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kLength:
    case FinishReason::kContext:
      return estuary::v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return estuary::v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      break;
  }
  return estuary::v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace estuary::rpc
