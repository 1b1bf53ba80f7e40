#pragma once
// RouterService: the router's two gRPC services (design §1).
//
//   - estuary.v1.Inference (inference_service()): Generate runs on gRPC's callback API, one
//     GenerateCall (generate_call.h) per call, whose RequestFlow (request_flow.h) is the
//     request's state machine: admission first (admission.h: --max-concurrent-streams,
//     --max-queued-requests), validation (request_validation.h), a deadline that cannot be met
//     refused at once (ttft_floor.h); then placement on a (prefill, decode) pair by the policy,
//     disaggregated (decode Reserve -> prefill Prefill with the transfer descriptor -> decode
//     Decode stream) or locally (decode Decode with `local_prefill`: prompts of at most
//     --local-prefill-max-tokens tokens, or any prompt while no compatible prefill worker is
//     registered); the tokens relayed as Chunks (token_relay.h) and one Complete at the end.
//     Every worker call has a deadline (the client's, or its stage's: stage_timeouts.h); a
//     failed, dropped, draining or hung worker gets the request retried elsewhere before its
//     first token and resumed elsewhere after it (--migration-limit). A client that goes away,
//     or an Abort by request id from the caller that made the request (its API key and TLS
//     identity; to anyone else the id does not exist), aborts the request on its workers. Ids
//     the router makes are unguessable (request_ids.h).
//     Abort, ListModels, GetModelInfo as in inference.proto.
//   - estuary.v1.WorkerRegistry (registry_service()): Register / Heartbeat / Unregister into a
//     WorkerRegistry (worker_registry.h); each call needs the cluster token when one is
//     configured (rpc/cluster_security.h), and under mutual TLS a live worker's id stays with
//     its certificate's identity. Which port serves it: router_doors.h. Workers found by name (--discover-workers) are probed
//     into the same registry by a WorkerDiscovery (worker_discovery.h).
//
// A watchdog thread beats every 20 ms: it expires silent workers, hands each worker the registry
// dropped to the calls in flight on it, and times the Decode streams' tokens (GenerateCall::Tick).
//
// Thread-safety: every RPC may run concurrently on gRPC's threads; Generate holds none while
// it waits.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/tokenizer/tokenizer.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "router/active_calls.h"
#include "router/admission.h"
#include "router/generate_call.h"
#include "router/prompt_homes.h"
#include "router/request_validation.h"
#include "router/router_metrics.h"
#include "router/router_options.h"
#include "router/ttft_floor.h"
#include "router/worker_channels.h"
#include "router/worker_discovery.h"
#include "router/worker_registry.h"

namespace estuary::router {

class RouterService {
 public:
  // Reads the model metadata of `options.model` (config, tokenizer, generation defaults; no
  // weight file is opened: core/loader/model_metadata.h). `options` should have passed
  // ValidateRouterOptions.
  static absl::StatusOr<std::unique_ptr<RouterService>> Create(const RouterOptions& options);
  // With a tokenizer and limits at hand (tests).
  RouterService(const RouterOptions& options, std::unique_ptr<Tokenizer> tokenizer,
                const ModelLimits& limits);
  ~RouterService();

  grpc::Service* inference_service() { return &inference_; }
  grpc::Service* registry_service() { return &registry_service_; }
  std::vector<grpc::Service*> services() { return {&inference_, &registry_service_}; }

  WorkerRegistry& registry() { return registry_; }
  const std::string& model_id() const { return model_id_; }
  // The name clients see and send (--served-model-name; default: model_id()).
  const std::string& served_model_name() const { return served_name_; }
  const ModelLimits& limits() const { return limits_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Requests admitted and not yet streaming (the figure --max-queued-requests bounds).
  int queued() const { return admission_.queued(); }

  // The drain (router_main on SIGTERM). From StartDrain on, Generate answers UNAVAILABLE (a
  // client or a load balancer retries on another replica) while the requests in flight go on;
  // active_requests() counts those; EndAll ends what is left with UNAVAILABLE and a message
  // (the drain ran past --shutdown-timeout), aborting them on their workers.
  void StartDrain();
  int active_requests();
  void EndAll();
  // Readiness (gRPC health, /health): not draining, and at least one ready decode worker known.
  // Liveness never asks this: it does not depend on workers.
  bool Ready();

 private:
  // Generate on the callback API (a reactor per call, no thread held); the others synchronous.
  class Inference final
      : public estuary::v1::Inference::WithCallbackMethod_Generate<estuary::v1::Inference::Service> {
   public:
    explicit Inference(RouterService& router) : router_(router) {}
    grpc::ServerWriteReactor<estuary::v1::GenerateResponse>* Generate(
        grpc::CallbackServerContext* context, const estuary::v1::GenerateRequest* request) override;
    grpc::Status Abort(grpc::ServerContext* context, const estuary::v1::AbortRequest* request,
                       estuary::v1::AbortResponse* response) override;
    grpc::Status ListModels(grpc::ServerContext* context,
                            const estuary::v1::ListModelsRequest* request,
                            estuary::v1::ListModelsResponse* response) override;
    grpc::Status GetModelInfo(grpc::ServerContext* context,
                              const estuary::v1::GetModelInfoRequest* request,
                              estuary::v1::ModelInfo* response) override;

   private:
    RouterService& router_;
  };

  class Registry final : public estuary::v1::WorkerRegistry::Service {
   public:
    explicit Registry(RouterService& router) : router_(router) {}
    grpc::Status Register(grpc::ServerContext* context, const estuary::v1::RegisterRequest* request,
                          estuary::v1::RegisterResponse* response) override;
    grpc::Status Heartbeat(grpc::ServerContext* context,
                           const estuary::v1::HeartbeatRequest* request,
                           estuary::v1::HeartbeatResponse* response) override;
    grpc::Status Unregister(grpc::ServerContext* context,
                            const estuary::v1::UnregisterRequest* request,
                            estuary::v1::UnregisterResponse* response) override;

   private:
    RouterService& router_;
  };

  std::string NewRequestId();  // unguessable (request_ids.h)
  // The watchdog's loop (see above); runs on watchdog_.
  void Watch();
  // The cluster-wide gauges of metrics_ from the live decode workers' loads (on heartbeats).
  void UpdateClusterLoad(absl::Time now);

  const RouterOptions options_;
  const std::string model_id_;
  const std::string served_name_;
  std::unique_ptr<Tokenizer> tokenizer_;
  const ModelLimits limits_;
  RouterMetrics& metrics_;
  WorkerRegistry registry_;
  std::unique_ptr<WorkerDiscovery> discovery_;  // with --discover-workers; stops before registry_
  Inference inference_{*this};
  Registry registry_service_{*this};

  Admission admission_{options_.max_concurrent_streams, options_.max_queued_requests};
  std::atomic<bool> draining_{false};

  WorkerChannels channels_;
  // Where recent requests' prompts live, for GenerateRequest.same_prompt_as.
  PromptHomes prompt_homes_{/*capacity=*/4096, /*ttl=*/absl::Seconds(60)};
  TtftFloor ttft_floor_;
  ActiveCalls active_;
  std::atomic<int> live_calls_{0};
  RouterParts parts_{options_,    *tokenizer_, limits_,       served_name_,
                     metrics_,    registry_,   prompt_homes_, admission_,
                     ttft_floor_, channels_,   active_,       draining_,
                     [this] { return NewRequestId(); },       live_calls_};

  absl::Mutex stop_mu_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread watchdog_;
};

}  // namespace estuary::router
