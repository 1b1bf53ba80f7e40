#include "decode/decode_service.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/metrics.h"
#include "core/common/status_macros.h"
#include "kvtransfer/descriptor_seal.h"
#include "kvtransfer/fingerprint.h"
#include "rpc/cluster_security.h"
#include "rpc/overload.h"
#include "rpc/status_convert.h"
#include "rpc/worker_request.h"
#include "worker/engine_metrics.h"
#include "worker/worker_process.h"

namespace estuary {
namespace {

using rpc::ToGrpcStatus;

// How long one wait of a Decode handler lasts before it looks at the client again.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(100);
constexpr int kDefaultMaxTokens = 256;

// The decode worker's Prometheus metrics (design §9).
struct DecodeMetrics {
  static DecodeMetrics& Get() {
    static DecodeMetrics* const metrics = new DecodeMetrics();
    return *metrics;
  }
  static std::vector<double> LayerBounds() {
    std::vector<double> bounds;
    for (int l = 1; l <= 32; ++l) bounds.push_back(l);
    for (int l : {40, 48, 56, 64, 80, 96, 112, 128}) bounds.push_back(l);
    return bounds;
  }
  // KV usage and prefix cache: worker/engine_metrics.h, shared with the prefill worker.
  void SetPool(const KvPool& pool, int reserved_requests, int fenced_requests) {
    worker::EngineMetrics::Get().UpdatePool(pool);
    reserved.Set(reserved_requests);
    fenced.Set(fenced_requests);
  }
  common::MetricsRegistry& r = common::MetricsRegistry::Global();
  common::Gauge& reserved = r.GetGauge("estuary:num_requests_reserved",
                                       "Reservations waiting for their KV from a prefill worker.");
  common::Gauge& fenced = r.GetGauge(
      "estuary:num_reservations_fenced",
      "Ended reservations whose pages wait for their writer's completion or lease + grace.");
  common::Histogram& layers = r.GetHistogram(
      "estuary:backbone_layers_per_token", "Backbone layers each generated token ran.",
      LayerBounds());
  common::Gauge& exit_rate = r.GetGauge(
      "estuary:exit_rate", "Share of generated tokens that left the backbone early.");
  // The lossless mode (issue 16), mirrored from the engine's totals.
  void SetLossless(const LosslessCounts& totals) {
    draft_tokens.AdvanceTo(static_cast<double>(totals.draft_tokens));
    accepted_tokens.AdvanceTo(static_cast<double>(totals.accepted_tokens));
    verifications.AdvanceTo(static_cast<double>(totals.verifications));
    plain_rounds.AdvanceTo(static_cast<double>(totals.plain_rounds));
  }
  common::Counter& draft_tokens = r.GetCounter(
      "estuary:lossless_draft_tokens_total", "Drafts the lossless mode's verifications checked.");
  common::Counter& accepted_tokens = r.GetCounter(
      "estuary:lossless_accepted_tokens_total", "Of those, drafts the full model agreed with.");
  common::Counter& verifications =
      r.GetCounter("estuary:lossless_verifications_total", "Lossless verification passes.");
  common::Counter& plain_rounds = r.GetCounter(
      "estuary:lossless_plain_rounds_total",
      "Lossless rounds without drafts (one full-depth token each; --drafting).");
};

DecodeRequest FromProto(const estuary::v1::WorkerRequest& proto, bool default_lossless) {
  DecodeRequest request;
  request.request_id = proto.request_id();
  request.prompt_ids.assign(proto.prompt_ids().begin(), proto.prompt_ids().end());
  request.max_tokens =
      proto.sampling().max_tokens() > 0 ? proto.sampling().max_tokens() : kDefaultMaxTokens;
  request.sampling = rpc::SamplingFromProto(proto.sampling());
  request.ignore_eos = proto.sampling().ignore_eos();
  request.exit_threshold = rpc::ExitThresholdFromProto(proto.exit());
  request.exit_disabled = proto.exit().disable();
  request.resumed_output = proto.resumed_output_tokens();
  switch (proto.exit().mode()) {
    case estuary::v1::EXIT_MODE_LOSSLESS:
      request.lossless = true;
      break;
    case estuary::v1::EXIT_MODE_LOSSY:
      request.lossless = false;
      break;
    default:
      request.lossless = default_lossless;
  }
  return request;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeService>> DecodeService::Create(
    ShardedModel& model, kvtransfer::Transport& transport, const DecodeServiceOptions& options) {
  const LlamaConfig& c = model.config();
  std::unique_ptr<DecodeService> service(new DecodeService(
      options, kvtransfer::MakeFingerprint(options.model_id, c.n_layers, c.n_kv_heads,
                                           c.head_dim, options.engine.block_size)));
  DecodeService* self = service.get();
  worker::EngineMetrics::Get();  // registered up front: /metrics shows them before the first
  DecodeMetrics::Get();          // request
  ESTUARY_ASSIGN_OR_RETURN(
      service->engine_,
      DecodeEngine::Create(model, options.engine,
                           [self](const TokenEvent& event) { self->streams_.Push(event); }));
  // Reservations and fenced pages only wait (for their writer, lease or grace): the loop's idle
  // polls (every 10 ms) and the receiver's Notify() step the engine for them, without spinning.
  service->loop_ = std::make_unique<StepLoop>([self] { return !self->engine_->Idle(); },
                                              [self] { return self->StepOnce(); });
  ESTUARY_ASSIGN_OR_RETURN(
      service->receiver_,
      kvtransfer::KvReceiver::Create(transport, service->engine_->mutable_pool(),
                                     service->fingerprint_,
                                     kvtransfer::DescriptorSeal(options.descriptor_key)));
  kvtransfer::KvReceiverCallbacks callbacks;
  callbacks.issued = [self](const std::string& request_id, uint64_t epoch)
      -> absl::StatusOr<kvtransfer::IssuedReservation> {
    ESTUARY_ASSIGN_OR_RETURN(DecodeEngine::Reservation r,
                             self->engine_->FindReservation(request_id, epoch));
    return kvtransfer::IssuedReservation{std::move(r.pages), r.lease_deadline};
  };
  callbacks.on_attach = [self](const estuary::v1::KvAttach& attach, uint64_t writer) {
    return self->engine_->AttachWriter(attach.request_id(),
                                       {attach.reservation_epoch(), writer, false});
  };
  callbacks.on_completion = [self](const estuary::v1::KvCompletion& completion, uint64_t writer) {
    self->OnCompletion(completion, writer);
  };
  ESTUARY_RETURN_IF_ERROR(service->receiver_->Start(std::move(callbacks)));
  return service;
}

DecodeService::DecodeService(const DecodeServiceOptions& options,
                             estuary::v1::KvFormatFingerprint fingerprint)
    : options_(options),
      fingerprint_(std::move(fingerprint)),
      streams_(absl::Minutes(1), static_cast<size_t>(std::max(1, options.max_requests_in_flight))) {}

DecodeService::~DecodeService() {
  if (receiver_ != nullptr) receiver_->Stop();
  receiver_.reset();
  loop_.reset();
  engine_.reset();
}

absl::Status DecodeService::StepOnce() {
  absl::Status stepped;
  if (!engine_->Idle() || engine_->reserved() > 0 || engine_->fenced() > 0) {
    if (options_.debug_step_delay > absl::ZeroDuration()) absl::SleepFor(options_.debug_step_delay);
    stepped = engine_->Step();
    if (!stepped.ok()) {
      ESTUARY_LOG(WARNING) << "decode step failed (its requests ended): " << stepped;
    }
  }
  // The exit statistics as of this step; the counts GetLoad reads live.
  estuary::v1::WorkerLoad load;
  load.set_exit_rate(engine_->exit_stats().exit_rate());
  load.set_mean_backbone_layers(engine_->exit_stats().mean_backbone_layers());
  DecodeMetrics& metrics = DecodeMetrics::Get();
  worker::EngineMetrics::Get().UpdateScheduler(engine_->running(), engine_->waiting(),
                                               engine_->preemptions());
  metrics.exit_rate.Set(load.exit_rate());
  metrics.SetLossless(engine_->lossless_totals());
  metrics.SetPool(engine_->pool(), engine_->reserved(), engine_->fenced());
  const std::vector<int64_t>& layers = engine_->exit_stats().histogram();
  reported_layers_.resize(layers.size(), 0);
  for (size_t l = 0; l < layers.size(); ++l) {
    metrics.layers.Observe(static_cast<double>(l), layers[l] - reported_layers_[l]);
    reported_layers_[l] = layers[l];
  }
  absl::MutexLock lock(&load_mu_);
  load_ = load;
  return stepped;
}

void DecodeService::OnCompletion(const estuary::v1::KvCompletion& completion, uint64_t writer_id) {
  const std::string& id = completion.request_id();
  const DecodeEngine::Writer writer{completion.reservation_epoch(), writer_id,
                                    completion.late_put()};
  absl::Status status;
  if (completion.status_code() != 0) {
    const absl::Status reason =
        rpc::StatusFromCode(completion.status_code(), completion.status_message());
    ESTUARY_LOG(WARNING) << "prefill aborted request " << id << ": " << reason;
    status = engine_->EndReservation(id, writer, reason);
  } else {
    const std::string& provenance = completion.provenance();
    std::optional<TokenLogprobs> logprobs;
    if (completion.has_first_token_logprobs()) {
      logprobs = rpc::LogprobsFromProto(completion.first_token_logprobs());
    }
    status = engine_->CompleteReservation(
        id, writer, completion.first_token(),
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(provenance.data()),
                            provenance.size()),
        std::move(logprobs));
  }
  // Refused: the engine ended the request when the writer was the attached one; a completion
  // that names nothing live (late, stale, never attached) is ignored.
  if (!status.ok()) ESTUARY_LOG(WARNING) << "completion for " << id << " refused: " << status;
  loop_->Notify();
}

grpc::Status DecodeService::Reserve(grpc::ServerContext* context,
                                    const estuary::v1::ReserveRequest* request,
                                    estuary::v1::ReserveResponse* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  absl::Duration lease =
      request->lease_ms() > 0 ? absl::Milliseconds(request->lease_ms()) : options_.default_lease;
  lease = std::min(lease, options_.max_lease);
  if (control_.draining) return worker::DrainingStatus();
  DecodeRequest decode = FromProto(request->request(), options_.default_lossless);
  const std::string id = decode.request_id;
  if (absl::Status opened = streams_.Open(id); !opened.ok()) {
    return rpc::ToGrpcStatusWithRetryHint(context, opened);
  }
  absl::StatusOr<DecodeEngine::Reservation> reservation =
      engine_->Reserve(std::move(decode), lease);
  if (!reservation.ok()) {
    streams_.Close(id);
    return rpc::ToGrpcStatusWithRetryHint(context, reservation.status());
  }
  *response->mutable_transfer() =
      receiver_->Describe(id, reservation->pages, reservation->lease_deadline, reservation->epoch);
  loop_->Notify();
  return grpc::Status::OK;
}

grpc::Status DecodeService::Decode(grpc::ServerContext* context,
                                   const estuary::v1::DecodeRequest* request,
                                   grpc::ServerWriter<estuary::v1::DecodeResponse>* writer) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  const std::string id =
      request->has_local_prefill() ? request->local_prefill().request_id() : request->request_id();
  if (request->has_local_prefill()) {
    if (control_.draining) return worker::DrainingStatus();
    if (absl::Status opened = streams_.Open(id); !opened.ok()) {
      return rpc::ToGrpcStatusWithRetryHint(context, opened);
    }
    if (absl::Status submitted = engine_->Submit(FromProto(request->local_prefill(), options_.default_lossless));
        !submitted.ok()) {
      streams_.Close(id);
      return rpc::ToGrpcStatusWithRetryHint(context, submitted);
    }
    loop_->Notify();
  } else if (!streams_.IsOpen(id)) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no reserved or running request '", id, "'"));
  }
  while (true) {
    if (context->IsCancelled() || control_.ending) {
      engine_->Abort(id);
      loop_->Notify();
      streams_.Close(id);
      if (control_.ending) return worker::ShutDownBeforeFinishStatus();
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the stream");
    }
    if (control_.draining && request->resumable()) {
      // The caller resumes the stream elsewhere from the tokens it has (the router's
      // migration): hand it back now rather than finishing it within --shutdown-timeout.
      engine_->Abort(id);
      loop_->Notify();
      streams_.Close(id);
      estuary::v1::DecodeResponse handed_back;
      handed_back.set_finished(true);
      handed_back.set_handed_back(true);
      handed_back.set_status_code(static_cast<int>(absl::StatusCode::kUnavailable));
      handed_back.set_status_message(
          "this decode worker drains: the stream is handed back to be resumed elsewhere");
      writer->Write(handed_back);
      return grpc::Status::OK;
    }
    absl::StatusOr<std::vector<TokenEvent>> events = streams_.Next(id, absl::Now() + kStreamPoll);
    if (!events.ok()) return ToGrpcStatus(events.status());
    if (events->empty()) continue;
    estuary::v1::DecodeResponse response;
    bool finished = false;
    for (const TokenEvent& e : *events) {
      if (e.token_id >= 0) {
        response.add_token_ids(e.token_id);
        response.add_backbone_layers(e.backbone_layers);
        if (e.logprobs) rpc::LogprobsToProto(*e.logprobs, response.add_logprobs());
      }
      if (e.finished) {
        finished = true;
        response.set_finished(true);
        response.set_finish_reason(rpc::FinishReasonToProto(e.finish_reason));
        response.set_status_code(static_cast<int>(e.status.code()));
        response.set_status_message(std::string(e.status.message()));
        response.set_draft_tokens(e.draft_tokens);
        response.set_accepted_tokens(e.accepted_tokens);
      }
    }
    if (!writer->Write(response)) {  // the client went away
      engine_->Abort(id);
      loop_->Notify();
      streams_.Close(id);
      return grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke");
    }
    if (finished) {
      streams_.Close(id);
      return grpc::Status::OK;
    }
  }
}

