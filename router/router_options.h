#pragma once
// RouterOptions: what estuary-router's flags set (router_main.cc), validated before anything
// loads. The service (router_service.h) reads the serving fields; main the process fields.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "router/stage_timeouts.h"
#include "router/worker_discovery.h"
#include "router/worker_registry.h"

namespace estuary::router {

struct RouterOptions {
  // Process.
  std::string model;                 // model folder: the tokenizer and config come from it
  std::string model_id;              // workers register with it; empty = the model folder's name
  // --served-model-name: the name clients see and send (ListModels, /v1/models, a request's
  // `model`); empty = model_id.
  std::string served_model_name;
  // --api-key (or $ESTUARY_API_KEY): the client port (estuary.v1.Inference; the HTTP door too)
  // wants `authorization: Bearer KEY`; empty = open. Worker registration is not covered.
  std::string api_key;
  // --max-model-len: prompt + max_tokens at most (below the model's context length); 0 = the
  // model's. Workers register with at least this context.
  int max_model_len = 0;
  std::string host = "127.0.0.1";
  int port = 50051;                  // 0 = any free port (see ready_file)
  std::string ready_file;            // written with "host:port\n" once serving
  int metrics_port = -1;             // Prometheus /metrics HTTP port; -1 = off, 0 = any free port
  // SIGTERM: not ready and refusing new requests at once; requests in flight get this long to
  // finish, then end with UNAVAILABLE.
  absl::Duration shutdown_timeout = absl::Seconds(30);

  // Serving.
  Policy policy = Policy::kLeastLoaded;
  // Prompts of at most this many tokens are prefilled on the decode worker itself (conditional
  // disaggregation); 0 = always disaggregate while a compatible prefill worker is registered.
  int local_prefill_max_tokens = 0;
  // Generate calls at once, in any state (each holds a server thread: the thread quota is this
  // plus rpc::ServerLimits::kControlThreads); beyond, Generate answers RESOURCE_EXHAUSTED
  // before reading the request.
  int max_concurrent_streams = 1024;
  static constexpr int kMaxStreamsCap = 1 << 16;
  // The largest request message the client port reads (bigger: RESOURCE_EXHAUSTED from gRPC,
  // before anything is parsed).
  int max_request_bytes = 4 << 20;
  // Requests admitted but not yet streaming (placement, reservation, prefill) at most; beyond,
  // Generate answers RESOURCE_EXHAUSTED.
  int max_queued_requests = 1024;
  absl::Duration worker_timeout = absl::Seconds(3);        // heartbeat silence that drops a worker
  absl::Duration heartbeat_interval = absl::Milliseconds(500);  // told to workers at Register
  // Workers found by name (worker_discovery.h): every address each name resolves to is probed
  // every discovery_interval. Empty: registration only.
  std::vector<DiscoveryTarget> discover_workers;
  absl::Duration discovery_interval = absl::Milliseconds(500);
  // Attempts of a request whose worker failed (UNAVAILABLE, dropped, hung, full) before its
  // first token reached the client.
  int max_attempts = 3;
  // --migration-limit: how many times a stream whose decode worker failed, hung or drained after
  // its first token is resumed on another decode worker from the tokens sent so far (the client
  // sees one stream); 0 = never: it ends UNAVAILABLE. Also tells draining decode workers to hand
  // streams back at once (DecodeRequest.resumable).
  int migration_limit = 3;
  static constexpr int kMaxMigrationLimit = 100;
  // Each hop's own deadline when the client's is later or absent (--reserve-timeout, ...).
  StageTimeouts timeouts;
};

// INVALID_ARGUMENT naming the flag.
absl::Status ValidateRouterOptions(const RouterOptions& options);

}  // namespace estuary::router
