#include "router/router_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/common/logging.h"
#include "core/common/metrics.h"
#include "core/common/status_macros.h"
#include "core/loader/model_metadata.h"
#include "router/request_ids.h"
#include "router/router_metrics.h"
#include "rpc/api_key.h"
#include "rpc/caller_identity.h"
#include "rpc/cluster_security.h"
#include "rpc/status_convert.h"

namespace estuary::router {
namespace {

using rpc::ToGrpcStatus;

// The watchdog's beat: how late a dropped worker's calls or a token timeout may be noticed.
constexpr absl::Duration kWatchInterval = absl::Milliseconds(20);

// A registering worker's certificate identity under mutual TLS ("" otherwise): the registry
// keeps a live worker's id for that identity (worker_registry.h).
std::string PeerIdentityOf(const grpc::ServerContext* context) {
  return context == nullptr ? std::string() : rpc::PeerIdentity(*context);
}

}  // namespace

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
  // Calls still alive (a worker call outliving its client's call) use this service's parts:
  // end them and wait for their worker calls, which a Reserve's timeout bounds.
  EndAll();
  const absl::Time give_up = absl::Now() + options_.timeouts.reserve + absl::Seconds(1);
  while (live_calls_.load() > 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  if (live_calls_.load() > 0) {
    ESTUARY_LOG(WARNING) << live_calls_.load() << " Generate calls still alive at shutdown";
  }
  {
    absl::MutexLock lock(&stop_mu_);
    stopping_ = true;
  }
  watchdog_.join();
}

void RouterService::StartDrain() { draining_ = true; }

int RouterService::active_requests() { return active_.size(); }

void RouterService::EndAll() {
  for (const std::shared_ptr<GenerateCall>& call : active_.All()) {
    call->Cancel(GenerateCall::CancelCause::kShutdown);
  }
}

bool RouterService::Ready() {
  return !draining_.load() &&
         !registry_.Live(estuary::v1::WORKER_ROLE_DECODE, absl::Now()).empty();
}

std::string RouterService::NewRequestId() { return NewUnguessableRequestId(); }

void RouterService::Watch() {
  while (true) {
    {
      absl::MutexLock lock(&stop_mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stop_mu_) { return stopping_; };
      stop_mu_.AwaitWithTimeout(absl::Condition(&stopping), kWatchInterval);
      if (stopping_) return;
    }
    const absl::Time now = absl::Now();
    // Silent workers go now, not at the next placement; every drop reaches the calls on it.
    registry_.Expire(now);
    const std::vector<DroppedWorker> dropped = registry_.TakeDropped();
    for (const std::shared_ptr<GenerateCall>& call : active_.All()) {
      for (const DroppedWorker& worker : dropped) call->OnWorkerDropped(worker);
      call->Tick(now);
    }
  }
}

// ---- Inference ----

grpc::ServerWriteReactor<estuary::v1::GenerateResponse>* RouterService::Inference::Generate(
    grpc::CallbackServerContext* context, const estuary::v1::GenerateRequest* request) {
  if (grpc::Status auth = rpc::CheckApiKey(context, router_.options_.api_key); !auth.ok()) {
    return RefusedGenerate(auth);
  }
  return GenerateCall::Start(router_.parts_, context, *request);
}

grpc::Status RouterService::Inference::Abort(grpc::ServerContext* context,
                                             const estuary::v1::AbortRequest* request,
                                             estuary::v1::AbortResponse* response) {
  if (grpc::Status auth = rpc::CheckApiKey(context, router_.options_.api_key); !auth.ok()) {
    return auth;
  }
  std::shared_ptr<GenerateCall> call = router_.active_.Find(request->request_id());
  // Only the caller that made the request may abort it; to anyone else the id does not exist.
  if (call != nullptr && !rpc::SameCaller(call->owner(), rpc::CallerIdentity(context))) {
    call = nullptr;
  }
  response->set_found(call != nullptr);
  if (call != nullptr) call->Cancel(GenerateCall::CancelCause::kAbortRpc);
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
