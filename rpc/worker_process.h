#pragma once
// What the worker binaries (estuary-prefill, estuary-decode) share between parsing their flags
// and serving: loading the model onto its TP ranks, the UCX transport, and serving until
// SIGINT / SIGTERM with a ready file that launchers and tests wait on.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/backend/backend.h"
#include "core/kvcache/kv_pool.h"
#include "core/model/sharded_model.h"
#include "estuary/v1/worker.pb.h"
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
  std::string router;      // the router's host:port to register with; empty: none
  int metrics_port = -1;   // Prometheus /metrics HTTP port; -1: off, 0: any free port
  // --device: "cpu", or "cuda[:N]" to run the engine's steps on that GPU (estuary-decode, a CUDA
  // build); parsed by ValidateWorkerProcessOptions / WorkerDevice.
  std::string device = "cpu";
  // --kv-transport: "ucx" (host memory, tcp / shared memory / RDMA) or "nccl" (GPU memory to GPU
  // memory, with UCX carrying the control messages; needs --device cuda).
  std::string kv_transport = "ucx";
};

// INVALID_ARGUMENT naming the flag.
absl::Status ValidateWorkerProcessOptions(const WorkerProcessOptions& options);
// The parsed --device (INVALID_ARGUMENT for a bad spelling).
absl::StatusOr<Device> WorkerDevice(const WorkerProcessOptions& options);
// The default model id: the model folder's last path component.
std::string DefaultModelId(const std::string& model_path);

// Call first thing in main(): SIGINT and SIGTERM are then taken by ServeUntilSignal only.
void BlockTerminationSignals();

absl::StatusOr<std::unique_ptr<ShardedModel>> LoadShardedModel(const WorkerProcessOptions& options);
absl::StatusOr<std::unique_ptr<kvtransfer::Transport>> CreateTransport(
    const WorkerProcessOptions& options);

// The whole main() of a worker binary: blocks the termination signals, parses the flags (dashes
// or underscores), runs `run` and turns its status into the exit code (printing errors as
// "<program>: <status>").
int WorkerMain(int argc, char** argv, const char* program, const std::function<absl::Status()>& run);

// Current KV pool figures into a load report (thread-safe: KvPool::Stats()).
void SetPoolLoad(const KvPool& pool, estuary::v1::WorkerLoad* load);

// What a worker tells the router about itself (worker.proto WorkerInfo).
estuary::v1::WorkerInfo MakeWorkerInfo(estuary::v1::WorkerRole role, const std::string& address,
                                       const WorkerProcessOptions& options,
                                       const LlamaConfig& config, int block_size,
                                       const estuary::v1::KvFormatFingerprint& fingerprint);

// Starts the gRPC server with `services` (plus health and reflection), writes the ready file,
// serves /metrics over HTTP when options.metrics_port >= 0 (rpc/metrics_http.h),
// registers with the router when one is set (heartbeats carrying `load()`), blocks until
// SIGINT / SIGTERM, then shuts the server down (in-flight calls get a short grace).
// `info.address` and `info.worker_id` are filled in with the bound address.
absl::Status ServeUntilSignal(const WorkerProcessOptions& options, estuary::v1::WorkerInfo info,
                              const std::vector<grpc::Service*>& services,
                              const std::function<estuary::v1::WorkerLoad()>& load);

}  // namespace estuary::rpc
