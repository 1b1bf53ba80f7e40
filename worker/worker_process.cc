#include "worker/worker_process.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <thread>

#include "absl/strings/str_cat.h"
#include "core/common/logging.h"
#include "core/common/metrics.h"
#include "core/common/status_macros.h"
#include "core/model/model_loader.h"
#include "kvtransfer/descriptor_seal.h"
#include "kvtransfer/nccl_transport.h"
#include "kvtransfer/ucx_transport.h"
#include "process/byte_size.h"
#include "process/host_address.h"
#include "process/ready_file.h"
#include "process/signals.h"
#include "rpc/cluster_security.h"
#include "rpc/grpc_server.h"
#include "rpc/metrics_http.h"
#include "worker/registration_client.h"

namespace estuary::worker {
namespace {

constexpr int kMaxRequestsInFlight = 1 << 16;

// The worker port's limits: a thread per request in flight plus the control calls (Abort,
// GetLoad, health), so the services' own cap (max_requests_in_flight) refuses first.
rpc::ServerLimits WorkerServerLimits(const WorkerProcessOptions& options) {
  rpc::ServerLimits limits;
  limits.max_threads = options.max_requests_in_flight + rpc::ServerLimits::kControlThreads;
  return limits;
}

}  // namespace

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
  if (options.shutdown_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown-timeout must be >= 0");
  }
  if (options.engine_stall_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--engine-stall-timeout must be > 0");
  }
  if (options.debug_step_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--debug-step-delay must be >= 0");
  }
  if (options.engine_watchdog_timeout < absl::ZeroDuration() ||
      (options.engine_watchdog_timeout > absl::ZeroDuration() &&
       options.engine_watchdog_timeout < options.engine_stall_timeout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--engine-watchdog-timeout = ", absl::FormatDuration(options.engine_watchdog_timeout),
        " must be 0 (off) or at least --engine-stall-timeout = ",
        absl::FormatDuration(options.engine_stall_timeout)));
  }
  if (options.debug_stall_rank < -1 || options.debug_stall_rank >= options.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--debug-stall-rank = ", options.debug_stall_rank,
                     " must be -1 (none) or a rank below --tensor-parallel-size"));
  }
  if (options.max_failed_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-failed-steps = ", options.max_failed_steps, " must be >= 1"));
  }
  if (options.max_model_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len = ", options.max_model_len, " must be >= 0 (0 = the model's)"));
  }
  if (options.max_requests_in_flight < 1 ||
      options.max_requests_in_flight > kMaxRequestsInFlight) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-num-seqs + --max-waiting-requests = ", options.max_requests_in_flight,
        " outside [1, ", kMaxRequestsInFlight, "] (--max-waiting-requests must be >= 0)"));
  }
  if (!options.dtype.empty()) {
    const std::optional<DType> dtype = ParseDType(options.dtype);
    if (!dtype || (*dtype != DType::kF32 && *dtype != DType::kBF16)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dtype = '", options.dtype, "': use f32 or bf16"));
    }
  }
  ESTUARY_RETURN_IF_ERROR(AdvertisedHost(options).status());
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

absl::StatusOr<std::string> AdvertisedHost(const WorkerProcessOptions& options) {
  return process::ResolveAdvertiseAddress(options.advertise_address, options.host,
                                          options.pod_ip);
}

void LogKvCapacity(const char* role, int64_t pages, int block_size, int context_length,
                   int max_num_seqs, int64_t kv_cache_bytes) {
  const int64_t tokens = pages * block_size;
  const int64_t pages_per_sequence = (context_length + block_size - 1) / block_size;
  const int64_t concurrency = pages_per_sequence > 0 ? pages / pages_per_sequence : 0;
  const std::string size = kv_cache_bytes > 0 ? process::FormatByteSize(kv_cache_bytes)
                                              : std::string("sized by --gpu-memory-utilization");
  ESTUARY_LOG(INFO) << role << " KV cache: " << size << " = "
                    << pages << " pages of " << block_size << " tokens = " << tokens
                    << " KV tokens; max-model-len " << context_length << " -> concurrency "
                    << concurrency << " sequences at full length (max-num-seqs "
                    << max_num_seqs << ")";
}

void SetPoolLoad(const KvPool& pool, estuary::v1::WorkerLoad* load) {
  const KvPoolStats stats = pool.Stats();
  load->set_free_pages(stats.free_pages + stats.cached_pages);
  load->set_total_pages(stats.num_pages);
}

