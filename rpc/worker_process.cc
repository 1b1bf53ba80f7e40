#include "rpc/worker_process.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "cli/flag_spelling.h"
#include "core/common/logging.h"
#include "core/common/status_macros.h"
#include "core/model/model_loader.h"
#include "kvtransfer/nccl_transport.h"
#include "kvtransfer/ucx_transport.h"
#include "router/registration_client.h"
#include "rpc/grpc_server.h"
#include "rpc/metrics_http.h"

namespace estuary::rpc {

absl::Status ValidateWorkerProcessOptions(const WorkerProcessOptions& options) {
  if (options.model.empty()) return absl::InvalidArgumentError("--model is required");
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port = ", options.port, " outside [0, 65535]"));
  }
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port = ", options.metrics_port, " outside [-1, 65535]"));
  }
  if (options.tp_size < 1 || options.tp_size > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-parallel-size = ", options.tp_size, " outside [1, 64]"));
  }
  ESTUARY_ASSIGN_OR_RETURN(const Device device, WorkerDevice(options));
  if (options.kv_transport != "ucx" && options.kv_transport != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-transport = '", options.kv_transport, "': expected ucx or nccl"));
  }
  // KV lives where the engine runs: host pools move over UCX, GPU pools over NCCL.
  if (device.is_cpu() != (options.kv_transport == "ucx")) {
    return absl::InvalidArgumentError(
        device.is_cpu() ? "--kv-transport nccl moves KV between GPUs: it needs --device cuda"
                        : "--device cuda keeps the KV pool in GPU memory: it needs "
                          "--kv-transport nccl");
  }
  return absl::OkStatus();
}

absl::StatusOr<Device> WorkerDevice(const WorkerProcessOptions& options) {
  return ParseDevice(options.device);
}

std::string DefaultModelId(const std::string& model_path) {
  std::filesystem::path path(model_path);
  while (!path.empty() && path.filename().empty()) path = path.parent_path();
  return path.filename().string();
}

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WorkerMain(int argc, char** argv, const char* program,
               const std::function<absl::Status()>& run) {
  BlockTerminationSignals();
  cli::ParseFlags(argc, argv);
  const absl::Status status = run();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, status.ToString().c_str());
    return 1;
  }
  return 0;
}

void SetPoolLoad(const KvPool& pool, estuary::v1::WorkerLoad* load) {
  const KvPoolStats stats = pool.Stats();
  load->set_free_pages(stats.free_pages + stats.cached_pages);
  load->set_total_pages(stats.num_pages);
}

absl::StatusOr<std::unique_ptr<ShardedModel>> LoadShardedModel(
    const WorkerProcessOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(options.model));
  ShardedModelOptions sharding;
  sharding.tp_size = options.tp_size;
  return ShardedModel::Create(std::move(loaded.model), sharding);
}

absl::StatusOr<std::unique_ptr<kvtransfer::Transport>> CreateTransport(
    const WorkerProcessOptions& options) {
  kvtransfer::UcxTransportOptions ucx;
  ucx.tls = options.ucx_tls;
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<kvtransfer::UcxTransport> transport,
                           kvtransfer::UcxTransport::Create(ucx));
  if (options.kv_transport != "nccl") {
    return std::unique_ptr<kvtransfer::Transport>(std::move(transport));
  }
  // NCCL moves the pages; the UCX transport carries its control messages.
  ESTUARY_ASSIGN_OR_RETURN(const Device device, WorkerDevice(options));
  kvtransfer::NcclTransportOptions nccl;
  nccl.device = device.ordinal;
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<kvtransfer::NcclTransport> nccl_transport,
                           kvtransfer::NcclTransport::Create(std::move(transport), nccl));
  return std::unique_ptr<kvtransfer::Transport>(std::move(nccl_transport));
}

estuary::v1::WorkerInfo MakeWorkerInfo(estuary::v1::WorkerRole role, const std::string& address,
                                       const WorkerProcessOptions& options,
                                       const LlamaConfig& config, int block_size,
                                       const estuary::v1::KvFormatFingerprint& fingerprint) {
  estuary::v1::WorkerInfo info;
  info.set_role(role);
  info.set_address(address);
  info.set_model_id(options.model_id);
  info.set_tp_size(options.tp_size);
  info.set_block_size(block_size);
  *info.mutable_fingerprint() = fingerprint;
  info.set_context_length(config.max_seq_len);
  info.set_vocab_size(config.vocab_size);
  info.set_num_layers(config.n_layers);
  return info;
}

absl::Status ServeUntilSignal(const WorkerProcessOptions& options, estuary::v1::WorkerInfo info,
                              const std::vector<grpc::Service*>& services,
                              const std::function<estuary::v1::WorkerLoad()>& load) {
  const std::string role = info.role() == estuary::v1::WORKER_ROLE_PREFILL ? "prefill" : "decode";
  ESTUARY_ASSIGN_OR_RETURN(RunningServer running,
                           StartGrpcServer(options.host, options.port, services));
  MetricsHttpServer metrics;
  if (options.metrics_port >= 0) {
    ESTUARY_RETURN_IF_ERROR(metrics.Start(options.host, options.metrics_port));
    ESTUARY_LOG(INFO) << role << " worker metrics on http://" << metrics.address() << "/metrics";
  }
  if (!options.ready_file.empty()) {
    ESTUARY_RETURN_IF_ERROR(WriteReadyFile(options.ready_file, running.address));
  }
  ESTUARY_LOG(INFO) << role << " worker serving on " << running.address;
  router::RegistrationClient registration;
  if (!options.router.empty()) {
    info.set_address(running.address);
    info.set_worker_id(router::DefaultWorkerId(info.role(), running.address));
    registration.Start(options.router, info, load);
  }
  WaitForTerminationSignal();
  registration.Stop();
  ESTUARY_LOG(INFO) << role << " worker shutting down";
  running.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return absl::OkStatus();
}

}  // namespace estuary::rpc
