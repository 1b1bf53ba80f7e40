#include "prefill/prefill_service.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/metrics.h"
#include "core/common/status_macros.h"
#include "kvtransfer/fingerprint.h"
#include "rpc/cluster_security.h"
#include "rpc/overload.h"
#include "rpc/peer_failure.h"
#include "rpc/status_convert.h"
#include "rpc/worker_request.h"
#include "worker/engine_metrics.h"
#include "worker/worker_process.h"

namespace estuary {
namespace {

// The prefill worker's Prometheus metrics (design §9).
struct PrefillMetrics {
  static PrefillMetrics& Get() {
    static PrefillMetrics* const metrics = new PrefillMetrics();
    return *metrics;
  }
  common::MetricsRegistry& r = common::MetricsRegistry::Global();
  common::Counter& transfer_bytes = r.GetCounter(
      "estuary:kv_transfer_bytes_total", "KV bytes put to decode workers.");
  common::Histogram& transfer_seconds = r.GetHistogram(
      "estuary:kv_transfer_seconds",
      "KV transfer time after the last layer was computed, to the completion sent.",
      {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0});
  common::Counter& transfer_failures = r.GetCounter(
      "estuary:kv_transfer_failures_total", "KV transfers that failed (puts or completion).");
  common::Counter& prompt_tokens = r.GetCounter(
      "estuary:prompt_tokens_total", "Prompt tokens prefilled.");
};
// How often a waiting Prefill handler looks at its client.
constexpr absl::Duration kClientPoll = absl::Milliseconds(50);

// A failed KV transfer as the Prefill call's answer. UNAVAILABLE there is the decode worker
// (the push's peer) gone or unreachable, not this worker: said so (rpc/peer_failure.h), so that
// the router drops the decode worker and keeps this one.
grpc::Status TransferFailure(grpc::ServerContext* context, const absl::Status& status) {
  return absl::IsUnavailable(status) ? rpc::PeerFailed(context, status)
                                     : rpc::ToGrpcStatus(status);
}
}  // namespace

struct PrefillService::Pending {
  std::unique_ptr<kvtransfer::KvPusher> pusher;
  absl::Mutex mu;
  absl::Status push_error ABSL_GUARDED_BY(mu);  // the first failed PushLayer
  std::optional<PrefillDone> done ABSL_GUARDED_BY(mu);
  absl::Time last_layer ABSL_GUARDED_BY(mu);
  bool HasDone() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return done.has_value(); }
};

absl::StatusOr<std::unique_ptr<PrefillService>> PrefillService::Create(
    ShardedModel& model, kvtransfer::Transport& transport, const PrefillServiceOptions& options) {
  const LlamaConfig& c = model.config();
  std::unique_ptr<PrefillService> service(new PrefillService(
      transport, options,
      kvtransfer::MakeFingerprint(options.model_id, c.n_layers, c.n_kv_heads, c.head_dim,
                                  options.engine.block_size)));
  PrefillService* self = service.get();
  worker::EngineMetrics::Get();  // registered up front: /metrics shows them before the first
  PrefillMetrics::Get();         // request
  PrefillSink sink;
  sink.on_layer_ready = [self](const LayerReady& event) { self->OnLayerReady(event); };
  sink.on_done = [self](PrefillDone& done) { self->OnDone(done); };
  ESTUARY_ASSIGN_OR_RETURN(service->engine_, PrefillEngine::Create(model, options.engine, sink));
  service->loop_ = std::make_unique<StepLoop>([self] { return !self->engine_->Idle(); },
                                              [self] { return self->StepOnce(); });
  return service;
}

PrefillService::PrefillService(kvtransfer::Transport& transport,
                               const PrefillServiceOptions& options,
                               estuary::v1::KvFormatFingerprint fingerprint)
    : transport_(transport),
      options_(options),
      fingerprint_(std::move(fingerprint)),
      seal_(options.descriptor_key),
      endpoints_(transport),
      attach_replies_(transport) {}

PrefillService::~PrefillService() { loop_.reset(); }

absl::Status PrefillService::StepOnce() {
  absl::Status stepped;
  if (!engine_->Idle()) {
    if (options_.debug_step_delay > absl::ZeroDuration()) absl::SleepFor(options_.debug_step_delay);
    stepped = engine_->Step();
    if (!stepped.ok()) {
      ESTUARY_LOG(WARNING) << "prefill step failed (its requests ended): " << stepped;
    }
  }
  worker::EngineMetrics::Get().UpdateScheduler(engine_->running(), engine_->waiting(),
                                               /*preemptions=*/0);  // prefill never preempts
  worker::EngineMetrics::Get().UpdatePool(engine_->pool());
  return stepped;
}

