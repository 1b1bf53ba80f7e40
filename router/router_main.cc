// estuary-router: the client-facing process (design §1). Flags are parsed into RouterOptions and
// validated before anything loads; then the model folder's metadata (config, tokenizer; no
// weights) is read and estuary.v1.Inference + estuary.v1.WorkerRegistry (+ gRPC health and
// reflection) are served until SIGINT / SIGTERM.
//
// Health: readiness ("" and the services in grpc.health.v1, HTTP /health) is on while at least
// one ready decode worker is known and the router is not draining; liveness (the "liveness"
// health service, HTTP /live) is on while the process serves, whatever the workers do.
// SIGTERM: not ready and refusing new requests (UNAVAILABLE) at once; requests in flight get
// --shutdown-timeout to finish, then end with UNAVAILABLE; a second signal exits at once.
//
//   estuary-router --model PATH [--host H] [--port P] [--policy least_loaded]
//                  [--local-prefill-max-tokens N] [--max-queued-requests N]
//                  [--max-concurrent-streams N]
//                  [--worker-timeout 3s] [--ready-file F] [--metrics-port P]
//                  [--discover-workers NAME:PORT,...] [--shutdown-timeout 30s]
//                  [--http-port P] [--http-max-concurrent-requests N] [--http-max-body-bytes B]
//                  [--http-request-timeout D] [--http-read-timeout D]
//                  [--api-key KEY] [--served-model-name NAME] [--max-model-len L]
//                  [--chat-template FILE] [--ssl-certfile F --ssl-keyfile F]
//                  [--cluster-token T] [--cluster-port P]
//                  [--cluster-ca-file F --cluster-cert-file F --cluster-key-file F]
//                  [--migration-limit N] [--reserve-timeout D]
//                  [--prefill-timeout D] [--first-token-timeout D] [--token-gap-timeout D]
//                  [--abort-timeout D]
// Who may use which port: router_doors.h (client port, worker registration) and
// rpc/cluster_security.h (the calls to the workers).
// Its flags: cli/command_tables.cc (RouterCommand); `estuary-router --help` lists them.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "router/openai/chat_prompt.h"
#include "router/openai/openai_server.h"
#include "router/router_doors.h"
#include "router/router_options.h"
#include "router/router_service.h"
#include "cli/command_tables.h"
#include "rpc/api_key.h"
#include "rpc/client_tls.h"
#include "rpc/cluster_flags.h"
#include "rpc/cluster_security.h"
#include "rpc/grpc_server.h"
#include "rpc/metrics_http.h"
#include "process/process_main.h"
#include "process/ready_file.h"
#include "process/signals.h"

ABSL_FLAG(std::string, model, "", "model folder (llama2.c or Hugging Face): tokenizer and config");
ABSL_FLAG(std::string, model_id, "",
          "the model's id, which workers must register with; default: the model folder's name");
ABSL_FLAG(std::string, served_model_name, "",
          "the model name clients see and send (ListModels, /v1/models, a request's `model`); "
          "default: --model-id");
ABSL_FLAG(std::string, api_key, "",
          "clients must send `authorization: Bearer KEY` (gRPC metadata; HTTP header: else 401, "
          "but /health, /live, /metrics stay open); default: $ESTUARY_API_KEY, else no key");
ABSL_FLAG(int, max_model_len, 0,
          "prompt + max_tokens per request at most (vLLM's name); 0 = the model's context "
          "length; beyond: INVALID_ARGUMENT / HTTP 400");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (0.0.0.0 for all)");
ABSL_FLAG(int, port, 50051, "gRPC port; 0 = any free port (see --ready-file)");
ABSL_FLAG(std::string, policy, "least_loaded",
          "placement: round_robin, least_loaded or prefix_aware");
ABSL_FLAG(int, local_prefill_max_tokens, 0,
          "prompts of at most this many tokens are prefilled on the decode worker; 0 = never "
          "(while a compatible prefill worker is registered)");
ABSL_FLAG(int, max_queued_requests, 1024,
          "requests waiting for their first token at most; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, worker_timeout, absl::Seconds(3),
          "a worker silent for this long is dropped (heartbeats come every 500ms)");
ABSL_FLAG(std::string, ready_file, "", "written with host:port once the router serves");
ABSL_FLAG(std::vector<std::string>, discover_workers, {},
          "comma-separated NAME:PORT of workers to find by name (a headless Service): every "
          "address NAME resolves to is probed with GetInfo / GetLoad; registration still works");
ABSL_FLAG(absl::Duration, discovery_interval, absl::Milliseconds(500),
          "how often --discover-workers names are re-resolved and their workers probed");
ABSL_FLAG(absl::Duration, shutdown_timeout, absl::Seconds(30),
          "on SIGTERM, how long requests in flight may take before they end with UNAVAILABLE");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics HTTP port on --host; -1 = off, 0 = any free port");

