#include "router/router_service.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/metrics.h"
#include "core/common/status_macros.h"
#include "core/loader/model_metadata.h"
#include "router/request_ids.h"
#include "router/router_metrics.h"
#include "router/stop_matcher.h"
#include "rpc/api_key.h"
#include "rpc/caller_identity.h"
#include "rpc/channels.h"
#include "rpc/cluster_security.h"
#include "rpc/overload.h"
#include "rpc/status_convert.h"
#include "rpc/worker_request.h"

namespace estuary::router {
namespace {

using estuary::v1::FinishReason;
using rpc::FromGrpcStatus;
using rpc::ToGrpcStatus;

constexpr absl::Duration kWatchInterval = absl::Milliseconds(50);
constexpr absl::Duration kAbortTimeout = absl::Seconds(1);

std::chrono::system_clock::time_point ChronoDeadline(absl::Time deadline) {
  return absl::ToChronoTime(deadline);
}

// A registering worker's certificate identity under mutual TLS ("" otherwise): the registry
// keeps a live worker's id for that identity (worker_registry.h).
std::string PeerIdentityOf(const grpc::ServerContext* context) {
  return context == nullptr ? std::string() : rpc::PeerIdentity(*context);
}


}  // namespace

// One Generate call in flight, shared with the watchdog and Abort.
struct RouterService::Active {
  Active(std::string request_id, std::string owner_identity)
      : id(std::move(request_id)), owner(std::move(owner_identity)) {}
  const std::string id;
  // Who made the Generate (rpc::CallerIdentity: its API key, its TLS identity): only that
  // caller's Abort finds the request.
  const std::string owner;
  absl::Mutex mu;
  grpc::ServerContext* server_context ABSL_GUARDED_BY(mu) = nullptr;  // null once the call ends
  grpc::ClientContext* worker_call ABSL_GUARDED_BY(mu) = nullptr;     // the worker call under way
  std::string decode_address ABSL_GUARDED_BY(mu);
  std::string prefill_address ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  bool client_gone ABSL_GUARDED_BY(mu) = false;
  bool shut_down ABSL_GUARDED_BY(mu) = false;  // ended by the router's drain timeout (EndAll)

  bool Cancelled() {
    absl::MutexLock lock(&mu);
    return cancelled;
  }
  // Makes `call` the one Cancel interrupts; false when the request is already cancelled.
  bool Begin(grpc::ClientContext* call) {
    absl::MutexLock lock(&mu);
    if (cancelled) return false;
    worker_call = call;
    return true;
  }
  void End() {
    absl::MutexLock lock(&mu);
    worker_call = nullptr;
  }
};

// What one request carries from attempt to attempt.
struct RouterService::Attempt {
  estuary::v1::WorkerRequest request;  // as sent to the workers
  absl::Time arrival;
  absl::Time deadline = absl::InfiniteFuture();
  estuary::v1::Timings timings;
  bool first_token_seen = false;
  absl::Time first_token_at;
  absl::Time last_token_at;  // for estuary:time_per_output_token_seconds
  std::function<void()> on_first_token;  // leaves the admission queue
  std::string same_prompt_as;  // GenerateRequest.same_prompt_as; the first attempt only
  std::optional<FinishReason> finish;  // set when the request ended normally
};

// Turns decode responses into Chunks: text through the detokenizer and the stop strings,
// exit layers, usage figures.
class RouterService::Relay {
 public:
  Relay(const Tokenizer& tokenizer, int32_t last_prompt_id, std::vector<std::string> stops,
        bool include_stop, int num_layers)
      : detokenizer_(tokenizer, last_prompt_id),
        stops_(std::move(stops), include_stop),
        num_layers_(num_layers),
        histogram_(static_cast<size_t>(num_layers) + 1, 0) {}

