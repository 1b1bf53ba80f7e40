#include "router/generate_call.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "rpc/caller_identity.h"
#include "rpc/overload.h"
#include "rpc/peer_failure.h"
#include "rpc/status_convert.h"
#include "rpc/worker_request.h"

namespace estuary::router {
namespace {

using estuary::v1::GenerateResponse;
using rpc::FromGrpcStatus;
using rpc::ToGrpcStatus;

// A Generate call refused before it had a request id (an API key missing or wrong).
class Refusal final : public grpc::ServerWriteReactor<GenerateResponse> {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// `status` of call `what` on `worker_id`, said so in its message.
absl::Status CallFailure(const char* what, const std::string& worker_id,
                         const grpc::Status& status) {
  const absl::Status s = FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat(what, " on worker ", worker_id, ": ", s.message()));
}

// Appends `more`'s chunk to `into`'s (two chunks waiting for the same write).
void MergeChunk(const GenerateResponse& more, GenerateResponse& into) {
  estuary::v1::Chunk* chunk = into.mutable_chunk();
  const estuary::v1::Chunk& next = more.chunk();
  chunk->mutable_token_ids()->Add(next.token_ids().begin(), next.token_ids().end());
  chunk->mutable_exit_layers()->Add(next.exit_layers().begin(), next.exit_layers().end());
  for (const auto& logprobs : next.logprobs()) *chunk->add_logprobs() = logprobs;
  chunk->mutable_text()->append(next.text());
}

// The client's deadline as absl::Time (InfiniteFuture when it sent none).
absl::Time ClientDeadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  return deadline == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture()
                                                                  : absl::FromChrono(deadline);
}

}  // namespace

grpc::ServerWriteReactor<GenerateResponse>* RefusedGenerate(const grpc::Status& status) {
  return new Refusal(status);
}

GenerateCall::GenerateCall(RouterParts& parts, grpc::CallbackServerContext* context)
    : owner_(rpc::CallerIdentity(context)), parts_(parts), context_(context), arrival_(absl::Now()) {
  parts_.live_calls.fetch_add(1);
}

GenerateCall::~GenerateCall() { parts_.live_calls.fetch_sub(1); }

grpc::ServerWriteReactor<GenerateResponse>* GenerateCall::Start(
    RouterParts& parts, grpc::CallbackServerContext* context,
    const estuary::v1::GenerateRequest& request) {
  auto call = std::make_shared<GenerateCall>(parts, context);
  call->self_ = call;
  if (call->Admit(request)) {
    Todo todo;
    {
      absl::MutexLock lock(&call->mu_);
      call->BeginAttempt(todo);
    }
    call->Run(std::move(todo));
  }
  return call.get();
}

bool GenerateCall::Admit(const estuary::v1::GenerateRequest& request) {
  const grpc::Status refusal = AdmitLocked(request);
  if (refusal.ok()) return true;
  Finish(refusal);
  return false;
}

grpc::Status GenerateCall::AdmitLocked(const estuary::v1::GenerateRequest& request) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  auto refuse = [&](grpc::Status status) {
    LeaveQueueLocked();
    ended_ = finished_ = true;
    return status;
  };
  if (parts_.draining.load()) {
    return refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "this router is shutting down (draining): send the request to "
                               "another replica"));
  }
  // Admission comes before any work on the request (admission.h).
  absl::StatusOr<Admission::Ticket> ticket = parts_.admission.Admit();
  if (!ticket.ok()) return refuse(rpc::ToGrpcStatusWithRetryHint(context_, ticket.status()));
  ticket_.emplace(*std::move(ticket));
  queued_ = true;
  parts_.metrics.waiting.Add(1);
  if (!request.model().empty() && request.model() != parts_.served_name) {
    return refuse(grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrCat("model '", request.model(), "' is not served here; "
                                            "this router serves '", parts_.served_name, "'")));
  }
  absl::StatusOr<PreparedRequest> prepared =
      PrepareRequest(request, parts_.tokenizer, parts_.limits);
  if (!prepared.ok()) return refuse(ToGrpcStatus(prepared.status()));
  client_deadline_ = ClientDeadline(context_);
  const absl::Status meetable = parts_.ttft_floor.Check(
      client_deadline_, static_cast<int>(prepared->prompt_ids.size()), now);
  if (!meetable.ok()) return refuse(ToGrpcStatus(meetable));
  id_ = request.request_id().empty() ? parts_.new_request_id() : request.request_id();
  if (!parts_.active.Add(id_, shared_from_this())) {
    return refuse(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                               absl::StrCat("request id '", id_, "' is already in flight")));
  }
  registered_ = true;
  prompt_ = prepared->prompt_ids;
  *base_.mutable_sampling() = prepared->sampling;
  *base_.mutable_exit() = prepared->exit;
  base_.set_deadline_unix_ms(rpc::DeadlineToUnixMs(client_deadline_));
  same_prompt_as_ = request.same_prompt_as();
  relay_.emplace(parts_.tokenizer, prompt_.back(), prepared->stop, prepared->include_stop_str,
                 parts_.limits.num_layers);
  flow_.emplace(parts_.options.max_attempts, parts_.options.migration_limit);
  return grpc::Status::OK;
}

