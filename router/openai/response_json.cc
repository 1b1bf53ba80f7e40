#include "router/openai/response_json.h"

#include "absl/strings/str_cat.h"

namespace estuary::openai {
namespace {

nlohmann::json Envelope(const ResponseEnvelope& envelope, bool chunk) {
  const char* object = envelope.endpoint == Endpoint::kCompletions
                           ? "text_completion"
                           : (chunk ? "chat.completion.chunk" : "chat.completion");
  return {{"id", envelope.id},
          {"object", object},
          {"created", envelope.created},
          {"model", envelope.model}};
}

// A choice's "logprobs": null unless the request asked for them.
nlohmann::json LogprobsValue(const ResponseEnvelope& envelope, absl::Span<const int32_t> ids,
                             absl::Span<const estuary::v1::TokenLogprobs> logprobs,
                             int32_t prev_id, size_t text_offset) {
  if (envelope.logprobs < 0 || !envelope.piece) return nullptr;
  if (envelope.endpoint == Endpoint::kCompletions) {
    return CompletionLogprobs(ids, logprobs, prev_id, text_offset, envelope.piece);
  }
  return ChatLogprobs(ids, logprobs, prev_id, envelope.piece);
}

nlohmann::json FinishValue(absl::string_view reason) {
  return reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::string(reason));
}

}  // namespace

std::string FinishReasonName(estuary::v1::FinishReason reason) {
  switch (reason) {
    case estuary::v1::FINISH_REASON_LENGTH:
      return "length";
    case estuary::v1::FINISH_REASON_CANCELLED:
      return "abort";
    default:
      return "stop";
  }
}

nlohmann::json UsageJson(const ResponseEnvelope& envelope,
                         const std::vector<ChoiceResult>& choices) {
  int64_t prompt = 0, completion = 0, drafts = 0, accepted = 0;
  double layers = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const estuary::v1::Usage& u = choices[i].usage;
    if (i % static_cast<size_t>(envelope.n) == 0) prompt += u.prompt_tokens();
    completion += u.completion_tokens();
    layers += u.mean_backbone_layers() * u.completion_tokens();
    drafts += u.draft_tokens();
    accepted += u.accepted_tokens();
  }
  nlohmann::json usage = {{"prompt_tokens", prompt},
                          {"completion_tokens", completion},
                          {"total_tokens", prompt + completion}};
  usage["estuary"] = {{"mean_backbone_layers", completion > 0 ? layers / completion : 0.0},
                      {"num_layers", envelope.num_layers}};
  if (drafts > 0) {  // lossless choices: what the river drafted and the backbone kept
    usage["estuary"]["draft_tokens"] = drafts;
    usage["estuary"]["accepted_tokens"] = accepted;
  }
  return usage;
}

nlohmann::json FullBody(const ResponseEnvelope& envelope,
                        const std::vector<ChoiceResult>& choices) {
  nlohmann::json body = Envelope(envelope, /*chunk=*/false);
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    nlohmann::json choice = {
        {"index", i},
        {"logprobs", LogprobsValue(envelope, choices[i].token_ids, choices[i].logprobs, -1,
                                   choices[i].echo_bytes)},
        {"finish_reason", FinishValue(choices[i].finish_reason)}};
    if (envelope.endpoint == Endpoint::kCompletions) {
      choice["text"] = choices[i].text;
    } else {
      choice["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    }
    if (envelope.return_token_ids) choice["token_ids"] = choices[i].token_ids;
    list.push_back(std::move(choice));
  }
  body["choices"] = std::move(list);
  body["usage"] = UsageJson(envelope, choices);
  return body;
}

nlohmann::json DeltaChunk(const ResponseEnvelope& envelope, int index, absl::string_view text,
                          const std::vector<int32_t>& token_ids, bool role_first,
                          const DeltaLogprobs& logprobs) {
  nlohmann::json chunk = Envelope(envelope, /*chunk=*/true);
  nlohmann::json choice = {{"index", index},
                           {"logprobs", LogprobsValue(envelope, token_ids, logprobs.logprobs,
                                                      logprobs.prev_id, logprobs.text_offset)},
                           {"finish_reason", nullptr}};
  if (envelope.endpoint == Endpoint::kCompletions) {
    choice["text"] = std::string(text);
  } else {
    choice["delta"] = {{"content", std::string(text)}};
    if (role_first) choice["delta"]["role"] = "assistant";
  }
  if (envelope.return_token_ids) choice["token_ids"] = token_ids;
  chunk["choices"] = nlohmann::json::array({std::move(choice)});
  return chunk;
}

nlohmann::json FinishChunk(const ResponseEnvelope& envelope, int index,
                           absl::string_view finish_reason) {
  nlohmann::json chunk = Envelope(envelope, /*chunk=*/true);
  nlohmann::json choice = {
      {"index", index}, {"logprobs", nullptr}, {"finish_reason", FinishValue(finish_reason)}};
  if (envelope.endpoint == Endpoint::kCompletions) {
    choice["text"] = "";
  } else {
    choice["delta"] = nlohmann::json::object();
  }
  chunk["choices"] = nlohmann::json::array({std::move(choice)});
  return chunk;
}

nlohmann::json UsageChunk(const ResponseEnvelope& envelope,
                          const std::vector<ChoiceResult>& choices) {
  nlohmann::json chunk = Envelope(envelope, /*chunk=*/true);
  chunk["choices"] = nlohmann::json::array();
  chunk["usage"] = UsageJson(envelope, choices);
  return chunk;
}

std::string Dump(const nlohmann::json& json) {
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string SseEvent(const nlohmann::json& json) { return absl::StrCat("data: ", Dump(json), "\n\n"); }

}  // namespace estuary::openai