ABSL_FLAG(int, http_port, -1,
          "OpenAI-compatible HTTP port on --host (/v1/completions, /v1/chat/completions, "
          "/v1/models, /tokenize, /detokenize, /health, /live, /metrics); -1 = off, 0 = any free "
          "port");
ABSL_FLAG(int, max_concurrent_streams, 1024,
          "Generate calls at once (queued or streaming; each holds a server thread); beyond: "
          "RESOURCE_EXHAUSTED with a retry hint, before the request is read");
ABSL_FLAG(int, http_max_concurrent_requests, 256,
          "HTTP generation requests answered at once; beyond: 429");
ABSL_FLAG(int64_t, http_max_body_bytes, int64_t{4} << 20, "HTTP request bodies at most; beyond: 413");
ABSL_FLAG(absl::Duration, http_request_timeout, absl::Minutes(10),
          "an HTTP generation request is given this long in all");
ABSL_FLAG(absl::Duration, http_read_timeout, absl::Seconds(30),
          "an HTTP client that sends nothing for this long is dropped (also the write timeout)");
ABSL_FLAG(std::string, ssl_certfile, "",
          "TLS on the client ports (gRPC --port and HTTP --http-port): the certificate chain "
          "(PEM), re-read every --tls-refresh-interval; with --ssl-keyfile");
ABSL_FLAG(std::string, ssl_keyfile, "", "TLS on the client ports: the private key (PEM)");
ABSL_FLAG(int, cluster_port, -1,
          "worker registration (WorkerRegistry) on a port of its own, with the cluster's "
          "credentials (mutual TLS when configured); workers' --router points here; -1 = on the "
          "client port (not with mutual TLS), 0 = any free port");
ABSL_FLAG(int, migration_limit, 3,
          "times a stream is resumed on another decode worker when its own fails, hangs or "
          "drains after the first token (from the tokens sent so far; the client sees one "
          "stream); 0 = never (it ends UNAVAILABLE)");
ABSL_FLAG(absl::Duration, reserve_timeout, absl::Seconds(5),
          "a decode worker's Reserve may take this long (when the client's deadline is later)");
ABSL_FLAG(absl::Duration, prefill_timeout, absl::Seconds(120),
          "a prefill worker's Prefill (the prompt and its KV push) may take this long");
ABSL_FLAG(absl::Duration, first_token_timeout, absl::Seconds(120),
          "a decode stream's first token (a local prefill included) may take this long");
ABSL_FLAG(absl::Duration, token_gap_timeout, absl::Seconds(30),
          "the gap between two tokens of a decode stream may last this long; past it the "
          "worker counts as hung (retried, or resumed elsewhere)");
ABSL_FLAG(absl::Duration, abort_timeout, absl::Seconds(1), "a worker Abort may take this long");
ABSL_FLAG(std::string, chat_template, "",
          "Jinja chat template file for /v1/chat/completions (Hugging Face chat_template syntax); "
          "default: chat_template in the model folder's tokenizer_config.json; neither: those "
          "requests get 400");

namespace estuary::router {
namespace {

// The HTTP door's options from its flags (the served model's fields are set once it is read);
// INVALID_ARGUMENT naming the flag.
absl::StatusOr<openai::OpenAiServerOptions> HttpOptionsFromFlags(const RouterOptions& options) {
  openai::OpenAiServerOptions http;
  http.host = options.host;
  http.port = absl::GetFlag(FLAGS_http_port);
  if (http.port < -1 || http.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-port = ", http.port, " outside [-1, 65535]"));
  }
  http.max_concurrent_requests = absl::GetFlag(FLAGS_http_max_concurrent_requests);
  if (http.max_concurrent_requests < 1 || http.max_concurrent_requests > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--http-max-concurrent-requests = ",
                                                   http.max_concurrent_requests,
                                                   " outside [1, 4096]"));
  }
  const int64_t body = absl::GetFlag(FLAGS_http_max_body_bytes);
  if (body < 1024 || body > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-max-body-bytes = ", body, " outside [1024, 1 GiB]"));
  }
  http.max_body_bytes = static_cast<size_t>(body);
  http.request_timeout = absl::GetFlag(FLAGS_http_request_timeout);
  http.read_timeout = absl::GetFlag(FLAGS_http_read_timeout);
  http.write_timeout = http.read_timeout;
  http.tls.cert_file = absl::GetFlag(FLAGS_ssl_certfile);
  http.tls.key_file = absl::GetFlag(FLAGS_ssl_keyfile);
  http.tls.refresh = absl::GetFlag(FLAGS_tls_refresh_interval);
  if (http.request_timeout <= absl::ZeroDuration() || http.read_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "--http-request-timeout must be positive and --http-read-timeout at least 1s");
  }
  return http;
}

