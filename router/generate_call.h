#pragma once
// GenerateCall: one estuary.v1.Inference.Generate call, served on gRPC's callback API (a
// ServerWriteReactor), so that a request waiting on a worker or streaming to a slow client holds
// no thread (issue 14 item 7). Its RequestFlow (request_flow.h) decides each step; this class
// makes the calls that step needs, all on gRPC's callback API too:
//
//   admitted -> placed: the registry picks a decode worker, and a prefill worker unless the
//                       decode worker prefills the prompt itself (short prompts, or no
//                       compatible prefill worker);
//   placed -> reserved: DecodeWorker.Reserve (pages under a lease);
//   reserved -> prefilled: PrefillWorker.Prefill (the prompt, its KV pushed into those pages);
//   prefilled (or placed, local) -> streaming: DecodeWorker.Decode, relayed as Chunks
//                       (token_relay.h: text, stop strings, exit layers);
//   streaming -> done: one Complete (finish reason, usage, timings).
//
// Deadlines (stage_timeouts.h): every call to a worker has one, the client's or the stage's own;
// a Decode stream's first token and each gap between tokens are timed by the router's watchdog
// (Tick). Failures (request_flow.h): a worker that fails (UNAVAILABLE, dropped from the registry,
// a stream handed back by a draining worker) or hangs (a stage past its timeout) gets the
// request retried on other workers before its first token, and resumed after it (migration,
// --migration-limit): the new attempt's prompt is the request's prompt plus every token the
// client has (WorkerRequest.resumed_output_tokens), so the client sees one stream with nothing
// lost or repeated. Each attempt has its own worker-side request id (the client's id, then
// "<id>/attempt-N"), so a retry never meets its earlier attempt on a worker; an Abort by the
// client's id reaches the current attempt. Whatever ends early is aborted on its workers.
//
// Threading: reactions come on gRPC's threads, Cancel / Tick / OnWorkerDropped on others; one
// mutex serializes the decisions, and no gRPC operation is started while it is held (gRPC may
// run a reaction inline). The call keeps itself alive until gRPC's OnDone and every worker call
// it started have ended.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/common/metrics.h"
#include "core/tokenizer/tokenizer.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "router/active_calls.h"
#include "router/admission.h"
#include "router/decode_stream.h"
#include "router/prompt_homes.h"
#include "router/request_flow.h"
#include "router/request_validation.h"
#include "router/router_metrics.h"
#include "router/router_options.h"
#include "router/token_relay.h"
#include "router/ttft_floor.h"
#include "router/worker_channels.h"
#include "router/worker_registry.h"