std::shared_ptr<PrefillService::Pending> PrefillService::Find(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(request_id);
  return it == pending_.end() ? nullptr : it->second;
}

void PrefillService::OnLayerReady(const LayerReady& event) {
  std::shared_ptr<Pending> pending = Find(event.request_id);
  if (pending == nullptr) return;
  {
    absl::MutexLock lock(&pending->mu);
    if (!pending->push_error.ok()) return;  // this request is failing already
  }
  const absl::Status pushed =
      pending->pusher->PushLayer(event.rank, event.layer, event.first_pos, event.end_pos,
                                 event.pages, event.first_page);
  absl::MutexLock lock(&pending->mu);
  if (!pushed.ok() && pending->push_error.ok()) pending->push_error = pushed;
  pending->last_layer = absl::Now();
}

void PrefillService::OnDone(PrefillDone& done) {
  std::shared_ptr<Pending> pending = Find(done.request_id);
  if (pending == nullptr) return;  // the caller gave up: the pages go back when we return
  absl::MutexLock lock(&pending->mu);
  pending->done.emplace(std::move(done));
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const estuary::v1::PrefillRequest* request,
                                     estuary::v1::PrefillResponse* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  if (control_.draining) return worker::DrainingStatus();
  const absl::Time start = absl::Now();
  const estuary::v1::WorkerRequest& in = request->request();
  const absl::Time deadline = std::min(rpc::DeadlineFromUnixMs(in.deadline_unix_ms()),
                                       start + options_.request_timeout);
  if (request->transfer().request_id() != in.request_id()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("the transfer descriptor is for request '",
                                     request->transfer().request_id().substr(0, 256),
                                     "', not for '", in.request_id().substr(0, 256), "'"));
  }
  auto pending = std::make_shared<Pending>();
  absl::StatusOr<std::unique_ptr<kvtransfer::KvPusher>> pusher = kvtransfer::KvPusher::Create(
      transport_, endpoints_, attach_replies_, engine_->pool(), request->transfer(), seal_,
      fingerprint_, in.prompt_ids_size(), deadline);
  if (!pusher.ok()) {
    PrefillMetrics::Get().transfer_failures.Increment();
    return TransferFailure(context, pusher.status());
  }
  pending->pusher = std::move(*pusher);

  PrefillRequest prefill;
  prefill.request_id = in.request_id();
  prefill.prompt_ids.assign(in.prompt_ids().begin(), in.prompt_ids().end());
  prefill.sampling = rpc::SamplingFromProto(in.sampling());
  prefill.deadline = deadline;
  prefill.exit_threshold = rpc::ExitThresholdFromProto(in.exit());
  prefill.resumed_output = in.resumed_output_tokens();
  {
    absl::MutexLock lock(&mu_);
    if (pending_.size() >= static_cast<size_t>(options_.max_requests_in_flight)) {
      const std::string busy = absl::StrCat(
          "this worker has ", pending_.size(), " prompts in flight (--max-num-seqs + "
          "--max-waiting-requests); try another worker or again later");
      (void)pending->pusher->Abort(absl::ResourceExhaustedError(busy));
      return rpc::Overloaded(context, busy);
    }
    if (!pending_.try_emplace(prefill.request_id, pending).second) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("request '", prefill.request_id, "' is already live"));
    }
    pending_tokens_ += in.prompt_ids_size();
  }
  auto forget = [&] {
    absl::MutexLock lock(&mu_);
    pending_.erase(in.request_id());
    pending_tokens_ -= in.prompt_ids_size();
  };
  if (absl::Status submitted = engine_->Submit(std::move(prefill)); !submitted.ok()) {
    forget();
    (void)pending->pusher->Abort(submitted);
    return rpc::ToGrpcStatusWithRetryHint(context, submitted);
  }
  loop_->Notify();

  // Wait for the engine's PrefillDone, aborting the prompt if the client goes away or the
  // reservation's lease ends first (nothing could be written into it any more).
  absl::Status abort_reason;  // set when this call aborted the prompt
  const absl::Time write_deadline = pending->pusher->write_deadline();
  pending->mu.Lock();
  while (!pending->HasDone()) {
    pending->mu.AwaitWithTimeout(
        absl::Condition(pending.get(), &Pending::HasDone),
        abort_reason.ok()
            ? std::clamp(write_deadline - absl::Now(), absl::Milliseconds(1), kClientPoll)
            : kClientPoll);
    if (pending->HasDone() || !abort_reason.ok()) continue;
    if (absl::Now() >= write_deadline) {
      abort_reason = absl::DeadlineExceededError(absl::StrCat(
          "the decode worker's reservation for request '", in.request_id(),
          "' ended (its lease) before the prompt's KV was pushed"));
    } else if (control_.ending) {
      abort_reason = absl::UnavailableError("the prefill worker is shutting down");
    } else if (context->IsCancelled()) {
      abort_reason = absl::CancelledError("the prefill call was cancelled");
    }
    if (abort_reason.ok()) continue;
    pending->mu.Unlock();  // the rank threads' LayerReady handlers take it
    engine_->Abort(in.request_id());
    loop_->Notify();
    // Tell the decode worker now, not when the engine's step ends: it holds the pages until this
    // writer's word (PushLayer calls still posting finish first; later ones post nothing).
    (void)pending->pusher->Abort(abort_reason);
    pending->mu.Lock();
  }
  PrefillDone& done = *pending->done;
  absl::Status status = !abort_reason.ok() ? abort_reason
                        : done.status.ok() ? pending->push_error
                                           : done.status;
  bool transfer_failed = abort_reason.ok() && done.status.ok() && !status.ok();
  const absl::Time computed = std::max(pending->last_layer, start);
  if (status.ok()) {
    estuary::v1::TokenLogprobs logprobs;
    if (done.first_token_logprobs) rpc::LogprobsToProto(*done.first_token_logprobs, &logprobs);
    status = pending->pusher->Complete(done.first_token, done.provenance, done.num_tokens,
                                       done.first_token_logprobs ? &logprobs : nullptr);
    transfer_failed = !status.ok();
  } else {
    (void)pending->pusher->Abort(status);
  }
  const absl::Time sent = absl::Now();
  PrefillMetrics& metrics = PrefillMetrics::Get();
  metrics.transfer_bytes.Increment(static_cast<double>(pending->pusher->bytes()));
  if (done.status.ok()) metrics.prompt_tokens.Increment(done.num_tokens);
  if (transfer_failed) metrics.transfer_failures.Increment();
  if (status.ok()) metrics.transfer_seconds.Observe(absl::ToDoubleSeconds(sent - computed));
  response->set_first_token(done.first_token);
  response->set_num_tokens(done.num_tokens);
  response->set_prefill_seconds(absl::ToDoubleSeconds(computed - start));
  response->set_transfer_seconds(absl::ToDoubleSeconds(sent - computed));
  for (int layers : done.chunk_backbone_layers) response->add_chunk_backbone_layers(layers);
  pending->done.reset();  // the pages go back to the pool
  pending->mu.Unlock();
  forget();
  loop_->Notify();
  if (!abort_reason.ok() && control_.ending) return worker::ShutDownBeforeFinishStatus();
  if (transfer_failed) return TransferFailure(context, status);
  return rpc::ToGrpcStatus(status);
}