  // Adds the tokens of `response` to `chunk`; true when a stop string matched (later tokens are
  // dropped). `final` flushes the held-back text.
  bool Add(const estuary::v1::DecodeResponse& response, bool final, estuary::v1::Chunk* chunk) {
    std::string text;
    // Log-probabilities pass through only when the worker gave one per token.
    const bool with_logprobs = response.logprobs_size() == response.token_ids_size();
    draft_tokens_ += response.draft_tokens();  // the final response of a lossless request
    accepted_tokens_ += response.accepted_tokens();
    for (int i = 0; i < response.token_ids_size(); ++i) {
      const int32_t id = response.token_ids(i);
      const int layers = i < response.backbone_layers_size() ? response.backbone_layers(i)
                                                             : num_layers_;
      chunk->add_token_ids(id);
      if (with_logprobs) *chunk->add_logprobs() = response.logprobs(i);
      chunk->add_exit_layers(layers >= num_layers_ || layers <= 0 ? -1 : layers - 1);
      ++tokens_;
      layer_sum_ += std::clamp(layers, 0, num_layers_);
      ++histogram_[static_cast<size_t>(std::clamp(layers, 0, num_layers_))];
      StopMatcher::Result r = stops_.Push(detokenizer_.Push(id));
      text += r.text;
      if (r.stopped) {
        chunk->mutable_text()->append(text);
        return true;
      }
    }
    if (final) {
      StopMatcher::Result r = stops_.Push(detokenizer_.Flush());
      text += r.text;
      if (r.stopped) {
        chunk->mutable_text()->append(text);
        return true;
      }
      text += stops_.Flush();
    }
    chunk->mutable_text()->append(text);
    return false;
  }

  int tokens() const { return tokens_; }
  void FillUsage(int prompt_tokens, estuary::v1::Usage* usage) const {
    usage->set_prompt_tokens(prompt_tokens);
    usage->set_completion_tokens(tokens_);
    usage->set_mean_backbone_layers(tokens_ > 0 ? static_cast<double>(layer_sum_) / tokens_ : 0.0);
    for (int64_t n : histogram_) usage->add_exit_layer_histogram(n);
    usage->set_draft_tokens(draft_tokens_);
    usage->set_accepted_tokens(accepted_tokens_);
  }

 private:
  IncrementalDetokenizer detokenizer_;
  StopMatcher stops_;
  const int num_layers_;
  int tokens_ = 0;
  int64_t layer_sum_ = 0;
  std::vector<int64_t> histogram_;
  int64_t draft_tokens_ = 0;  // summed over attempts (a migrated stream's workers)
  int64_t accepted_tokens_ = 0;
};

absl::StatusOr<std::unique_ptr<RouterService>> RouterService::Create(const RouterOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(ModelMetadata metadata, LoadModelMetadata(options.model));
  const LlamaConfig& config = metadata.config;
  ESTUARY_ASSIGN_OR_RETURN(GenerationDefaults defaults, LoadGenerationDefaults(options.model));
  ESTUARY_LOG(INFO) << "sampling defaults: " << defaults.source;
  ModelLimits limits{config.max_seq_len, config.vocab_size, config.n_layers, std::move(defaults)};
  if (options.max_model_len > config.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-model-len = ", options.max_model_len,
                     " exceeds the model's context length of ", config.max_seq_len));
  }
  if (options.max_model_len > 0) limits.context_length = options.max_model_len;
  return std::make_unique<RouterService>(options, std::move(metadata.tokenizer), limits);
}

RouterService::RouterService(const RouterOptions& options, std::unique_ptr<Tokenizer> tokenizer,
                             const ModelLimits& limits)
    : options_(options),
      model_id_(options.model_id.empty() ? DefaultModelId(options.model) : options.model_id),
      served_name_(options.served_model_name.empty() ? model_id_ : options.served_model_name),
      tokenizer_(std::move(tokenizer)),
      limits_(limits),
      // Registered up front: /metrics shows them before the first request.
      metrics_(RouterMetrics::For(served_name_)),  // vLLM's model_name: the served name
      registry_(ServedModel{model_id_, limits.context_length, limits.vocab_size, limits.num_layers},
                RegistryOptions{options.worker_timeout, options.heartbeat_interval,
                                options.policy}) {
  if (!options.discover_workers.empty()) {
    DiscoveryOptions discovery;
    discovery.targets = options.discover_workers;
    discovery.interval = options.discovery_interval;
    discovery_ = std::make_unique<WorkerDiscovery>(registry_, std::move(discovery));
  }
  watchdog_ = std::thread([this] { Watch(); });
}

RouterService::~RouterService() {
  {
    absl::MutexLock lock(&active_mu_);
    stopping_ = true;
  }
  watchdog_.join();
}

void RouterService::StartDrain() { draining_ = true; }

int RouterService::active_requests() {
  absl::MutexLock lock(&active_mu_);
  return static_cast<int>(active_.size());
}