grpc::Status DecodeService::Abort(grpc::ServerContext* context,
                                  const estuary::v1::WorkerAbortRequest* request,
                                  estuary::v1::WorkerAbortResponse* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  response->set_found(engine_->Abort(request->request_id()));
  // Nothing will claim the request's token stream now (a reservation the router gave up on
  // would otherwise count as open, and hold up a drain, for a minute).
  streams_.Close(request->request_id());
  loop_->Notify();
  return grpc::Status::OK;
}

grpc::Status DecodeService::GetLoad(grpc::ServerContext* context,
                                    const estuary::v1::GetLoadRequest* request,
                                    estuary::v1::WorkerLoad* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  {
    absl::MutexLock lock(&load_mu_);
    *response = load_;  // the exit statistics of the latest step
  }
  // Every count is read now, not as of the latest step, so a heartbeat sent while a long step
  // runs reports what is queued meanwhile (the engine's counts and the pool are thread-safe).
  response->set_running_sequences(engine_->live_running());
  response->set_waiting_sequences(engine_->live_waiting());
  worker::SetPoolLoad(engine_->pool(), response);
  response->set_reserved_requests(engine_->reserved());
  response->set_not_ready(!control_.ready);
  DecodeMetrics::Get().SetPool(engine_->pool(), response->reserved_requests(), engine_->fenced());
  return grpc::Status::OK;
}

grpc::Status DecodeService::GetInfo(grpc::ServerContext* context,
                                    const estuary::v1::GetInfoRequest* request,
                                    estuary::v1::WorkerInfo* response) {
  if (grpc::Status auth = rpc::CheckClusterToken(context); !auth.ok()) return auth;
  *response = control_.info();
  return grpc::Status::OK;
}

bool DecodeService::Drained() const {
  return streams_.open_streams() == 0 && engine_->reserved() == 0;
}

}  // namespace estuary