constexpr absl::Duration kHealthInterval = absl::Milliseconds(100);

// The HTTP door's channel to this router's own Inference service: it checked the HTTP
// Authorization header itself, and its calls carry the key the gRPC side checks.
std::shared_ptr<grpc::Channel> InProcessChannel(grpc::Server& server, const std::string& api_key) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!api_key.empty()) interceptors.push_back(rpc::ApiKeyInterceptorFactory(api_key));
  return server.experimental().InProcessChannelWithInterceptors(grpc::ChannelArguments(),
                                                                std::move(interceptors));
}

absl::StatusOr<RouterOptions> OptionsFromFlags() {
  RouterOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  options.model_id = absl::GetFlag(FLAGS_model_id);
  options.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  options.api_key = rpc::ApiKeyFromFlagOrEnv(absl::GetFlag(FLAGS_api_key));
  options.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  ESTUARY_ASSIGN_OR_RETURN(options.policy, ParsePolicy(absl::GetFlag(FLAGS_policy)));
  options.local_prefill_max_tokens = absl::GetFlag(FLAGS_local_prefill_max_tokens);
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.worker_timeout = absl::GetFlag(FLAGS_worker_timeout);
  options.ready_file = absl::GetFlag(FLAGS_ready_file);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.shutdown_timeout = absl::GetFlag(FLAGS_shutdown_timeout);
  options.discovery_interval = absl::GetFlag(FLAGS_discovery_interval);
  options.migration_limit = absl::GetFlag(FLAGS_migration_limit);
  options.timeouts.reserve = absl::GetFlag(FLAGS_reserve_timeout);
  options.timeouts.prefill = absl::GetFlag(FLAGS_prefill_timeout);
  options.timeouts.first_token = absl::GetFlag(FLAGS_first_token_timeout);
  options.timeouts.token_gap = absl::GetFlag(FLAGS_token_gap_timeout);
  options.timeouts.abort = absl::GetFlag(FLAGS_abort_timeout);
  for (const std::string& entry : absl::GetFlag(FLAGS_discover_workers)) {
    ESTUARY_ASSIGN_OR_RETURN(DiscoveryTarget target, ParseDiscoveryTarget(entry));
    options.discover_workers.push_back(std::move(target));
  }
  ESTUARY_RETURN_IF_ERROR(ValidateRouterOptions(options));
  return options;
}

// The client port's limits: the request size, and a thread quota above --max-concurrent-streams
// (the router's own refusal, naming the flag, comes first; the HTTP door's calls count too).
rpc::ServerLimits RouterServerLimits(const RouterOptions& options) {
  rpc::ServerLimits limits;
  limits.max_message_bytes = options.max_request_bytes;
  limits.max_threads = options.max_concurrent_streams + rpc::ServerLimits::kControlThreads;
  // Above the cap too: a connection at HTTP/2's stream limit makes its client queue the next
  // call instead of sending it, and the caller should be refused, not kept waiting.
  limits.max_streams_per_connection = limits.max_threads;
  return limits;
}

RouterDoors DoorsFromFlags() {
  RouterDoors doors;
  doors.client_tls.cert_file = absl::GetFlag(FLAGS_ssl_certfile);
  doors.client_tls.key_file = absl::GetFlag(FLAGS_ssl_keyfile);
  doors.client_tls.refresh = absl::GetFlag(FLAGS_tls_refresh_interval);
  doors.cluster_port = absl::GetFlag(FLAGS_cluster_port);
  return doors;
}