void RouterService::EndAll() {
  std::vector<std::shared_ptr<Active>> live;
  {
    absl::MutexLock lock(&active_mu_);
    for (auto& [id, active] : active_) live.push_back(active);
  }
  for (const std::shared_ptr<Active>& active : live) {
    {
      absl::MutexLock lock(&active->mu);
      active->shut_down = true;
    }
    Cancel(active, /*client_gone=*/false);
  }
}

bool RouterService::Ready() {
  return !draining_.load() &&
         !registry_.Live(estuary::v1::WORKER_ROLE_DECODE, absl::Now()).empty();
}

std::string RouterService::NewRequestId() { return NewUnguessableRequestId(); }

std::shared_ptr<grpc::Channel> RouterService::Channel(const std::string& address) {
  absl::MutexLock lock(&channels_mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = rpc::CreateClusterChannel(address);
  }
  return channel;
}

void RouterService::Watch() {
  while (true) {
    std::vector<std::shared_ptr<Active>> live;
    {
      absl::MutexLock lock(&active_mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(active_mu_) { return stopping_; };
      active_mu_.AwaitWithTimeout(absl::Condition(&stopping), kWatchInterval);
      if (stopping_) return;
      for (auto& [id, active] : active_) live.push_back(active);
    }
    for (const std::shared_ptr<Active>& active : live) {
      bool gone = false;
      {
        absl::MutexLock lock(&active->mu);
        gone = active->server_context != nullptr && !active->cancelled &&
               active->server_context->IsCancelled();
      }
      if (gone) {
        ESTUARY_LOG(INFO) << "request " << active->id << ": the client went away; aborting";
        Cancel(active, /*client_gone=*/true);
      }
    }
  }
}

void RouterService::Cancel(const std::shared_ptr<Active>& active, bool client_gone) {
  std::string decode, prefill;
  {
    absl::MutexLock lock(&active->mu);
    if (active->cancelled) return;
    active->cancelled = true;
    active->client_gone = client_gone;
    if (active->worker_call != nullptr) active->worker_call->TryCancel();
    decode = active->decode_address;
    prefill = active->prefill_address;
  }
  AbortOnWorkers(active->id, decode, prefill);
}

void RouterService::AbortOnWorkers(const std::string& request_id, const std::string& decode_address,
                                   const std::string& prefill_address) {
  estuary::v1::WorkerAbortRequest request;
  request.set_request_id(request_id);
  estuary::v1::WorkerAbortResponse response;
  if (!decode_address.empty()) {
    grpc::ClientContext context;
    context.set_deadline(ChronoDeadline(absl::Now() + kAbortTimeout));
    (void)estuary::v1::DecodeWorker::NewStub(Channel(decode_address))
        ->Abort(&context, request, &response);
  }
  if (!prefill_address.empty()) {
    grpc::ClientContext context;
    context.set_deadline(ChronoDeadline(absl::Now() + kAbortTimeout));
    (void)estuary::v1::PrefillWorker::NewStub(Channel(prefill_address))
        ->Abort(&context, request, &response);
  }
}

// ---- Inference ----

grpc::Status RouterService::Inference::Generate(
    grpc::ServerContext* context, const estuary::v1::GenerateRequest* request,
    grpc::ServerWriter<estuary::v1::GenerateResponse>* writer) {
  if (grpc::Status auth = rpc::CheckApiKey(context, router_.options_.api_key); !auth.ok()) {
    return auth;
  }
  return router_.Generate(context, *request, writer);
}

grpc::Status RouterService::Generate(grpc::ServerContext* context,
                                     const estuary::v1::GenerateRequest& request,
                                     grpc::ServerWriter<estuary::v1::GenerateResponse>* writer) {
  Attempt attempt;
  attempt.arrival = absl::Now();
  RouterMetrics& metrics = metrics_;
  if (draining_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "this router is shutting down (draining): send the request to another "
                        "replica");
  }
  // Admission before any work on the request (admission.h).
  absl::StatusOr<Admission::Ticket> ticket = admission_.Admit();
  if (!ticket.ok()) return rpc::ToGrpcStatusWithRetryHint(context, ticket.status());
  metrics.waiting.Add(1);
  auto leave_queue = [&] {
    if (ticket->LeaveQueue()) metrics.waiting.Add(-1);
  };
  if (!request.model().empty() && request.model() != served_name_) {
    leave_queue();
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("model '", request.model(), "' is not served here; this "
                                     "router serves '", served_name_, "'"));
  }
  absl::StatusOr<PreparedRequest> prepared = PrepareRequest(request, *tokenizer_, limits_);
  if (!prepared.ok()) {
    leave_queue();
    return ToGrpcStatus(prepared.status());
  }
  const std::string id = request.request_id().empty() ? NewRequestId() : request.request_id();

  auto active = std::make_shared<Active>(id, rpc::CallerIdentity(context));
  attempt.same_prompt_as = request.same_prompt_as();
  {
    absl::MutexLock lock(&active->mu);
    active->server_context = context;
  }
  {
    absl::MutexLock lock(&active_mu_);
    if (!active_.try_emplace(id, active).second) {
      leave_queue();
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrCat("request id '", id, "' is already in flight"));
    }
  }

  if (context != nullptr &&
      context->deadline() != std::chrono::system_clock::time_point::max()) {
    attempt.deadline = absl::FromChrono(context->deadline());
  }
  estuary::v1::WorkerRequest& worker_request = attempt.request;
  worker_request.set_request_id(id);
  for (int32_t t : prepared->prompt_ids) worker_request.add_prompt_ids(t);
  *worker_request.mutable_sampling() = prepared->sampling;
  *worker_request.mutable_exit() = prepared->exit;
  worker_request.set_deadline_unix_ms(rpc::DeadlineToUnixMs(attempt.deadline));

  Relay relay(*tokenizer_, prepared->prompt_ids.back(), prepared->stop,
              prepared->include_stop_str, limits_.num_layers);
  const int prompt_tokens = static_cast<int>(prepared->prompt_ids.size());

  // Streams the relay's output; false when the client went away.
  WriteFn write = [&](estuary::v1::GenerateResponse& response) {
    response.set_request_id(id);
    if (writer->Write(response)) return true;
    Cancel(active, /*client_gone=*/true);
    return false;
  };

  bool counted_running = false;  // estuary:num_requests_running: from first token to the end
  attempt.on_first_token = [&] {
    leave_queue();
    if (!counted_running) metrics.running.Add(1);
    counted_running = true;
  };
  absl::Status status;
  for (int n = 0; n < options_.max_attempts; ++n) {
    bool retry = false;
    status = RunAttempt(*active, attempt, relay, write, &retry);
    if (!retry || active->Cancelled()) break;
    ESTUARY_LOG(WARNING) << "request " << id << ": " << status << "; trying another worker";
  }

  leave_queue();
  if (counted_running) metrics.running.Add(-1);
  bool client_gone = false;
  bool cancelled = false;
  bool shut_down = false;
  {
    absl::MutexLock lock(&active->mu);
    active->server_context = nullptr;
    client_gone = active->client_gone;
    cancelled = active->cancelled;
    shut_down = active->shut_down;
  }
  {
    absl::MutexLock lock(&active_mu_);
    active_.erase(id);
  }
  if (shut_down && !attempt.finish.has_value()) {
    metrics.error.Increment();
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the router shut down before the request finished (its "
                        "--shutdown-timeout passed)");
  }
  if (client_gone || (cancelled && !attempt.finish.has_value())) {
    metrics.cancelled.Increment();
  } else {
    metrics.Finished(attempt.finish).Increment();
  }
  metrics.e2e.Observe(absl::ToDoubleSeconds(absl::Now() - attempt.arrival));
  if (attempt.timings.queue_seconds() > 0) metrics.queue.Observe(attempt.timings.queue_seconds());
  if (attempt.first_token_seen) {
    metrics.ttft.Observe(attempt.timings.time_to_first_token_seconds());
  }
  if (client_gone) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request");
  }
  if (cancelled && !attempt.finish.has_value()) attempt.finish = estuary::v1::FINISH_REASON_CANCELLED;
  if (!attempt.finish.has_value()) {
    ESTUARY_LOG(WARNING) << "request " << id << " failed: " << status;
    return rpc::ToGrpcStatusWithRetryHint(
        context, status.ok() ? absl::InternalError("the request ended without a finish") : status);
  }
  estuary::v1::GenerateResponse last;
  estuary::v1::Complete* complete = last.mutable_complete();
  complete->set_finish_reason(*attempt.finish);
  relay.FillUsage(prompt_tokens, complete->mutable_usage());
  *complete->mutable_timings() = attempt.timings;
  if (!write(last)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  return grpc::Status::OK;
}