absl::StatusOr<std::unique_ptr<ShardedModel>> LoadShardedModel(
    const WorkerProcessOptions& options) {
  LoadOptions load;
  if (!options.dtype.empty()) load.dtype = ParseDType(options.dtype);
  load.max_model_len = options.max_model_len;
  // On a GPU the host weights are only the upload's source: leave them mapped.
  const absl::StatusOr<Device> device = WorkerDevice(options);
  load.copy_mapped_weights = !device.ok() || device->is_cpu();
  ESTUARY_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(options.model, load));
  ShardedModelOptions sharding;
  sharding.tp_size = options.tp_size;
  sharding.debug_stall_rank = options.debug_stall_rank;
  return ShardedModel::Create(std::move(loaded.model), sharding);
}

absl::StatusOr<std::unique_ptr<kvtransfer::Transport>> CreateTransport(
    const WorkerProcessOptions& options) {
  kvtransfer::UcxTransportOptions ucx;
  ucx.tls = options.ucx_tls;
  // The UCX worker address lists the network devices UCX uses: only the advertised address's
  // interface, so that peers on other hosts never try this host's other (or unreachable)
  // addresses. Loopback stays UCX's default choice (UCX ignores lo for tcp).
  ESTUARY_ASSIGN_OR_RETURN(const std::string advertised, AdvertisedHost(options));
  const std::optional<process::InterfaceAddress> interface = process::InterfaceOf(advertised);
  if (interface.has_value() && !interface->loopback) {
    ucx.extra_config.emplace_back("NET_DEVICES", interface->interface);
    // NCCL's bootstrap socket likewise (set once, by the process, before NCCL starts).
    if (options.kv_transport == "nccl") {
      ::setenv("NCCL_SOCKET_IFNAME", interface->interface.c_str(), /*overwrite=*/0);
    }
  }
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

absl::StatusOr<std::string> KvDescriptorKey() {
  ESTUARY_ASSIGN_OR_RETURN(std::string key, rpc::ClusterSubkey(kvtransfer::kDescriptorKeyLabel));
  if (key.empty()) {
    ESTUARY_LOG(WARNING)
        << "no cluster token: KV transfer descriptors are not sealed, so a prefill worker hands "
           "the UCX worker addresses and rkeys it is sent to UCX unchecked (a corrupted one can "
           "crash it); give every process of the cluster --cluster-token (or "
           "$ESTUARY_CLUSTER_TOKEN)";
  }
  return key;
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

namespace {

constexpr absl::Duration kWatchInterval = absl::Milliseconds(100);

// estuary:worker_ready: 1 while the worker takes new work (its health says SERVING).
common::Gauge& ReadyGauge() {
  return common::MetricsRegistry::Global().GetGauge(
      "estuary:worker_ready",
      "1 while this worker is ready: model loaded, engine running and healthy, not draining.");
}

}  // namespace

bool EngineStuck(const StepLoopProgress& progress, const WorkerProcessOptions& options,
                 absl::Time now) {
  return options.engine_watchdog_timeout > absl::ZeroDuration() && progress.running &&
         progress.in_step && now - progress.step_started > options.engine_watchdog_timeout;
}

bool EngineHealthy(const StepLoopProgress& progress, const WorkerProcessOptions& options,
                   bool* failed_for_good, absl::Time now) {
  if (progress.consecutive_failures >= options.max_failed_steps) *failed_for_good = true;
  if (*failed_for_good || !progress.running) return false;
  return !(progress.in_step && now - progress.step_started > options.engine_stall_timeout);
}

absl::Status ServeWorker(const WorkerProcessOptions& options, estuary::v1::WorkerInfo info,
                         WorkerControl& control, const std::vector<grpc::Service*>& services,
                         const WorkerHooks& hooks) {
  const std::string role = info.role() == estuary::v1::WORKER_ROLE_PREFILL ? "prefill" : "decode";
  ESTUARY_ASSIGN_OR_RETURN(const std::string advertised, AdvertisedHost(options));
  ESTUARY_ASSIGN_OR_RETURN(rpc::RunningServer running,
                           rpc::StartGrpcServer(options.host, options.port, services,
                                                WorkerServerLimits(options)));
  const std::string address = process::JoinHostPort(advertised, running.port);
  info.set_address(address);
  info.set_worker_id(DefaultWorkerId(info.role(), address));
  control.set_info(info);
  // Every series of a worker carries vLLM's model_name label (its --model-id).
  common::MetricsRegistry::Global().SetConstantLabels({{"model_name", options.model_id}});
  rpc::MetricsHttpServer metrics;
  if (options.metrics_port >= 0) {
    ESTUARY_RETURN_IF_ERROR(metrics.Start(options.host, options.metrics_port));
    ESTUARY_LOG(INFO) << role << " worker metrics on http://" << metrics.address() << "/metrics";
  }
  if (!options.ready_file.empty()) {
    ESTUARY_RETURN_IF_ERROR(process::WriteReadyFile(options.ready_file, address));
  }
  ESTUARY_LOG(INFO) << role << " worker serving on " << running.address << ", advertised as "
                    << address;

  // Readiness: the watcher turns it on once the engine loop runs and off when the engine
  // stalls, fails, or the worker drains. A change goes to the router at once (a heartbeat out of
  // turn), not at the next beat.
  RegistrationClient registration;
  auto set_ready = [&](bool ready) {
    if (control.ready.exchange(ready) == ready) return;
    running.health.SetReady(ready);
    metrics.SetReady(ready);
    ReadyGauge().Set(ready ? 1 : 0);
    ESTUARY_LOG(INFO) << role << " worker " << (ready ? "ready" : "not ready");
    registration.Nudge();
  };
  bool failed_for_good = false;
  // The first look before registering, so that the registration says ready when it is.
  set_ready(EngineHealthy(hooks.progress(), options, &failed_for_good, absl::Now()));
  std::atomic<bool> stop_watch{false};
  std::thread watcher([&] {
    bool reported = false;
    while (!stop_watch.load()) {
      const StepLoopProgress progress = hooks.progress();
      const bool healthy = EngineHealthy(progress, options, &failed_for_good, absl::Now());
      if (!healthy && progress.running && !reported) {
        ESTUARY_LOG(ERROR) << role << " worker engine unhealthy: "
                           << (failed_for_good
                                   ? absl::StrCat(progress.consecutive_failures,
                                                  " steps failed in a row (--max-failed-steps)")
                                   : absl::StrCat("a step has run longer than ",
                                                  absl::FormatDuration(options.engine_stall_timeout),
                                                  " (--engine-stall-timeout)"));
        reported = true;
      }
      if (healthy) reported = false;
      set_ready(healthy && !control.draining.load());
      if (EngineStuck(progress, options, absl::Now())) {
        // Nothing recovers a rank that stopped: a step never returns (RankThreads waits for
        // every rank). Restarting is the supervisor's job; a non-zero status asks for it.
        ESTUARY_LOG(ERROR) << role << " worker watchdog: a step has run longer than "
                           << absl::FormatDuration(options.engine_watchdog_timeout)
                           << " (--engine-watchdog-timeout): a rank stopped making progress; "
                           << "exiting with status " << kStuckEngineExitStatus
                           << " to be restarted";
        std::fflush(nullptr);
        std::_Exit(kStuckEngineExitStatus);
      }
      absl::SleepFor(kWatchInterval);
    }
  });

  if (!options.router.empty()) {
    registration.Start(options.router, info, [&] {
      estuary::v1::WorkerLoad load = hooks.load();
      load.set_not_ready(!control.ready.load());
      return load;
    });
  }

  process::WaitForTerminationSignal();
  // Drain: no new work from here on; what is placed finishes within the timeout.
  control.draining = true;
  set_ready(false);
  ESTUARY_LOG(INFO) << role << " worker draining (up to "
                    << absl::FormatDuration(options.shutdown_timeout) << ")";
  registration.Unregister();
  const absl::Time deadline = absl::Now() + options.shutdown_timeout;
  bool drained = hooks.drained();
  while (!drained && absl::Now() < deadline) {
    if (process::WaitForTerminationSignal(std::min(deadline, absl::Now() + kWatchInterval))) {
      ESTUARY_LOG(WARNING) << role << " worker: second signal, exiting now";
      std::fflush(nullptr);
      std::_Exit(1);
    }
    drained = hooks.drained();
  }
  if (!drained) {
    ESTUARY_LOG(WARNING) << role << " worker: --shutdown-timeout passed with requests in flight; "
                         << "ending them (UNAVAILABLE)";
    control.ending = true;
    const absl::Time grace = absl::Now() + absl::Seconds(2);
    while (!hooks.drained() && absl::Now() < grace) absl::SleepFor(absl::Milliseconds(20));
  }
  stop_watch = true;
  watcher.join();
  ESTUARY_LOG(INFO) << role << " worker shutting down";
  running.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return absl::OkStatus();
}

}  // namespace estuary::worker