grpc::Status PrefillService::Abort(grpc::ServerContext* context,
                                   const estuary::v1::WorkerAbortRequest* request,
                                   estuary::v1::WorkerAbortResponse* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  response->set_found(engine_->Abort(request->request_id()));
  loop_->Notify();
  return grpc::Status::OK;
}

grpc::Status PrefillService::GetLoad(grpc::ServerContext* context,
                                     const estuary::v1::GetLoadRequest* request,
                                     estuary::v1::WorkerLoad* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  {
    // Read now, not as of the engine's latest step: a heartbeat sent while a long step runs
    // reports the prompts queued meanwhile.
    absl::MutexLock lock(&mu_);
    response->set_running_sequences(static_cast<int>(pending_.size()));
    response->set_queued_prefill_tokens(pending_tokens_);
  }
  worker::SetPoolLoad(engine_->pool(), response);  // thread-safe, current
  response->set_not_ready(!control_.ready);
  return grpc::Status::OK;
}

grpc::Status PrefillService::GetInfo(grpc::ServerContext* context,
                                     const estuary::v1::GetInfoRequest* request,
                                     estuary::v1::WorkerInfo* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  *response = control_.info();
  return grpc::Status::OK;
}

bool PrefillService::Drained() {
  absl::MutexLock lock(&mu_);
  return pending_.empty();
}

}  // namespace estuary