std::optional<Placement> RouterService::PlaceBeside(const std::string& first_id,
                                                   const std::vector<int32_t>& prompt,
                                                   absl::Time now) {
  if (first_id.empty()) return std::nullopt;
  const std::optional<std::string> decode_id = prompt_homes_.Find(first_id, prompt, now);
  if (!decode_id.has_value()) return std::nullopt;
  absl::StatusOr<Placement> placement = registry_.ChooseDecode(*decode_id, prompt, now);
  if (!placement.ok()) return std::nullopt;
  return *std::move(placement);
}

absl::Status RouterService::RunAttempt(Active& active, Attempt& attempt, Relay& relay,
                                       const WriteFn& write, bool* retry) {
  *retry = false;
  const estuary::v1::WorkerRequest& request = attempt.request;
  const std::vector<int32_t> prompt(request.prompt_ids().begin(), request.prompt_ids().end());
  const int64_t tokens = static_cast<int64_t>(prompt.size());
  const absl::Time now = absl::Now();
  std::optional<Placement> beside = PlaceBeside(attempt.same_prompt_as, prompt, now);
  attempt.same_prompt_as.clear();  // a retry is placed afresh
  if (!beside.has_value()) {
    const bool local = tokens <= options_.local_prefill_max_tokens ||
                       !registry_.HasCompatiblePair(now);
    ESTUARY_ASSIGN_OR_RETURN(beside, registry_.Choose(prompt, local, now));
  }
  const Placement& placement = *beside;
  const bool local = !placement.prefill.has_value();  // the decode worker prefills
  prompt_homes_.Record(request.request_id(), placement.decode.info.worker_id(), prompt, now);
  const std::string decode_id = placement.decode.info.worker_id();
  const std::string decode_address = placement.decode.info.address();
  std::string prefill_id, prefill_address;
  if (placement.prefill.has_value()) {
    prefill_id = placement.prefill->info.worker_id();
    prefill_address = placement.prefill->info.address();
  }
  struct Releaser {
    WorkerRegistry& registry;
    std::string worker_id;
    int64_t tokens;
    void Release() {
      if (!worker_id.empty()) registry.Release(worker_id, tokens);
      worker_id.clear();
    }
    ~Releaser() { Release(); }
  };
  Releaser decode_release{registry_, decode_id, tokens};
  Releaser prefill_release{registry_, prefill_id, tokens};
  {
    absl::MutexLock lock(&active.mu);
    active.decode_address = decode_address;
    active.prefill_address = prefill_address;
  }
  const absl::Time dispatched = absl::Now();
  attempt.timings.set_queue_seconds(absl::ToDoubleSeconds(dispatched - attempt.arrival));
  auto cancelled_status = [] { return absl::CancelledError("the request was cancelled"); };
  auto worker_failed = [&](const std::string& worker_id, const char* what,
                           const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      registry_.MarkDead(worker_id);
      *retry = !attempt.first_token_seen;
    } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      *retry = !attempt.first_token_seen;  // that worker is full (rpc/overload.h): try another
    }
    absl::Status s = FromGrpcStatus(status);
    return absl::Status(s.code(), absl::StrCat(what, " on worker ", worker_id, ": ", s.message()));
  };

  auto decode_stub = estuary::v1::DecodeWorker::NewStub(Channel(decode_address));
  estuary::v1::DecodeRequest decode_request;
  if (!local) {
    // 1. Pages on the decode worker.
    estuary::v1::ReserveRequest reserve;
    *reserve.mutable_request() = request;
    estuary::v1::ReserveResponse reserved;
    {
      grpc::ClientContext call;
      if (attempt.deadline != absl::InfiniteFuture()) call.set_deadline(ChronoDeadline(attempt.deadline));
      if (!active.Begin(&call)) return cancelled_status();
      const grpc::Status status = decode_stub->Reserve(&call, reserve, &reserved);
      active.End();
      if (!status.ok()) return worker_failed(decode_id, "Reserve", status);
    }
    // 2. The prompt on the prefill worker, its KV pushed into those pages.
    estuary::v1::PrefillRequest prefill;
    *prefill.mutable_request() = request;
    *prefill.mutable_transfer() = reserved.transfer();
    estuary::v1::PrefillResponse prefilled;
    {
      grpc::ClientContext call;
      if (attempt.deadline != absl::InfiniteFuture()) call.set_deadline(ChronoDeadline(attempt.deadline));
      if (!active.Begin(&call)) {
        AbortOnWorkers(request.request_id(), decode_address, "");
        return cancelled_status();
      }
      const grpc::Status status = estuary::v1::PrefillWorker::NewStub(Channel(prefill_address))
                                      ->Prefill(&call, prefill, &prefilled);
      active.End();
      if (!status.ok()) {
        // The prefill worker sends an abort completion itself when it can; this covers the
        // case where it cannot (unreachable), so the pages do not wait for the lease.
        AbortOnWorkers(request.request_id(), decode_address, "");
        return worker_failed(prefill_id, "Prefill", status);
      }
    }
    prefill_release.Release();
    attempt.timings.set_prefill_seconds(prefilled.prefill_seconds());
    attempt.timings.set_transfer_seconds(prefilled.transfer_seconds());
    decode_request.set_request_id(request.request_id());
  } else {
    *decode_request.mutable_local_prefill() = request;
  }

  // 3. The token stream.
  grpc::ClientContext call;
  if (attempt.deadline != absl::InfiniteFuture()) call.set_deadline(ChronoDeadline(attempt.deadline));
  if (!active.Begin(&call)) {
    AbortOnWorkers(request.request_id(), decode_address, "");
    return cancelled_status();
  }
  std::unique_ptr<grpc::ClientReader<estuary::v1::DecodeResponse>> reader =
      decode_stub->Decode(&call, decode_request);
  estuary::v1::DecodeResponse response;
  std::optional<absl::Status> end;  // the worker's end status, from its final message
  FinishReason reason = estuary::v1::FINISH_REASON_UNSPECIFIED;
  bool stopped = false;
  bool client_gone = false;
  while (reader->Read(&response)) {
    const bool final = response.finished();
    if (final) {
      end = rpc::StatusFromCode(response.status_code(), response.status_message());
      reason = response.finish_reason();
    }
    estuary::v1::GenerateResponse out;
    estuary::v1::Chunk* chunk = out.mutable_chunk();
    // Text held back at the end is released for a normal end only.
    stopped = relay.Add(response, final && end->ok(), chunk);
    if (chunk->token_ids_size() > 0 && attempt.first_token_seen) {
      const absl::Time now = absl::Now();
      metrics_.ObserveChunk(absl::ToDoubleSeconds(now - attempt.last_token_at),
                            chunk->token_ids_size());
      attempt.last_token_at = now;
    }
    if (chunk->token_ids_size() > 0 && !attempt.first_token_seen) {
      attempt.first_token_seen = true;
      attempt.first_token_at = absl::Now();
      attempt.last_token_at = attempt.first_token_at;
      attempt.timings.set_time_to_first_token_seconds(
          absl::ToDoubleSeconds(attempt.first_token_at - attempt.arrival));
      if (local) {
        attempt.timings.set_prefill_seconds(
            absl::ToDoubleSeconds(attempt.first_token_at - dispatched));
      }
      if (attempt.on_first_token) attempt.on_first_token();
      metrics_.prompt_tokens.Increment(static_cast<double>(request.prompt_ids_size()));
    }
    metrics_.generation_tokens.Increment(chunk->token_ids_size());
    if (chunk->token_ids_size() > 0 || !chunk->text().empty()) {
      if (!write(out)) client_gone = true;
    }
    if (stopped || client_gone || final) break;
  }
  if (stopped || client_gone) {
    // The decode worker goes on otherwise: cancel the stream and abort the request there.
    call.TryCancel();
    AbortOnWorkers(request.request_id(), decode_address, "");
  }
  const grpc::Status stream_status = reader->Finish();
  active.End();
  if (attempt.first_token_seen) {
    attempt.timings.set_decode_seconds(absl::ToDoubleSeconds(absl::Now() - attempt.first_token_at));
  }
  if (stopped) {
    attempt.finish = estuary::v1::FINISH_REASON_STOP_STRING;
    return absl::OkStatus();
  }
  if (client_gone || active.Cancelled()) return cancelled_status();
  if (end.has_value()) {
    if (!end->ok()) return *end;
    attempt.finish = reason;
    return absl::OkStatus();
  }
  if (!stream_status.ok()) return worker_failed(decode_id, "Decode", stream_status);
  return absl::InternalError(
      absl::StrCat("the decode stream on worker ", decode_id, " ended without a final message"));
}

