#pragma once
// What the worker binaries (estuary-prefill, estuary-decode) share between parsing their flags
// and serving: the advertised address, loading the model onto its TP ranks, the KV transport,
// and serving (ServeWorker): truthful health, registration, and a graceful drain on SIGTERM.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/backend/backend.h"
#include "core/common/status_macros.h"
#include "core/common/step_loop.h"
#include "core/kvcache/kv_pool.h"
#include "core/model/sharded_model.h"
#include "estuary/v1/worker.pb.h"
#include "grpcpp/grpcpp.h"
#include "kvtransfer/transport.h"
#include "worker/worker_control.h"

namespace estuary::worker {

struct WorkerProcessOptions {
  std::string model;       // model folder
  std::string model_id;    // KV format fingerprint name; default: the model folder's name
  std::string host = "127.0.0.1";  // the address to bind (0.0.0.0: all)
  // --advertise-address: what peers dial (registration, KV endpoints); empty: `host` unless it
  // is a wildcard, then $POD_IP (pod_ip), then the default-route interface's address.
  std::string advertise_address;
  std::string pod_ip;      // $POD_IP, read by main
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
  // SIGTERM: how long work in flight may take to finish before it is ended with UNAVAILABLE.
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // Health: a step running longer than this while work waits makes the worker not ready.
  absl::Duration engine_stall_timeout = absl::Seconds(60);
  // Health: this many failed engine steps in a row make the worker not ready until restarted.
  int max_failed_steps = 3;
  // --debug-step-delay (fault injection for tests): every engine step that has work sleeps this
  // long first, on the engine thread, as a slow or stalled engine would. Both roles.
  absl::Duration debug_step_delay = absl::ZeroDuration();
  // Watchdog: a step still running after this long means a rank stopped making progress (a
  // stuck tensor-parallel rank never returns, and its step with it): the worker, not ready
  // since engine_stall_timeout, exits with kStuckEngineExitStatus so that its supervisor
  // (Kubernetes, `estuary up`) restarts it. Zero: off. At least engine_stall_timeout.
  absl::Duration engine_watchdog_timeout = absl::Seconds(600);
  // Fault injection for tests (--debug-stall-rank): this TP rank stops making progress at the
  // first step (ShardedModelOptions::debug_stall_rank). -1: none.
  int debug_stall_rank = -1;
  // --max-model-len: the context (prompt + generated tokens) is capped here; 0: the model's.
  // The model is loaded with it (its config's max_seq_len), so the engines refuse longer
  // prompts and end sequences there, and the worker registers this context length.
  int max_model_len = 0;
  // --dtype: "f32" or "bf16" to convert the weights at load; empty: the checkpoint's.
  std::string dtype;
  // Requests on this worker at once (running, waiting, reserved): --max-num-seqs +
  // --max-waiting-requests. The services refuse beyond it with RESOURCE_EXHAUSTED and a retry
  // hint (rpc/overload.h); the server's thread quota is this plus rpc::ServerLimits's control
  // threads, so a stream never waits for a thread.
  int max_requests_in_flight = 64 + 256;
};

// INVALID_ARGUMENT naming the flag.
absl::Status ValidateWorkerProcessOptions(const WorkerProcessOptions& options);
// The parsed --device (INVALID_ARGUMENT for a bad spelling).
absl::StatusOr<Device> WorkerDevice(const WorkerProcessOptions& options);
// The advertised address (process/host_address.h) for these options.
absl::StatusOr<std::string> AdvertisedHost(const WorkerProcessOptions& options);

absl::StatusOr<std::unique_ptr<ShardedModel>> LoadShardedModel(const WorkerProcessOptions& options);

// Logs the KV pool's capacity once the engine exists: pages, tokens, and the sequences of
// `context_length` tokens (--max-model-len, else the model's) that fit at once (vLLM's
// "maximum concurrency"), next to --max-num-seqs.
void LogKvCapacity(const char* role, int64_t pages, int block_size, int context_length,
                   int max_num_seqs, int64_t kv_cache_bytes);
absl::StatusOr<std::unique_ptr<kvtransfer::Transport>> CreateTransport(
    const WorkerProcessOptions& options);
// The key that seals KV transfer descriptors (kvtransfer/descriptor_seal.h), derived from the
// cluster token (rpc::ClusterSubkey; cluster security must be configured first). Without a token
// it is empty (descriptors go unsealed and unchecked) and a warning says so. Both roles call it:
// the decode worker seals with it, the prefill worker verifies.
absl::StatusOr<std::string> KvDescriptorKey();

// Current KV pool figures into a load report (thread-safe: KvPool::Stats()).
void SetPoolLoad(const KvPool& pool, estuary::v1::WorkerLoad* load);

// What a worker tells the router about itself (worker.proto WorkerInfo).
estuary::v1::WorkerInfo MakeWorkerInfo(estuary::v1::WorkerRole role, const std::string& address,
                                       const WorkerProcessOptions& options,
                                       const LlamaConfig& config, int block_size,
                                       const estuary::v1::KvFormatFingerprint& fingerprint);

// The exit status of a worker whose watchdog found the engine stuck (EngineStuck).
inline constexpr int kStuckEngineExitStatus = 3;

// Whether the running step has outlived engine_watchdog_timeout (never when it is zero).
bool EngineStuck(const StepLoopProgress& progress, const WorkerProcessOptions& options,
                 absl::Time now);

// Readiness from the engine loop's progress (ServeWorker's watcher): false until the loop runs,
// while a step has run longer than engine_stall_timeout (true again once it ends), and for good
// once max_failed_steps steps failed in a row (latched in *failed_for_good: restart the worker).
bool EngineHealthy(const StepLoopProgress& progress, const WorkerProcessOptions& options,
                   bool* failed_for_good, absl::Time now);

// What ServeWorker needs from the role's service.
struct WorkerHooks {
  std::function<estuary::v1::WorkerLoad()> load;  // the figures heartbeats carry
  std::function<StepLoopProgress()> progress;     // the engine loop's (health)
  std::function<bool()> drained;                  // no request left in flight (drain)
};

// The hooks of a role's service (DecodeService, PrefillService): its GetLoad figures, its
// engine loop's Progress(), and Drained(). `service` must outlive the hooks.
template <typename RoleService>
WorkerHooks HooksOf(RoleService* service) {
  WorkerHooks hooks;
  hooks.load = [service] {
    estuary::v1::WorkerLoad load;
    (void)service->GetLoad(nullptr, nullptr, &load);
    return load;
  };
  hooks.progress = [service] { return service->Progress(); };
  hooks.drained = [service] { return service->Drained(); };
  return hooks;
}

// Serves a worker until it is told to stop:
//   1. starts the gRPC server with `services` (plus health and reflection) on host:port, and
//      /metrics, /health, /live on metrics_port when set; both say not ready;
//   2. fills `info` (advertised address, worker_id) into `control`, writes the ready file,
//      registers with the router when one is set (heartbeats carrying the load and readiness);
//   3. turns ready once the engine loop runs, and watches it: a step running past
//      engine_stall_timeout makes it not ready until the step ends; max_failed_steps failures
//      in a row make it not ready for good (the router stops placing here; restart it); a step
//      running past engine_watchdog_timeout (a stuck rank) ends the process at once with
//      kStuckEngineExitStatus, logged, so that its supervisor restarts it;
//   4. on SIGINT / SIGTERM: not ready and draining at once, unregisters from the router, waits
//      until `hooks.drained()` or shutdown_timeout (then ends what is left with UNAVAILABLE),
//      and shuts the server down. A second signal exits the process at once (status 1).
absl::Status ServeWorker(const WorkerProcessOptions& options, estuary::v1::WorkerInfo info,
                         WorkerControl& control, const std::vector<grpc::Service*>& services,
                         const WorkerHooks& hooks);

// The end of each worker's Run, once the role's options are complete and its model is loaded:
// the KV transport, the role's service (RoleService::Create(model, transport, options)), one log
// line of its KV capacity, and ServeWorker with the service's control, fingerprint and hooks.
// The transport and the service live until ServeWorker returns.
template <typename RoleService, typename RoleOptions>
absl::Status ServeRoleService(const WorkerProcessOptions& process, estuary::v1::WorkerRole role,
                              const char* role_name, ShardedModel& model,
                              const RoleOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<kvtransfer::Transport> transport,
                           CreateTransport(process));
  ESTUARY_ASSIGN_OR_RETURN(std::unique_ptr<RoleService> service,
                           RoleService::Create(model, *transport, options));
  RoleService* served = service.get();
  LogKvCapacity(role_name, HooksOf(served).load().total_pages(), options.engine.block_size,
                model.config().max_seq_len, options.engine.max_num_seqs,
                options.engine.kv_cache_bytes);
  return ServeWorker(process,
                     MakeWorkerInfo(role, "", process, model.config(), options.engine.block_size,
                                    served->fingerprint()),
                     served->control(), {served}, HooksOf(served));
}

}  // namespace estuary::worker