absl::Status Run() {
  ESTUARY_ASSIGN_OR_RETURN(RouterOptions options, OptionsFromFlags());
  ESTUARY_ASSIGN_OR_RETURN(openai::OpenAiServerOptions http_options, HttpOptionsFromFlags(options));
  ESTUARY_RETURN_IF_ERROR(rpc::ConfigureClusterSecurityFromFlags());
  const RouterDoors doors = DoorsFromFlags();
  const bool cluster_tls = rpc::ClusterTlsEnabled();
  ESTUARY_RETURN_IF_ERROR(
      ValidateRouterDoors(doors, cluster_tls, !options.discover_workers.empty()));
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<RouterService> router, RouterService::Create(options));
  http_options.served_model = router->served_model_name();
  http_options.api_key = options.api_key;
  http_options.context_length = router->limits().context_length;
  http_options.num_layers = router->limits().num_layers;
  const PortServices ports = AssignServices(doors, cluster_tls, router->inference_service(),
                                            router->registry_service());
  ESTUARY_ASSIGN_OR_RETURN(
      rpc::RunningServer running,
      rpc::StartGrpcServer(options.host, options.port, ports.client, RouterServerLimits(options),
                           rpc::ClientPortCredentials(doors.client_tls)));
  // Worker registration on its own port, with the cluster's credentials (router_doors.h).
  std::optional<rpc::RunningServer> cluster;
  if (!ports.cluster.empty()) {
    ESTUARY_ASSIGN_OR_RETURN(cluster,
                             rpc::StartGrpcServer(options.host, doors.cluster_port, ports.cluster));
    ESTUARY_LOG(INFO) << "router cluster port (worker registration) on " << cluster->address;
  } else if (!ports.registration_served) {
    ESTUARY_LOG(INFO) << "worker registration off (mutual TLS without --cluster-port): workers "
                         "come from --discover-workers";
  }
  // The HTTP door calls the router's own Inference service through an in-process channel.
  std::unique_ptr<openai::OpenAiServer> http;
  if (http_options.port >= 0) {
    ESTUARY_ASSIGN_OR_RETURN(
        openai::ChatPromptFn chat_prompt,
        openai::MakeChatPrompt(options.model, absl::GetFlag(FLAGS_chat_template), router->tokenizer()));
    if (!chat_prompt) ESTUARY_LOG(INFO) << "no chat template: /v1/chat/completions answers 400";
    http = std::make_unique<openai::OpenAiServer>(
        http_options,
        estuary::v1::Inference::NewStub(InProcessChannel(*running.server, options.api_key)),
        router->tokenizer(), [&router] { return router->Ready(); }, std::move(chat_prompt));
    ESTUARY_RETURN_IF_ERROR(http->Start());
    ESTUARY_LOG(INFO) << "router OpenAI HTTP on " << (doors.client_tls.enabled() ? "https" : "http")
                      << "://" << http->address() << "/v1";
  }
  rpc::MetricsHttpServer metrics;
  if (options.metrics_port >= 0) {
    ESTUARY_RETURN_IF_ERROR(metrics.Start(options.host, options.metrics_port));
    ESTUARY_LOG(INFO) << "router metrics on http://" << metrics.address() << "/metrics";
  }
  if (!options.ready_file.empty()) {
    ESTUARY_RETURN_IF_ERROR(process::WriteReadyFile(options.ready_file, running.address));
  }
  ESTUARY_LOG(INFO) << "router serving " << router->served_model_name() << " on "
                    << running.address << " (policy " << PolicyName(options.policy)
                    << ", local prefill up to " << options.local_prefill_max_tokens
                    << " tokens, max-model-len " << router->limits().context_length
                    << (options.api_key.empty() ? "" : ", API key required")
                    << (doors.client_tls.enabled() ? ", TLS" : "") << ")";

  // Readiness follows the registry: ready while a ready decode worker is known.
  std::atomic<bool> stop_watch{false};
  std::thread watcher([&] {
    bool ready = false;
    while (!stop_watch.load()) {
      const bool now_ready = router->Ready();
      if (now_ready != ready) {
        running.health.SetReady(now_ready);
        if (cluster.has_value()) cluster->health.SetReady(now_ready);
        metrics.SetReady(now_ready);
        ESTUARY_LOG(INFO) << "router " << (now_ready ? "ready" : "not ready (no decode worker)");
        ready = now_ready;
      }
      absl::SleepFor(kHealthInterval);
    }
  });
  process::WaitForTerminationSignal();
  // Drain: not ready and refusing new requests at once, then the requests in flight finish.
  router->StartDrain();
  stop_watch = true;
  watcher.join();
  running.health.SetReady(false);
  if (cluster.has_value()) cluster->health.SetReady(false);
  metrics.SetReady(false);
  ESTUARY_LOG(INFO) << "router draining " << router->active_requests() << " requests (up to "
                    << absl::FormatDuration(options.shutdown_timeout) << ")";
  const absl::Time deadline = absl::Now() + options.shutdown_timeout;
  while (router->active_requests() > 0 && absl::Now() < deadline) {
    if (process::WaitForTerminationSignal(std::min(deadline, absl::Now() + kHealthInterval))) {
      ESTUARY_LOG(WARNING) << "router: second signal, exiting now";
      std::fflush(nullptr);
      std::_Exit(1);
    }
  }
  if (router->active_requests() > 0) {
    ESTUARY_LOG(WARNING) << "router: --shutdown-timeout passed with " << router->active_requests()
                         << " requests in flight; ending them (UNAVAILABLE)";
    router->EndAll();
    const absl::Time grace = absl::Now() + absl::Seconds(2);
    while (router->active_requests() > 0 && absl::Now() < grace) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  ESTUARY_LOG(INFO) << "router shutting down";
  if (http != nullptr) http->Stop();
  running.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (cluster.has_value()) {
    cluster->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace estuary::router

int main(int argc, char** argv) {
  return estuary::process::ProcessMain(argc, argv, estuary::cli::RouterCommand(),
                                      estuary::router::Run, estuary::cli::ServerCommands());
}
