// estuary-router: the client-facing process (design §1). Flags are parsed into RouterOptions and
// validated before anything loads; then the model folder's tokenizer and config are loaded and
// estuary.v1.Inference + estuary.v1.WorkerRegistry (+ gRPC health and reflection) are served
// until SIGINT / SIGTERM.
//
//   estuary-router --model PATH [--host H] [--port P] [--policy least_loaded]
//                  [--local-prefill-max-tokens N] [--max-queued-requests N]
//                  [--worker-timeout 3s] [--ready-file F] [--metrics-port P]

#include <chrono>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "router/router_options.h"
#include "router/router_service.h"
#include "rpc/grpc_server.h"
#include "rpc/metrics_http.h"
#include "rpc/worker_process.h"

ABSL_FLAG(std::string, model, "", "model folder (llama2.c or Hugging Face): tokenizer and config");
ABSL_FLAG(std::string, model_id, "",
          "served model name (workers must register with it); default: the model folder's name");
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
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics HTTP port on --host; -1 = off, 0 = any free port");

namespace estuary::router {
namespace {

absl::StatusOr<RouterOptions> OptionsFromFlags() {
  RouterOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  options.model_id = absl::GetFlag(FLAGS_model_id);
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  ESTUARY_ASSIGN_OR_RETURN(options.policy, ParsePolicy(absl::GetFlag(FLAGS_policy)));
  options.local_prefill_max_tokens = absl::GetFlag(FLAGS_local_prefill_max_tokens);
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.worker_timeout = absl::GetFlag(FLAGS_worker_timeout);
  options.ready_file = absl::GetFlag(FLAGS_ready_file);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  ESTUARY_RETURN_IF_ERROR(ValidateRouterOptions(options));
  return options;
}

absl::Status Run() {
  ESTUARY_ASSIGN_OR_RETURN(RouterOptions options, OptionsFromFlags());
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<RouterService> router, RouterService::Create(options));
  ESTUARY_ASSIGN_OR_RETURN(rpc::RunningServer running,
                           rpc::StartGrpcServer(options.host, options.port, router->services()));
  rpc::MetricsHttpServer metrics;
  if (options.metrics_port >= 0) {
    ESTUARY_RETURN_IF_ERROR(metrics.Start(options.host, options.metrics_port));
    ESTUARY_LOG(INFO) << "router metrics on http://" << metrics.address() << "/metrics";
  }
  if (!options.ready_file.empty()) {
    ESTUARY_RETURN_IF_ERROR(rpc::WriteReadyFile(options.ready_file, running.address));
  }
  ESTUARY_LOG(INFO) << "router serving " << router->model_id() << " on " << running.address
                    << " (policy " << PolicyName(options.policy) << ", local prefill up to "
                    << options.local_prefill_max_tokens << " tokens)";
  rpc::WaitForTerminationSignal();
  ESTUARY_LOG(INFO) << "router shutting down";
  running.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return absl::OkStatus();
}

}  // namespace
}  // namespace estuary::router

int main(int argc, char** argv) {
  return estuary::rpc::WorkerMain(argc, argv, "estuary-router", estuary::router::Run);
}