grpc::Status RouterService::Inference::Abort(grpc::ServerContext* context,
                                             const estuary::v1::AbortRequest* request,
                                             estuary::v1::AbortResponse* response) {
  if (grpc::Status auth = rpc::CheckApiKey(context, router_.options_.api_key); !auth.ok()) {
    return auth;
  }
  std::shared_ptr<Active> active;
  {
    absl::MutexLock lock(&router_.active_mu_);
    auto it = router_.active_.find(request->request_id());
    if (it != router_.active_.end()) active = it->second;
  }
  // Only the caller that made the request may abort it; to anyone else the id does not exist.
  if (active != nullptr && !rpc::SameCaller(active->owner, rpc::CallerIdentity(context))) {
    active = nullptr;
  }
  response->set_found(active != nullptr);
  if (active != nullptr) {
    ESTUARY_LOG(INFO) << "request " << active->id << ": aborted by an Abort call";
    router_.Cancel(active, /*client_gone=*/false);
  }
  return grpc::Status::OK;
}

grpc::Status RouterService::Inference::ListModels(grpc::ServerContext* context,
                                                  const estuary::v1::ListModelsRequest* request,
                                                  estuary::v1::ListModelsResponse* response) {
  if (grpc::Status auth = rpc::CheckApiKey(context, router_.options_.api_key); !auth.ok()) {
    return auth;
  }
  response->add_models(router_.served_name_);
  return grpc::Status::OK;
}