void GenerateCall::LeaveQueueLocked() {
  if (!queued_) return;
  queued_ = false;
  if (ticket_.has_value()) ticket_->LeaveQueue();
  parts_.metrics.waiting.Add(-1);
}

void GenerateCall::BeginAttempt(Todo& todo) {
  if (flow_->done()) return;  // cancelled (an Abort by id) before it was first placed
  const absl::Time now = absl::Now();
  const bool resumed = flow_->streamed();
  Attempt next;
  next.number = flow_->attempts();
  next.worker_request_id = next.number == 1 ? id_ : absl::StrCat(id_, "/attempt-", next.number);
  next.request = base_;
  next.request.set_request_id(next.worker_request_id);
  std::vector<int32_t> prompt = prompt_;
  if (resumed) {
    // The new attempt continues from every token the client has: they come after the prompt
    // and count as output (sampling position, penalties, min_tokens, max_tokens).
    const std::vector<int32_t>& sent = relay_->ids();
    if (relay_->tokens() >= base_.sampling().max_tokens() ||
        static_cast<int>(prompt_.size() + sent.size()) >= parts_.limits.context_length) {
      finish_ = estuary::v1::FINISH_REASON_LENGTH;  // the failed worker had sent them all
      Apply(FlowEvent::kFinished, absl::OkStatus(), todo);
      return;
    }
    prompt.insert(prompt.end(), sent.begin(), sent.end());
    next.request.set_resumed_output_tokens(static_cast<int>(sent.size()));
  }
  next.request.mutable_prompt_ids()->Assign(prompt.begin(), prompt.end());

  std::optional<Placement> placement;
  if (next.number == 1 && !same_prompt_as_.empty()) {
    // Beside the running request with the same prompt (GenerateRequest.same_prompt_as).
    if (std::optional<std::string> home = parts_.prompt_homes.Find(same_prompt_as_, prompt, now)) {
      absl::StatusOr<Placement> beside = parts_.registry.ChooseDecode(*home, prompt, now);
      if (beside.ok()) placement = *std::move(beside);
    }
  }
  if (!placement.has_value()) {
    const bool local = static_cast<int>(prompt.size()) <= parts_.options.local_prefill_max_tokens ||
                       !parts_.registry.HasCompatiblePair(now);
    absl::StatusOr<Placement> chosen = parts_.registry.Choose(prompt, local, now, avoid_);
    if (!chosen.ok()) {
      Apply(FlowEvent::kFailed, chosen.status(), todo);
      return;
    }
    placement = *std::move(chosen);
  }
  next.decode_id = placement->decode.info.worker_id();
  next.decode_address = placement->decode.info.address();
  next.decode_counted = true;
  if (placement->prefill.has_value()) {
    next.prefill_id = placement->prefill->info.worker_id();
    next.prefill_address = placement->prefill->info.address();
    next.prefill_counted = true;
  }
  if (!resumed) parts_.prompt_homes.Record(id_, next.decode_id, prompt_, now);
  attempt_ = std::move(next);
  if (!dispatched_) {
    dispatched_ = true;
    timings_.set_queue_seconds(absl::ToDoubleSeconds(now - arrival_));
  }
  attempt_dispatched_ = now;
  Apply(FlowEvent::kPlaced, absl::OkStatus(), todo);
}

