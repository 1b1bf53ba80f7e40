#pragma once
// RouterService: the router's two gRPC services (design §1).
//
//   - estuary.v1.Inference (inference_service()): Generate validates the request
//     (request_validation.h), admits it first (admission.h: --max-concurrent-streams,
//     --max-queued-requests), picks a (prefill, decode) pair
//     from the registry by the placement policy and runs it disaggregated (decode Reserve ->
//     prefill Prefill with the transfer descriptor -> decode Decode stream) or locally (decode
//     Decode with `local_prefill`: prompts of at most --local-prefill-max-tokens tokens, or any
//     prompt while no compatible prefill worker is registered). It relays the tokens as Chunks
//     (token ids, UTF-8-safe text deltas, exit layers), applies stop strings on the text, and
//     ends with one Complete (finish reason, usage, timings). The client's deadline goes to the
//     workers; a client that goes away, or an Abort by request id from the caller that made
//     the request (its API key and TLS identity; to anyone else the id does not exist), aborts
//     the request on both workers. Ids the router makes are unguessable (request_ids.h). A worker that answers UNAVAILABLE is dropped from the registry, and the request
//     is tried again on another pair while nothing has been streamed yet; so is one refused
//     by a full worker (RESOURCE_EXHAUSTED), which stays registered.
//     Abort, ListModels, GetModelInfo as in inference.proto.
//   - estuary.v1.WorkerRegistry (registry_service()): Register / Heartbeat / Unregister into a
//     WorkerRegistry (worker_registry.h); each call needs the cluster token when one is
//     configured (rpc/cluster_security.h), and under mutual TLS a live worker's id stays with
//     its certificate's identity. Which port serves it: router_doors.h. Workers found by name (--discover-workers) are probed
//     into the same registry by a WorkerDiscovery (worker_discovery.h).
//
// Thread-safety: every RPC may run concurrently on gRPC's threads (one per call).

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/tokenizer/tokenizer.h"
#include "estuary/v1/inference.grpc.pb.h"
#include "estuary/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "router/admission.h"
#include "router/prompt_homes.h"
#include "router/request_validation.h"
#include "router/router_metrics.h"
#include "router/router_options.h"
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
  struct Active;  // one Generate in flight
  struct Attempt;
  class Relay;

  class Inference final : public estuary::v1::Inference::Service {
   public:
    explicit Inference(RouterService& router) : router_(router) {}
    grpc::Status Generate(grpc::ServerContext* context, const estuary::v1::GenerateRequest* request,
                          grpc::ServerWriter<estuary::v1::GenerateResponse>* writer) override;
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

  grpc::Status Generate(grpc::ServerContext* context, const estuary::v1::GenerateRequest& request,
                        grpc::ServerWriter<estuary::v1::GenerateResponse>* writer);
  // One try on one pair; `retry` is set when it failed on an UNAVAILABLE worker with nothing
  // streamed yet.
  using WriteFn = std::function<bool(estuary::v1::GenerateResponse&)>;
  // For GenerateRequest.same_prompt_as: the decode worker of that running request, for a local
  // prefill that adopts its prompt pages; nullopt when it cannot be (then placement as usual).
  std::optional<Placement> PlaceBeside(const std::string& first_id,
                                       const std::vector<int32_t>& prompt, absl::Time now);
  absl::Status RunAttempt(Active& active, Attempt& attempt, Relay& relay, const WriteFn& write,
                          bool* retry);
  // Cancels the worker call in progress and aborts the request on its workers. `client_gone`:
  // the client cancelled or went away (else: an Abort RPC).
  void Cancel(const std::shared_ptr<Active>& active, bool client_gone);
  void AbortOnWorkers(const std::string& request_id, const std::string& decode_address,
                      const std::string& prefill_address);
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  std::string NewRequestId();  // unguessable (request_ids.h)
  // Watches the live requests' clients; runs on watchdog_.
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

  absl::Mutex channels_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(channels_mu_);

  // Where recent requests' prompts live, for GenerateRequest.same_prompt_as (PlaceBeside).
  PromptHomes prompt_homes_{/*capacity=*/4096, /*ttl=*/absl::Seconds(60)};
  absl::Mutex active_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Active>> active_ ABSL_GUARDED_BY(active_mu_);
  bool stopping_ ABSL_GUARDED_BY(active_mu_) = false;
  std::thread watchdog_;
};

}  // namespace estuary::router