grpc::Status RouterService::Inference::GetModelInfo(grpc::ServerContext* context,
                                                    const estuary::v1::GetModelInfoRequest* request,
                                                    estuary::v1::ModelInfo* response) {
  if (grpc::Status auth = rpc::CheckApiKey(context, router_.options_.api_key); !auth.ok()) {
    return auth;
  }
  if (!request->model().empty() && request->model() != router_.served_name_) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("model '", request->model(), "' is not served here; this "
                                     "router serves '", router_.served_name_, "'"));
  }
  response->set_name(router_.served_name_);
  response->set_context_length(router_.limits_.context_length);
  response->set_vocab_size(router_.limits_.vocab_size);
  response->set_num_layers(router_.limits_.num_layers);
  const absl::Time now = absl::Now();
  auto max_tp = [&](estuary::v1::WorkerRole role) {
    int tp = 0;
    for (const WorkerView& w : router_.registry_.Live(role, now)) {
      tp = std::max(tp, std::max(1, w.info.tp_size()));
    }
    return tp;
  };
  response->set_prefill_tp_size(max_tp(estuary::v1::WORKER_ROLE_PREFILL));
  response->set_decode_tp_size(max_tp(estuary::v1::WORKER_ROLE_DECODE));
  return grpc::Status::OK;
}