std::shared_ptr<grpc::ClientContext> GenerateCall::NewCallLocked(CallKind kind,
                                                                 absl::Time deadline) {
  call_kind_ = kind;
  ++call_id_;
  interrupt_ = Interrupt::kNone;
  final_response_.reset();
  call_context_ = std::make_shared<grpc::ClientContext>();
  if (deadline != absl::InfiniteFuture()) call_context_->set_deadline(absl::ToChronoTime(deadline));
  client_bound_ = deadline == client_deadline_;
  return call_context_;
}

void GenerateCall::Apply(FlowEvent event, const absl::Status& status, Todo& todo) {
  const FlowState from = flow_->state();
  const FlowDecision decision = flow_->On(event);
  const StageTimeouts& timeouts = parts_.options.timeouts;
  const absl::Time now = absl::Now();
  switch (decision.action) {
    case FlowAction::kIgnore:
      return;
    case FlowAction::kProceed: {
      // The call the new state waits on (none while streaming: the stream goes on).
      const FlowState state = flow_->state();
      if (state == FlowState::kPlaced && !attempt_.prefill_address.empty()) {
        todo.call = CallKind::kReserve;
        todo.context = NewCallLocked(CallKind::kReserve,
                                     StageDeadline(now, timeouts.reserve, client_deadline_));
      } else if (state == FlowState::kReserved) {
        todo.call = CallKind::kPrefill;
        todo.context = NewCallLocked(CallKind::kPrefill,
                                     StageDeadline(now, timeouts.prefill, client_deadline_));
      } else if (state == FlowState::kPlaced || state == FlowState::kPrefilled) {
        // The stream as a whole is bounded too: its first token and max_tokens gaps.
        const absl::Duration bound =
            timeouts.first_token + timeouts.token_gap * base_.sampling().max_tokens();
        todo.call = CallKind::kDecode;
        todo.context = NewCallLocked(CallKind::kDecode,
                                     StageDeadline(now, bound, client_deadline_));
        token_deadline_ = now + timeouts.first_token;
      } else {
        return;
      }
      if (todo.call != CallKind::kPrefill) attempt_.decode_touched = true;
      todo.call_id = call_id_;
      todo.attempt = attempt_;
      return;
    }
    case FlowAction::kRetry:
    case FlowAction::kMigrate: {
      const bool migrate = decision.action == FlowAction::kMigrate;
      avoid_.push_back(failed_worker_);
      ESTUARY_LOG(WARNING) << "request " << id_ << " (" << RequestFlow::Name(from) << "): "
                           << status << "; "
                           << (migrate ? absl::StrCat("resuming it on another worker after ",
                                                      relay_->tokens(), " tokens")
                                       : std::string("trying another worker"));
      if (migrate) parts_.metrics.migrations.Increment();
      InterruptLocked(Interrupt::kEnded, todo);
      LeaveAttemptLocked(/*finished=*/false, todo);
      BeginAttempt(todo);
      return;
    }
    case FlowAction::kComplete:
      LeaveAttemptLocked(/*finished=*/true, todo);
      EndLocked(/*complete=*/true, grpc::Status::OK, todo);
      return;
    case FlowAction::kEndCancelled:
    case FlowAction::kEndDeadline:
    case FlowAction::kEndFailed: {
      InterruptLocked(Interrupt::kEnded, todo);
      LeaveAttemptLocked(/*finished=*/false, todo);
      if (decision.action == FlowAction::kEndCancelled) {
        if (cancel_cause_ == CancelCause::kAbortRpc) {
          ESTUARY_LOG(INFO) << "request " << id_ << ": aborted by an Abort call";
          finish_ = estuary::v1::FINISH_REASON_CANCELLED;
          EndLocked(/*complete=*/true, grpc::Status::OK, todo);
        } else if (cancel_cause_ == CancelCause::kShutdown) {
          EndLocked(/*complete=*/false,
                    grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "the router shut down before the request finished (its "
                                 "--shutdown-timeout passed)"),
                    todo);
        } else {
          ESTUARY_LOG(INFO) << "request " << id_ << ": the client went away; aborting";
          EndLocked(/*complete=*/false,
                    grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"),
                    todo);
        }
        return;
      }
      if (decision.action == FlowAction::kEndDeadline) {
        EndLocked(/*complete=*/false,
                  grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                               "the request's deadline passed before it finished"),
                  todo);
        return;
      }
      absl::Status failure = status.ok() ? absl::InternalError("the request failed") : status;
      if (!decision.why.empty()) {
        failure = absl::Status(failure.code(), absl::StrCat(failure.message(), "; ", decision.why));
      }
      ESTUARY_LOG(WARNING) << "request " << id_ << " failed: " << failure;
      EndLocked(/*complete=*/false, rpc::ToGrpcStatusWithRetryHint(context_, failure), todo);
      return;
    }
  }
}

