#include "router/openai/generation_answer.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "httplib.h"
#include "router/openai/api_error.h"
#include "router/openai/error_response.h"
#include "router/openai/choice_runner.h"

namespace estuary::openai {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(200);
constexpr absl::Duration kKeepAliveInterval = absl::Seconds(1);

// Runs once on destruction: the request's slot is released however the answer ends.
struct DoneGuard {
  std::function<void()> done;
  ~DoneGuard() {
    if (done) done();
  }
};

// The state a stream carries from the handler into httplib's content provider.
struct StreamState {
  std::unique_ptr<ChoiceRunner> runner;
  ResponseEnvelope envelope;
  bool include_usage = false;
  std::vector<ChoiceResult> choices;
  std::vector<bool> started;
  std::vector<ChoiceEvent> pending;  // taken before the answer's status was chosen
  DoneGuard guard;
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
bool WriteEvent(StreamState& state, const ChoiceEvent& event, httplib::DataSink& sink) {
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
  return sink.write(out.data(), out.size());
}

bool Stream(StreamState& state, httplib::DataSink& sink) {
  bool failed = false;
  auto write = [&](const ChoiceEvent& event) {
    if (failed) return true;
    if (event.kind == ChoiceEvent::Kind::kError) failed = true;
    return WriteEvent(state, event, sink);
  };
  for (const ChoiceEvent& event : state.pending) {
    if (!write(event)) return false;
  }
  state.pending.clear();
  absl::Time last_write = absl::Now();
  ChoiceEvent event;
  while (!state.runner->finished()) {
    if (state.runner->Next(event, kPollInterval)) {
      if (!write(event)) return false;  // the client went away: ~StreamState cancels
      if (failed) state.runner->CancelAll();
      last_write = absl::Now();
    } else if (absl::Now() - last_write >= kKeepAliveInterval) {
      static constexpr char kComment[] = ": keep-alive\n\n";
      if (!sink.write(kComment, sizeof(kComment) - 1)) return false;
      last_write = absl::Now();
    }
  }
  if (state.include_usage && !failed) {
    const std::string usage = SseEvent(UsageChunk(state.envelope, state.choices));
    if (!sink.write(usage.data(), usage.size())) return false;
  }
  if (!sink.write(kSseDone.data(), kSseDone.size())) return false;
  sink.done();
  return true;
}

// The rest of a non-streamed answer once it is generating: a space every second until the body
// (JSON allows leading whitespace), so that a client that went away fails a write and its
// choices are cancelled on both workers rather than run to the end. A failure after the first
// token arrives as OpenAI's error JSON in this 200 (the status is already sent).
bool WholeBody(StreamState& state, httplib::DataSink& sink) {
  absl::Time last_write = absl::Now();
  std::optional<absl::Status> failed;
  ChoiceEvent event;
  while (!state.runner->finished()) {
    if (state.runner->Next(event, kPollInterval)) {
      if (event.kind == ChoiceEvent::Kind::kError && !failed) {
        failed = event.error;
        state.runner->CancelAll();
      } else if (!failed) {
        Apply(event, state.choices[event.index]);
      }
    }
    if (absl::Now() - last_write >= kKeepAliveInterval) {
      if (!sink.write(" ", 1)) return false;  // the client went away: ~StreamState cancels
      last_write = absl::Now();
    }
  }
  const std::string body =
      Dump(failed ? ErrorJson(*failed) : FullBody(state.envelope, state.choices));
  if (!sink.write(body.data(), body.size())) return false;
  sink.done();
  return true;
}

}  // namespace

void AnswerGeneration(estuary::v1::Inference::StubInterface& stub, GenerationRequest request,
                      ResponseEnvelope envelope, absl::Duration timeout,
                      httplib::Response& response, std::function<void()> on_done) {
  const size_t count = request.choices.size();
  auto state = std::make_shared<StreamState>();
  state->guard.done = std::move(on_done);
  state->envelope = std::move(envelope);
  state->include_usage = request.include_usage;
  state->choices.resize(count);
  for (size_t i = 0; i < count && i < request.echo_texts.size(); ++i) {
    state->choices[i].text = request.echo_texts[i];
    state->choices[i].echo_bytes = request.echo_texts[i].size();
  }
  state->started.assign(count, false);
  state->runner = std::make_unique<ChoiceRunner>(stub, std::move(request.choices),
                                                 absl::Now() + timeout, request.n);

  if (!request.stream) {
    // The status waits for the first token (or the end), so that what fails before it (most
    // refusals) gets its HTTP status.
    ChoiceEvent event;
    bool generating = false;
    while (!state->runner->finished() && !generating) {
      if (!state->runner->Next(event, kPollInterval)) continue;
      if (event.kind == ChoiceEvent::Kind::kError) {
        SetErrorResponse(response, event.error);
        return;  // ~StreamState cancels the other choices
      }
      Apply(event, state->choices[event.index]);
      generating = event.kind == ChoiceEvent::Kind::kChunk;
    }
    response.status = 200;
    if (state->runner->finished()) {
      response.set_content(Dump(FullBody(state->envelope, state->choices)), "application/json");
      return;
    }
    response.set_chunked_content_provider(
        "application/json",
        [state](size_t /*offset*/, httplib::DataSink& sink) { return WholeBody(*state, sink); },
        [state](bool /*success*/) { state->runner->CancelAll(); });
    return;
  }

  // A stream: the status is chosen on the first event, so that a request the router refuses
  // (validation, no worker, a full queue) is answered with its HTTP status, not inside a 200.
  ChoiceEvent first;
  while (!state->runner->Next(first, kPollInterval)) {
    if (state->runner->finished()) break;
  }
  if (first.kind == ChoiceEvent::Kind::kError) {
    SetErrorResponse(response, first.error);
    return;
  }
  state->pending.push_back(std::move(first));
  response.status = 200;
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t /*offset*/, httplib::DataSink& sink) { return Stream(*state, sink); },
      [state](bool /*success*/) { state->runner->CancelAll(); });
}

}  // namespace estuary::openai
