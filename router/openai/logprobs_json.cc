#include "router/openai/logprobs_json.h"

#include <algorithm>

namespace estuary::openai {
namespace {

nlohmann::json Bytes(const std::string& text) {
  nlohmann::json bytes = nlohmann::json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

nlohmann::json CompletionLogprobs(absl::Span<const int32_t> ids,
                                  absl::Span<const estuary::v1::TokenLogprobs> logprobs,
                                  int32_t prev_id, size_t text_offset, const TokenPiece& piece) {
  nlohmann::json tokens = nlohmann::json::array(), token_logprobs = nlohmann::json::array();
  nlohmann::json top_logprobs = nlohmann::json::array(), offsets = nlohmann::json::array();
  const size_t n = std::min(ids.size(), logprobs.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string text = piece(prev_id, ids[i]);
    tokens.push_back(text);
    token_logprobs.push_back(logprobs[i].logprob());
    nlohmann::json top = nlohmann::json::object();
    for (const estuary::v1::TopLogprob& t : logprobs[i].top()) {
      top[piece(prev_id, t.token_id())] = t.logprob();
    }
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += text.size();
    prev_id = ids[i];
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

nlohmann::json ChatLogprobs(absl::Span<const int32_t> ids,
                            absl::Span<const estuary::v1::TokenLogprobs> logprobs, int32_t prev_id,
                            const TokenPiece& piece) {
  nlohmann::json content = nlohmann::json::array();
  const size_t n = std::min(ids.size(), logprobs.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string text = piece(prev_id, ids[i]);
    nlohmann::json top = nlohmann::json::array();
    for (const estuary::v1::TopLogprob& t : logprobs[i].top()) {
      const std::string alternative = piece(prev_id, t.token_id());
      top.push_back(
          {{"token", alternative}, {"logprob", t.logprob()}, {"bytes", Bytes(alternative)}});
    }
    content.push_back({{"token", text},
                       {"logprob", logprobs[i].logprob()},
                       {"bytes", Bytes(text)},
                       {"top_logprobs", std::move(top)}});
    prev_id = ids[i];
  }
  return {{"content", std::move(content)}};
}

}  // namespace estuary::openai