void GenerateCall::InterruptLocked(Interrupt why, Todo& todo) {
  if (call_kind_ == CallKind::kNone || interrupt_ != Interrupt::kNone) return;
  interrupt_ = why;
  // A Reserve the request no longer needs runs to its end (it is short, and bounded by
  // --reserve-timeout): cancelled, it could still reserve on the worker after the Abort that
  // follows it arrived there, and the pages would wait for their lease. OnReserveEnd aborts
  // what it reserved.
  if (why == Interrupt::kEnded && call_kind_ == CallKind::kReserve) return;
  todo.cancel = call_context_;
}

void GenerateCall::LeaveAttemptLocked(bool finished, Todo& todo) {
  Attempt& a = attempt_;
  if (a.number == 0) return;
  const int64_t tokens = a.request.prompt_ids_size();
  if (a.decode_counted) parts_.registry.Release(a.decode_id, tokens);
  if (a.prefill_counted) parts_.registry.Release(a.prefill_id, tokens);
  if (!finished) {
    // What this attempt started on its workers goes: the decode side's reservation or stream
    // (decode frees a reservation on its own only at its lease), and a prompt still prefilling.
    if (a.decode_touched) {
      todo.aborts.push_back({a.decode_address, estuary::v1::WORKER_ROLE_DECODE,
                             a.worker_request_id});
    }
    if (call_kind_ == CallKind::kPrefill) {
      todo.aborts.push_back({a.prefill_address, estuary::v1::WORKER_ROLE_PREFILL,
                             a.worker_request_id});
    }
  }
  attempt_ = Attempt();
}

FlowEvent GenerateCall::Classify(const grpc::Status& status, const std::string& worker_id) {
  failed_worker_ = worker_id;
  switch (interrupt_) {
    case Interrupt::kWorkerDropped:
      return FlowEvent::kPeerFailed;
    case Interrupt::kStageTimeout:
      return FlowEvent::kStageTimeout;
    case Interrupt::kEnded:
      return FlowEvent::kCancelled;
    case Interrupt::kNone:
      break;
  }
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      parts_.registry.MarkDead(worker_id);
      return FlowEvent::kPeerFailed;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return FlowEvent::kWorkerFull;  // that worker is full (rpc/overload.h): try another
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      // The call's deadline was the client's, or the stage's own (a hung worker).
      return client_bound_ ? FlowEvent::kDeadline : FlowEvent::kStageTimeout;
    case grpc::StatusCode::CANCELLED:
      return FlowEvent::kPeerFailed;  // the router did not cancel it: the worker ended the call
    default:
      return FlowEvent::kFailed;
  }
}

void GenerateCall::SendLocked(GenerateResponse response, Todo& todo) {
  if (ended_) return;
  response.set_request_id(id_);
  if (write_in_flight_) {
    if (pending_.has_value()) {
      MergeChunk(response, *pending_);
    } else {
      pending_ = std::move(response);
    }
    return;
  }
  writing_ = std::move(response);
  write_in_flight_ = true;
  todo.write = true;
}

void GenerateCall::FirstTokenLocked(absl::Time now) {
  first_token_at_ = now;
  last_token_at_ = now;
  timings_.set_time_to_first_token_seconds(absl::ToDoubleSeconds(now - arrival_));
  if (attempt_.prefill_address.empty()) {
    timings_.set_prefill_seconds(absl::ToDoubleSeconds(now - attempt_dispatched_));
  }
  LeaveQueueLocked();
  running_ = true;
  parts_.metrics.running.Add(1);
  parts_.metrics.prompt_tokens.Increment(static_cast<double>(prompt_.size()));
  parts_.ttft_floor.Observe(static_cast<int>(prompt_.size()), now - arrival_, now);
}