void RouterService::UpdateClusterLoad(absl::Time now) {
  std::vector<estuary::v1::WorkerLoad> loads;
  for (const WorkerView& w : registry_.Live(estuary::v1::WORKER_ROLE_DECODE, now)) {
    loads.push_back(w.load);
  }
  metrics_.SetDecodeLoads(loads);
}

// ---- WorkerRegistry ----

grpc::Status RouterService::Registry::Register(grpc::ServerContext* context,
                                               const estuary::v1::RegisterRequest* request,
                                               estuary::v1::RegisterResponse* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  const absl::Time now = absl::Now();
  const absl::Status status =
      router_.registry_.Register(request->info(), request->load(), now, PeerIdentityOf(context));
  router_.UpdateClusterLoad(now);
  if (!status.ok()) {
    ESTUARY_LOG(WARNING) << "refused worker '" << request->info().worker_id() << "' at "
                         << request->info().address() << ": " << status;
    return ToGrpcStatus(status);
  }
  response->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(router_.options_.heartbeat_interval));
  return grpc::Status::OK;
}

grpc::Status RouterService::Registry::Heartbeat(grpc::ServerContext* context,
                                                const estuary::v1::HeartbeatRequest* request,
                                                estuary::v1::HeartbeatResponse* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  const absl::Time now = absl::Now();
  response->set_known(router_.registry_.Heartbeat(request->worker_id(), request->load(), now,
                                                  PeerIdentityOf(context)));
  router_.UpdateClusterLoad(now);
  return grpc::Status::OK;
}

grpc::Status RouterService::Registry::Unregister(grpc::ServerContext* context,
                                                 const estuary::v1::UnregisterRequest* request,
                                                 estuary::v1::UnregisterResponse* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  return ToGrpcStatus(
      router_.registry_.Unregister(request->worker_id(), PeerIdentityOf(context)));
}

}  // namespace estuary::router
