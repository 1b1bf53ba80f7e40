#pragma once
// What the worker binaries (estuary-prefill, estuary-decode) share between parsing their flags
// and serving: loading the model onto its TP ranks, the UCX transport, and serving until
// SIGINT / SIGTERM with a ready file that launchers and tests wait on.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/sharded_model.h"
#include "grpcpp/grpcpp.h"
#include "kvtransfer/transport.h"

namespace estuary::rpc {

struct WorkerProcessOptions {
  std::string model;       // model folder
  std::string model_id;    // KV format fingerprint name; default: the model folder's name
  std::string host = "127.0.0.1";
  int port = 0;            // 0: any free port
  int tp_size = 1;
  std::string ucx_tls;     // UCX transports; empty: UCX's default (and UCX_TLS)
  std::string ready_file;  // written with "host:port\n" once serving
};

// INVALID_ARGUMENT naming the flag.
absl::Status ValidateWorkerProcessOptions(const WorkerProcessOptions& options);
// The default model id: the model folder's last path component.
std::string DefaultModelId(const std::string& model_path);

// Call first thing in main(): SIGINT and SIGTERM are then taken by ServeUntilSignal only.
void BlockTerminationSignals();

absl::StatusOr<std::unique_ptr<ShardedModel>> LoadShardedModel(const WorkerProcessOptions& options);
absl::StatusOr<std::unique_ptr<kvtransfer::Transport>> CreateTransport(
    const WorkerProcessOptions& options);

// Starts the gRPC server with `services` (plus health and reflection), writes the ready file,
// blocks until SIGINT / SIGTERM, then shuts the server down (in-flight calls get a short grace).
absl::Status ServeUntilSignal(const WorkerProcessOptions& options, const std::string& role,
                              const std::vector<grpc::Service*>& services);

}  // namespace estuary::rpc