void GenerateCall::EndLocked(bool complete, const grpc::Status& status, Todo& todo) {
  if (ended_) return;
  ended_ = true;
  const absl::Time now = absl::Now();
  LeaveQueueLocked();
  if (running_) parts_.metrics.running.Add(-1);
  running_ = false;
  if (registered_) parts_.active.Remove(id_);
  registered_ = false;
  RouterMetrics& metrics = parts_.metrics;
  if (complete) {
    metrics.Finished(finish_).Increment();
  } else if (status.error_code() == grpc::StatusCode::CANCELLED) {
    metrics.cancelled.Increment();
  } else {
    metrics.error.Increment();
  }
  metrics.e2e.Observe(absl::ToDoubleSeconds(now - arrival_));
  if (timings_.queue_seconds() > 0) metrics.queue.Observe(timings_.queue_seconds());
  if (first_token_at_.has_value()) {
    metrics.ttft.Observe(timings_.time_to_first_token_seconds());
    timings_.set_decode_seconds(absl::ToDoubleSeconds(now - *first_token_at_));
  }
  if (complete) {
    GenerateResponse last;
    last.set_request_id(id_);
    estuary::v1::Complete* done = last.mutable_complete();
    done->set_finish_reason(finish_.value_or(estuary::v1::FINISH_REASON_UNSPECIFIED));
    relay_->FillUsage(static_cast<int>(prompt_.size()), done->mutable_usage());
    *done->mutable_timings() = timings_;
    final_ = std::move(last);
  } else {
    end_status_ = status;
  }
  if (write_in_flight_) return;  // OnWriteDone flushes what waits, then finishes
  if (pending_.has_value()) {
    writing_ = std::move(*pending_);
    pending_.reset();
    write_in_flight_ = true;
    todo.write = true;
    return;
  }
  MarkFinished(todo);
}

void GenerateCall::MarkFinished(Todo& todo) {
  finished_ = true;
  todo.finish = true;
  // The admission slot frees as the end goes out, not at OnDone, which gRPC may run after the
  // client has seen the end: a client that starts its next stream then finds the slot free.
  ticket_.reset();
}

