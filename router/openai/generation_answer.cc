#include "router/openai/generation_answer.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "router/openai/api_error.h"
#include "router/openai/choice_runner.h"
#include "router/openai/error_response.h"

namespace estuary::openai {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(200);

// What the answer has gathered of its choices.
struct AnswerState {
  ResponseEnvelope envelope;
  bool include_usage = false;
  std::vector<ChoiceResult> choices;
  std::vector<bool> started;  // per choice: its first delta was written
};

// Folds one event into `choice`.
void Apply(const ChoiceEvent& event, ChoiceResult& choice) {
  if (event.kind == ChoiceEvent::Kind::kChunk) {
    choice.text += event.chunk.text();
    choice.token_ids.insert(choice.token_ids.end(), event.chunk.token_ids().begin(),
                            event.chunk.token_ids().end());
    choice.logprobs.insert(choice.logprobs.end(), event.chunk.logprobs().begin(),
                           event.chunk.logprobs().end());
  } else if (event.kind == ChoiceEvent::Kind::kComplete) {
    choice.finish_reason = FinishReasonName(event.complete.finish_reason());
    choice.usage = event.complete.usage();
  }
}

// Writes one event of a stream; false when the client is gone.
bool WriteEvent(AnswerState& state, const ChoiceEvent& event, rpc::HttpResponder& responder) {
  ChoiceResult& choice = state.choices[event.index];
  const size_t text_offset = choice.text.size();
  const int32_t prev_id = choice.token_ids.empty() ? -1 : choice.token_ids.back();
  Apply(event, choice);
  std::string out;
  // The echoed prompt goes out first, in the choice's first delta.
  const bool first = !state.started[event.index];
  const std::string echo = first ? choice.text.substr(0, choice.echo_bytes) : std::string();
  if (event.kind == ChoiceEvent::Kind::kChunk) {
    const bool with_logprobs = state.envelope.logprobs >= 0;
    if (event.chunk.text().empty() && echo.empty() && !state.envelope.return_token_ids &&
        !with_logprobs) {
      return true;
    }
    const std::vector<int32_t> ids(event.chunk.token_ids().begin(), event.chunk.token_ids().end());
    const std::vector<estuary::v1::TokenLogprobs> chunk_logprobs(event.chunk.logprobs().begin(),
                                                                  event.chunk.logprobs().end());
    DeltaLogprobs logprobs{chunk_logprobs, prev_id, text_offset};
    out = SseEvent(DeltaChunk(state.envelope, event.index, echo + event.chunk.text(), ids, first,
                              logprobs));
    state.started[event.index] = true;
  } else if (event.kind == ChoiceEvent::Kind::kComplete) {
    if (!echo.empty()) {
      out = SseEvent(DeltaChunk(state.envelope, event.index, echo, {}, first));
      state.started[event.index] = true;
    }
    out += SseEvent(FinishChunk(state.envelope, event.index, choice.finish_reason));
  } else {
    out = SseEvent(ErrorJson(event.error));
  }
  return responder.Write(out);
}

// A stream: the status is chosen on the first event, so that a request the router refuses
// (validation, no worker, a full queue) is answered with its HTTP status, not inside a 200.
void Stream(ChoiceRunner& runner, AnswerState& state, rpc::HttpResponder& responder) {
  ChoiceEvent event;
  while (!runner.Next(event, kPollInterval)) {
    if (runner.finished()) break;
  }
  if (event.kind == ChoiceEvent::Kind::kError) {
    responder.Send(ErrorResponse(event.error));
    return;
  }
  if (!responder.StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}})) return;
  bool failed = false;  // after a failure the other choices are cancelled, their ends dropped
  auto write = [&](const ChoiceEvent& next) {
    if (failed) return true;
    failed = next.kind == ChoiceEvent::Kind::kError;
    if (!WriteEvent(state, next, responder)) return false;  // the client is gone: cancelled
    if (failed) runner.CancelAll();
    return true;
  };
  if (!write(event)) return;
  while (!runner.finished()) {
    if (runner.Next(event, kPollInterval) && !write(event)) return;
  }
  if (state.include_usage && !failed &&
      !responder.Write(SseEvent(UsageChunk(state.envelope, state.choices)))) {
    return;
  }
  if (!responder.Write(kSseDone)) return;
  responder.Finish();
}

// A whole body, written once every choice has ended, with the status of the first failure if
// any (the others are then cancelled).
void WholeBody(ChoiceRunner& runner, AnswerState& state, rpc::HttpResponder& responder) {
  std::optional<absl::Status> failed;
  ChoiceEvent event;
  while (!runner.finished()) {
    if (!runner.Next(event, kPollInterval)) continue;
    if (event.kind == ChoiceEvent::Kind::kError) {
      if (!failed) {
        failed = event.error;
        runner.CancelAll();
      }
    } else if (!failed) {
      Apply(event, state.choices[event.index]);
    }
  }
  if (responder.client_gone()) return;
  responder.Send(failed ? ErrorResponse(*failed)
                        : JsonResponse(200, FullBody(state.envelope, state.choices)));
}

}  // namespace

void AnswerGeneration(estuary::v1::Inference::StubInterface& stub, GenerationRequest request,
                      ResponseEnvelope envelope, absl::Duration timeout,
                      rpc::HttpResponder& responder) {
  const size_t count = request.choices.size();
  AnswerState state;
  state.envelope = std::move(envelope);
  state.include_usage = request.include_usage;
  state.choices.resize(count);
  for (size_t i = 0; i < count && i < request.echo_texts.size(); ++i) {
    state.choices[i].text = request.echo_texts[i];
    state.choices[i].echo_bytes = request.echo_texts[i].size();
  }
  state.started.assign(count, false);
  ChoiceRunner runner(stub, std::move(request.choices), absl::Now() + timeout, request.n);
  // The client leaving cancels every choice at once; unhooked before the runner ends.
  responder.OnClientGone([&runner] { runner.CancelAll(); });
  struct Unhook {
    rpc::HttpResponder& responder;
    ~Unhook() { responder.OnClientGone(nullptr); }
  } unhook{responder};
  if (request.stream) {
    Stream(runner, state, responder);
  } else {
    WholeBody(runner, state, responder);
  }
}

}  // namespace estuary::openai