namespace estuary::router {

// What every GenerateCall of a router shares; owned by RouterService, outlives the calls.
struct RouterParts {
  const RouterOptions& options;
  const Tokenizer& tokenizer;
  const ModelLimits& limits;
  const std::string& served_name;
  RouterMetrics& metrics;
  WorkerRegistry& registry;
  PromptHomes& prompt_homes;
  Admission& admission;
  TtftFloor& ttft_floor;
  WorkerChannels& channels;
  ActiveCalls& active;
  const std::atomic<bool>& draining;
  std::function<std::string()> new_request_id;
  // GenerateCall objects alive (their worker calls may outlive the client's call): the owner
  // waits for none before it goes.
  std::atomic<int>& live_calls;
};

// The reactor of a Generate call refused before it began (e.g. a missing API key).
grpc::ServerWriteReactor<estuary::v1::GenerateResponse>* RefusedGenerate(
    const grpc::Status& status);

class GenerateCall final : public grpc::ServerWriteReactor<estuary::v1::GenerateResponse>,
                           public DecodeStream::Owner,
                           public std::enable_shared_from_this<GenerateCall> {
 public:
  // Why a call is cancelled from outside its own reactions.
  enum class CancelCause {
    kAbortRpc,  // Inference.Abort by its id: ends with a Complete (finish reason CANCELLED)
    kShutdown,  // the router's drain ran past --shutdown-timeout: ends UNAVAILABLE
  };

  // The reactor for one Generate call: admits and validates `request`, then runs it. Refusals
  // (draining, admission, validation, an unmeetable deadline) finish the call at once.
  static grpc::ServerWriteReactor<estuary::v1::GenerateResponse>* Start(
      RouterParts& parts, grpc::CallbackServerContext* context,
      const estuary::v1::GenerateRequest& request);

  ~GenerateCall() override;

  void Cancel(CancelCause cause);
  // Who made the call (rpc::CallerIdentity: its API key and TLS identity): only that caller's
  // Abort reaches it. Holds credentials: compare with rpc::SameCaller, never log.
  const std::string& owner() const { return owner_; }
  // The watchdog's beat: a Decode stream past its first-token or token-gap timeout is cancelled
  // (and the request retried or resumed elsewhere).
  void Tick(absl::Time now);
  // `worker` left the registry: a call in flight on it is cancelled and the request retried or
  // resumed elsewhere (a worker that unregistered to drain: only with migration on; otherwise
  // the worker finishes what it has within its --shutdown-timeout).
  void OnWorkerDropped(const DroppedWorker& worker);

  // ServerWriteReactor.
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // DecodeStream::Owner.
  bool OnDecodeResponse(uint64_t call, const estuary::v1::DecodeResponse& response) override;
  void OnDecodeEnd(uint64_t call, const grpc::Status& status) override;

  GenerateCall(RouterParts& parts, grpc::CallbackServerContext* context);  // Start's

 private:
  const std::string owner_;
  // The worker call in progress (at most one at a time).
  enum class CallKind { kNone, kReserve, kPrefill, kDecode };
  // Why the router cancelled that call itself.
  enum class Interrupt { kNone, kEnded, kWorkerDropped, kStageTimeout };
  // One attempt: its workers and worker-side id.
  struct Attempt {
    int number = 0;
    std::string worker_request_id;
    estuary::v1::WorkerRequest request;  // as sent to the workers
    std::string decode_id, decode_address;
    std::string prefill_id, prefill_address;  // empty: the decode worker prefills
    bool decode_counted = false, prefill_counted = false;  // in the registry's in-flight counts
    bool decode_touched = false;  // Reserve or Decode sent: abort on the decode worker if cut short
    estuary::v1::TransferDescriptor transfer;  // Reserve's answer
  };
  // What to do once the mutex is released.
  struct Todo {
    CallKind call = CallKind::kNone;  // start this call of `attempt`, as `call_id`
    std::shared_ptr<grpc::ClientContext> context;
    uint64_t call_id = 0;
    Attempt attempt;
    std::shared_ptr<grpc::ClientContext> cancel;  // TryCancel this one
    struct Abort {
      std::string address;
      estuary::v1::WorkerRole role;
      std::string request_id;
    };
    std::vector<Abort> aborts;
    bool write = false;   // start the write of writing_
    bool finish = false;  // finish the server call (final_ and end_status_)
  };

  // Admission and validation; false when the call was refused (and finished).
  bool Admit(const estuary::v1::GenerateRequest& request);
  grpc::Status AdmitLocked(const estuary::v1::GenerateRequest& request);  // takes mu_
  // Steps the flow with `event` (and, for failures, `status`) and fills `todo` with what follows.
  void Apply(FlowEvent event, const absl::Status& status, Todo& todo)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places a new attempt (the flow is admitted) and prepares its first call.
  void BeginAttempt(Todo& todo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The server side is done: `todo` finishes the call, and the admission slot is given back.
  void MarkFinished(Todo& todo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current attempt's calls, started outside the mutex.
  void Run(Todo todo);
  void StartReserve(const Attempt& attempt, std::shared_ptr<grpc::ClientContext> context,
                    uint64_t call);
  void StartPrefill(const Attempt& attempt, std::shared_ptr<grpc::ClientContext> context,
                    uint64_t call);
  // `decode_address` and `worker_request_id` name the attempt the call belonged to (it may have
  // ended meanwhile).
  void OnReserveEnd(uint64_t call, const grpc::Status& status,
                    const estuary::v1::ReserveResponse& response,
                    const std::string& decode_address, const std::string& worker_request_id);
  // `decode_failed`: the prefill worker said its failure was the decode worker's (its KV push's
  // peer; rpc/peer_failure.h).
  void OnPrefillEnd(uint64_t call, const grpc::Status& status,
                    const estuary::v1::PrefillResponse& response,
                    const std::string& decode_address, const std::string& worker_request_id,
                    bool decode_failed);
  // A new call context for the current attempt's next call, with `deadline`.
  std::shared_ptr<grpc::ClientContext> NewCallLocked(CallKind kind, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The flow event for a worker call that ended with `status` (not OK).
  FlowEvent Classify(const grpc::Status& status, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the call in progress for `why` (kNone: nothing was running).
  void InterruptLocked(Interrupt why, Todo& todo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The failure to report for the call that just ended: what the router cancelled it for, when
  // it did, else `failure` (naming `stage_flag` when the stage's own deadline passed).
  absl::Status InterruptedOr(absl::Status failure, const char* stage_flag)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current attempt ends: its registry counts go back and, unless it `finished`, what it
  // started on its workers is aborted.
  void LeaveAttemptLocked(bool finished, Todo& todo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a chunk for the client (merged with one still waiting for the previous write).
  void SendLocked(estuary::v1::GenerateResponse response, Todo& todo)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the call: with a Complete message when `complete`, else with `status`.
  void EndLocked(bool complete, const grpc::Status& status, Todo& todo)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first token reached the client: queue -> running, TTFT.
  void FirstTokenLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LeaveQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RouterParts& parts_;
  grpc::CallbackServerContext* const context_;
  const absl::Time arrival_;
  std::shared_ptr<GenerateCall> self_;  // until OnDone

  absl::Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);  // the client-visible request id
  std::optional<Admission::Ticket> ticket_ ABSL_GUARDED_BY(mu_);
  bool queued_ ABSL_GUARDED_BY(mu_) = false;   // counted in estuary:num_requests_waiting
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // counted in estuary:num_requests_running
  bool registered_ ABSL_GUARDED_BY(mu_) = false;  // in parts_.active
  absl::Time client_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<int32_t> prompt_ ABSL_GUARDED_BY(mu_);
  estuary::v1::WorkerRequest base_ ABSL_GUARDED_BY(mu_);  // what every attempt sends, but ids
  std::string same_prompt_as_ ABSL_GUARDED_BY(mu_);       // the first attempt only
  std::optional<RequestFlow> flow_ ABSL_GUARDED_BY(mu_);
  std::optional<TokenRelay> relay_ ABSL_GUARDED_BY(mu_);
  Attempt attempt_ ABSL_GUARDED_BY(mu_);
  // Workers that failed, hung or were full for this request: its later attempts go elsewhere
  // while another worker of the role can take them.
  std::vector<std::string> avoid_ ABSL_GUARDED_BY(mu_);
  std::string failed_worker_ ABSL_GUARDED_BY(mu_);  // the worker of the latest failure
  // The worker call in progress.
  CallKind call_kind_ ABSL_GUARDED_BY(mu_) = CallKind::kNone;
  uint64_t call_id_ ABSL_GUARDED_BY(mu_) = 0;  // increases with every call
  std::shared_ptr<grpc::ClientContext> call_context_ ABSL_GUARDED_BY(mu_);
  Interrupt interrupt_ ABSL_GUARDED_BY(mu_) = Interrupt::kNone;
  std::string dropped_worker_ ABSL_GUARDED_BY(mu_);  // with kWorkerDropped: who, and why
  const char* dropped_reason_ ABSL_GUARDED_BY(mu_) = "";
  bool client_bound_ ABSL_GUARDED_BY(mu_) = false;  // its deadline is the client's
  absl::Time token_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // Decode streams
  // The Decode stream's final response, once read.
  std::optional<estuary::v1::DecodeResponse> final_response_ ABSL_GUARDED_BY(mu_);
  // Timings.
  estuary::v1::Timings timings_ ABSL_GUARDED_BY(mu_);
  bool dispatched_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time attempt_dispatched_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> first_token_at_ ABSL_GUARDED_BY(mu_);
  absl::Time last_token_at_ ABSL_GUARDED_BY(mu_);
  std::optional<estuary::v1::FinishReason> finish_ ABSL_GUARDED_BY(mu_);
  std::optional<CancelCause> cancel_cause_ ABSL_GUARDED_BY(mu_);  // Cancel's
  // The server side: one write at a time; what comes meanwhile is merged into pending_.
  estuary::v1::GenerateResponse writing_ ABSL_GUARDED_BY(mu_);
  std::optional<estuary::v1::GenerateResponse> pending_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // EndLocked ran
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish (or WriteAndFinish) started
  std::optional<estuary::v1::GenerateResponse> final_ ABSL_GUARDED_BY(mu_);  // the Complete
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace estuary::router