void GenerateCall::Run(Todo todo) {
  for (const Todo::Abort& abort : todo.aborts) {
    SendWorkerAbort(parts_.channels.Get(abort.address), abort.role, abort.request_id,
                    parts_.options.timeouts.abort);
  }
  if (todo.cancel != nullptr) todo.cancel->TryCancel();
  switch (todo.call) {
    case CallKind::kReserve:
      StartReserve(todo.attempt, todo.context, todo.call_id);
      break;
    case CallKind::kPrefill:
      StartPrefill(todo.attempt, todo.context, todo.call_id);
      break;
    case CallKind::kDecode: {
      estuary::v1::DecodeRequest request;
      if (todo.attempt.prefill_address.empty()) {
        *request.mutable_local_prefill() = todo.attempt.request;
      } else {
        request.set_request_id(todo.attempt.worker_request_id);
      }
      // A draining worker hands the stream back at once when the router resumes streams.
      request.set_resumable(parts_.options.migration_limit > 0);
      DecodeStream::Start(parts_.channels.Get(todo.attempt.decode_address), todo.context,
                          std::move(request), shared_from_this(), todo.call_id);
      break;
    }
    case CallKind::kNone:
      break;
  }
  // The server side last: finishing may end the call (OnDone) at once.
  if (todo.write) StartWrite(&writing_);
  if (todo.finish) {
    if (final_.has_value()) {
      StartWriteAndFinish(&*final_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(end_status_);
    }
  }
}

// ---- Worker calls ----

void GenerateCall::StartReserve(const Attempt& attempt,
                                std::shared_ptr<grpc::ClientContext> context, uint64_t call) {
  struct Op {
    std::unique_ptr<estuary::v1::DecodeWorker::Stub> stub;
    estuary::v1::ReserveRequest request;
    estuary::v1::ReserveResponse response;
  };
  auto op = std::make_shared<Op>();
  op->stub = estuary::v1::DecodeWorker::NewStub(parts_.channels.Get(attempt.decode_address));
  *op->request.mutable_request() = attempt.request;
  op->stub->async()->Reserve(
      context.get(), &op->request, &op->response,
      [self = shared_from_this(), op, context, call, address = attempt.decode_address,
       id = attempt.worker_request_id](grpc::Status status) {
        self->OnReserveEnd(call, status, op->response, address, id);
      });
}

void GenerateCall::StartPrefill(const Attempt& attempt,
                                std::shared_ptr<grpc::ClientContext> context, uint64_t call) {
  struct Op {
    std::unique_ptr<estuary::v1::PrefillWorker::Stub> stub;
    estuary::v1::PrefillRequest request;
    estuary::v1::PrefillResponse response;
  };
  auto op = std::make_shared<Op>();
  op->stub = estuary::v1::PrefillWorker::NewStub(parts_.channels.Get(attempt.prefill_address));
  *op->request.mutable_request() = attempt.request;
  *op->request.mutable_transfer() = attempt.transfer;
  op->stub->async()->Prefill(
      context.get(), &op->request, &op->response,
      [self = shared_from_this(), op, context, call, address = attempt.decode_address,
       id = attempt.worker_request_id](grpc::Status status) {
        self->OnPrefillEnd(call, status, op->response, address, id,
                           !status.ok() && rpc::ServerBlamedItsPeer(*context));
      });
}

void GenerateCall::OnReserveEnd(uint64_t call, const grpc::Status& status,
                                const estuary::v1::ReserveResponse& response,
                                const std::string& decode_address,
                                const std::string& worker_request_id) {
  Todo todo;
  {
    absl::MutexLock lock(&mu_);
    if (call != call_id_ || call_kind_ != CallKind::kReserve) return;  // cannot happen
    const bool ended = interrupt_ == Interrupt::kEnded;
    call_kind_ = CallKind::kNone;
    if (interrupt_ != Interrupt::kNone) {
      // The attempt ended (or is ending) while the Reserve ran, and the abort its end sent may
      // have reached the worker before the Reserve did: whatever was reserved goes now.
      todo.aborts.push_back({decode_address, estuary::v1::WORKER_ROLE_DECODE, worker_request_id});
    }
    if (ended) {
      // Nothing more: the request is over.
    } else if (status.ok() && interrupt_ == Interrupt::kNone) {
      attempt_.transfer = response.transfer();
      Apply(FlowEvent::kReserved, absl::OkStatus(), todo);
    } else {
      const FlowEvent event = Classify(status, attempt_.decode_id);
      const absl::Status failure = CallFailure("Reserve", attempt_.decode_id, status);
      Apply(event, InterruptedOr(failure, "--reserve-timeout"), todo);
    }
  }
  Run(std::move(todo));
}

void GenerateCall::OnPrefillEnd(uint64_t call, const grpc::Status& status,
                                const estuary::v1::PrefillResponse& response,
                                const std::string& decode_address,
                                const std::string& worker_request_id, bool decode_failed) {
  Todo todo;
  {
    absl::MutexLock lock(&mu_);
    if (call != call_id_ || call_kind_ != CallKind::kPrefill) return;  // cannot happen
    const bool ended = interrupt_ == Interrupt::kEnded;
    call_kind_ = CallKind::kNone;
    if (ended) {
      // As in OnReserveEnd: a prompt pushed after the abort leaves a completed reservation.
      if (status.ok()) {
        todo.aborts.push_back({decode_address, estuary::v1::WORKER_ROLE_DECODE,
                               worker_request_id});
      }
    } else if (status.ok() && interrupt_ == Interrupt::kNone) {
      if (attempt_.prefill_counted) {
        parts_.registry.Release(attempt_.prefill_id, attempt_.request.prompt_ids_size());
        attempt_.prefill_counted = false;
      }
      timings_.set_prefill_seconds(response.prefill_seconds());
      timings_.set_transfer_seconds(response.transfer_seconds());
      Apply(FlowEvent::kPrefilled, absl::OkStatus(), todo);
    } else {
      // The prefill worker sends the decode worker an abort completion itself when it can; the
      // attempt's end aborts the reservation too, for when it cannot (unreachable). A push that
      // failed on the decode worker's side is that worker's failure: it is the one dropped and
      // avoided, and the prefill worker keeps serving.
      const FlowEvent event =
          Classify(status, decode_failed ? attempt_.decode_id : attempt_.prefill_id);
      const absl::Status failure = CallFailure("Prefill", attempt_.prefill_id, status);
      Apply(event, InterruptedOr(failure, "--prefill-timeout"), todo);
    }
  }
  Run(std::move(todo));
}

bool GenerateCall::OnDecodeResponse(uint64_t call, const estuary::v1::DecodeResponse& response) {
  Todo todo;
  bool more = true;
  {
    absl::MutexLock lock(&mu_);
    if (call != call_id_ || call_kind_ != CallKind::kDecode || interrupt_ != Interrupt::kNone) {
      return false;  // this stream is being cancelled: read no more
    }
    const bool final = response.finished();
    if (final) {
      final_response_ = response;
      token_deadline_ = absl::InfiniteFuture();
    }
    const bool normal_end = final && response.status_code() == 0 && !response.handed_back();
    GenerateResponse out;
    estuary::v1::Chunk* chunk = out.mutable_chunk();
    // Text held back at the end is released for a normal end only.
    const bool stopped = relay_->Add(response, normal_end, chunk);
    const int tokens = chunk->token_ids_size();
    if (tokens > 0) {
      const absl::Time now = absl::Now();
      if (first_token_at_.has_value()) {
        parts_.metrics.ObserveChunk(absl::ToDoubleSeconds(now - last_token_at_), tokens);
        last_token_at_ = now;
      } else {
        FirstTokenLocked(now);
      }
      parts_.metrics.generation_tokens.Increment(tokens);
      if (!final) token_deadline_ = now + parts_.options.timeouts.token_gap;
      Apply(FlowEvent::kTokens, absl::OkStatus(), todo);
    }
    if (tokens > 0 || !chunk->text().empty()) SendLocked(std::move(out), todo);
    if (stopped) {
      // The decode worker would go on: cancel the stream and abort the request there.
      finish_ = estuary::v1::FINISH_REASON_STOP_STRING;
      todo.aborts.push_back({attempt_.decode_address, estuary::v1::WORKER_ROLE_DECODE,
                             attempt_.worker_request_id});
      InterruptLocked(Interrupt::kEnded, todo);
      Apply(FlowEvent::kFinished, absl::OkStatus(), todo);
      more = false;
    }
  }
  Run(std::move(todo));
  return more;
}

void GenerateCall::OnDecodeEnd(uint64_t call, const grpc::Status& status) {
  Todo todo;
  {
    absl::MutexLock lock(&mu_);
    if (call != call_id_ || call_kind_ != CallKind::kDecode) return;  // cannot happen
    call_kind_ = CallKind::kNone;
    token_deadline_ = absl::InfiniteFuture();
    const std::optional<estuary::v1::DecodeResponse> last = std::move(final_response_);
    final_response_.reset();
    const std::string worker = attempt_.decode_id;
    if (interrupt_ == Interrupt::kEnded) {
      // Ended already (a stop string, a cancel): the worker aborted the request with the call.
    } else if (last.has_value() && interrupt_ == Interrupt::kNone) {
      failed_worker_ = worker;
      const absl::Status end = rpc::StatusFromCode(last->status_code(), last->status_message());
      if (last->handed_back()) {
        Apply(FlowEvent::kPeerFailed,
              absl::UnavailableError(absl::StrCat("decode worker ", worker,
                                                  " drains and handed the stream back")),
              todo);
      } else if (end.ok()) {
        finish_ = last->finish_reason();
        Apply(FlowEvent::kFinished, absl::OkStatus(), todo);
      } else {
        const FlowEvent event = end.code() == absl::StatusCode::kUnavailable
                                    ? FlowEvent::kPeerFailed
                                : end.code() == absl::StatusCode::kResourceExhausted
                                    ? FlowEvent::kWorkerFull
                                    : FlowEvent::kFailed;
        Apply(event, absl::Status(end.code(), absl::StrCat("Decode on worker ", worker, ": ",
                                                           end.message())),
              todo);
      }
    } else if (interrupt_ != Interrupt::kNone || !status.ok()) {
      const FlowEvent event = Classify(status, worker);
      Apply(event, InterruptedOr(CallFailure("Decode", worker, status), nullptr), todo);
    } else {
      Apply(FlowEvent::kFailed,
            absl::InternalError(absl::StrCat("the decode stream on worker ", worker,
                                             " ended without a final message")),
            todo);
    }
  }
  Run(std::move(todo));
}

// ---- From outside: cancels, the watchdog ----

void GenerateCall::Cancel(CancelCause cause) {
  Todo todo;
  {
    absl::MutexLock lock(&mu_);
    if (ended_ || flow_ == std::nullopt || flow_->done()) return;
    cancel_cause_ = cause;
    Apply(FlowEvent::kCancelled, absl::CancelledError("the request was cancelled"), todo);
  }
  Run(std::move(todo));
}

void GenerateCall::Tick(absl::Time now) {
  Todo todo;
  {
    absl::MutexLock lock(&mu_);
    if (call_kind_ != CallKind::kDecode || interrupt_ != Interrupt::kNone ||
        now <= token_deadline_) {
      return;
    }
    InterruptLocked(Interrupt::kStageTimeout, todo);
  }
  Run(std::move(todo));
}

void GenerateCall::OnWorkerDropped(const DroppedWorker& worker) {
  Todo todo;
  {
    absl::MutexLock lock(&mu_);
    if (call_kind_ == CallKind::kNone || interrupt_ != Interrupt::kNone) return;
    const bool decode = worker.worker_id == attempt_.decode_id;
    const bool prefill =
        call_kind_ == CallKind::kPrefill && worker.worker_id == attempt_.prefill_id;
    if (!decode && !prefill) return;
    // A worker that unregistered drains: it finishes what it has within its --shutdown-timeout,
    // unless the router resumes its streams elsewhere (then at once, as a failed one).
    if (std::string_view(worker.reason) == "unregistered" &&
        (!decode || parts_.options.migration_limit == 0)) {
      return;
    }
    dropped_worker_ = worker.worker_id;
    dropped_reason_ = worker.reason;
    InterruptLocked(Interrupt::kWorkerDropped, todo);
  }
  Run(std::move(todo));
}

absl::Status GenerateCall::InterruptedOr(absl::Status failure, const char* stage_flag) {
  const StageTimeouts& timeouts = parts_.options.timeouts;
  switch (interrupt_) {
    case Interrupt::kWorkerDropped:
      return absl::UnavailableError(
          absl::StrCat("worker ", dropped_worker_, " left the registry (", dropped_reason_, ")"));
    case Interrupt::kStageTimeout:
      return absl::DeadlineExceededError(absl::StrCat(
          "decode worker ", attempt_.decode_id, " sent no token within ",
          flow_->state() == FlowState::kStreaming
              ? absl::StrCat(absl::FormatDuration(timeouts.token_gap), " (--token-gap-timeout)")
              : absl::StrCat(absl::FormatDuration(timeouts.first_token),
                             " (--first-token-timeout)")));
    default:
      break;
  }
  if (failure.code() == absl::StatusCode::kDeadlineExceeded && !client_bound_ &&
      stage_flag != nullptr) {
    return absl::DeadlineExceededError(
        absl::StrCat(failure.message(), " (past its ", stage_flag, ")"));
  }
  return failure;
}

// ---- The server side ----

void GenerateCall::OnWriteDone(bool ok) {
  std::shared_ptr<GenerateCall> keep = shared_from_this();  // Run may finish the call
  Todo todo;
  {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    if (!ok) {
      // The client went away (OnCancel says so too); nothing more can be written.
      pending_.reset();
      if (!ended_) {
        Apply(FlowEvent::kCancelled, absl::CancelledError("the client went away"), todo);
      }
    }
    if (!finished_) {
      if (ok && pending_.has_value()) {
        writing_ = std::move(*pending_);
        pending_.reset();
        write_in_flight_ = true;
        todo.write = true;
      } else if (ended_) {
        MarkFinished(todo);
      }
    }
  }
  Run(std::move(todo));
}

void GenerateCall::OnCancel() {
  std::shared_ptr<GenerateCall> keep = shared_from_this();
  Todo todo;
  {
    absl::MutexLock lock(&mu_);
    if (ended_ || flow_ == std::nullopt) return;
    // gRPC cancels the call when the client cancels, goes away, or its deadline passes (a
    // little before this process's clock says so, at times).
    if (absl::Now() + absl::Milliseconds(5) >= client_deadline_) {
      Apply(FlowEvent::kDeadline, absl::DeadlineExceededError("the deadline passed"), todo);
    } else {
      Apply(FlowEvent::kCancelled, absl::CancelledError("the client went away"), todo);
    }
  }
  Run(std::move(todo));
}

void GenerateCall::OnDone() {
  std::shared_ptr<GenerateCall> self;
  {
    absl::MutexLock lock(&mu_);
    ticket_.reset();  // the stream's admission slot
    self = std::move(self_);
  }
  // `self` goes last: the worker calls still running keep the call alive until they end.
}

}  // namespace estuary::router
