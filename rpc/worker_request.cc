#include "rpc/worker_request.h"

#include <algorithm>

namespace estuary::rpc {

SamplingParams SamplingFromProto(const estuary::v1::SamplingParams& proto) {
  SamplingParams params;
  params.temperature = proto.has_temperature() ? proto.temperature() : 1.0f;
  params.top_k = proto.top_k();
  params.top_p = proto.top_p() == 0.0f ? 1.0f : proto.top_p();
  params.min_p = proto.min_p();
  params.repetition_penalty = proto.repetition_penalty() == 0.0f ? 1.0f : proto.repetition_penalty();
  params.presence_penalty = proto.presence_penalty();
  params.frequency_penalty = proto.frequency_penalty();
  params.min_tokens = proto.min_tokens();
  for (const auto& [id, bias] : proto.logit_bias()) params.logit_bias.emplace_back(id, bias);
  // A map's order is unspecified: sort so that the same request always adds in the same order.
  std::sort(params.logit_bias.begin(), params.logit_bias.end());
  params.logprobs = proto.has_logprobs() ? proto.logprobs() : -1;
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
  proto->set_presence_penalty(params.presence_penalty);
  proto->set_frequency_penalty(params.frequency_penalty);
  proto->set_min_tokens(params.min_tokens);
  for (const auto& [id, bias] : params.logit_bias) (*proto->mutable_logit_bias())[id] = bias;
  if (params.logprobs >= 0) proto->set_logprobs(params.logprobs);
  proto->set_seed(params.seed);
  proto->set_max_tokens(max_tokens);
  for (int32_t id : params.stop_token_ids) proto->add_stop_token_ids(id);
}

std::optional<float> ExitThresholdFromProto(const estuary::v1::ExitParams& proto) {
  if (proto.threshold() == 0.0f) return std::nullopt;
  return proto.threshold();
}

void LogprobsToProto(const TokenLogprobs& logprobs, estuary::v1::TokenLogprobs* proto) {
  proto->set_logprob(logprobs.logprob);
  for (const TokenLogprob& t : logprobs.top) {
    estuary::v1::TopLogprob* top = proto->add_top();
    top->set_token_id(t.id);
    top->set_logprob(t.logprob);
  }
}

TokenLogprobs LogprobsFromProto(const estuary::v1::TokenLogprobs& proto) {
  TokenLogprobs logprobs;
  logprobs.logprob = proto.logprob();
  logprobs.top.reserve(static_cast<size_t>(proto.top_size()));
  for (const estuary::v1::TopLogprob& t : proto.top()) {
    logprobs.top.push_back({t.token_id(), t.logprob()});
  }
  return logprobs;
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
