#include "worker/worker_flags.h"

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/loader/model_metadata.h"

ABSL_FLAG(std::string, model, "", "model folder (llama2.c or Hugging Face)");
ABSL_FLAG(std::string, model_id, "",
          "name in the KV format fingerprint; default: the model folder's name");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (0.0.0.0: all)");
ABSL_FLAG(std::string, advertise_address, "",
          "address the router and peers dial (registration, KV transport); default: --host, or "
          "when it is a wildcard $POD_IP, else the default-route interface's address");
ABSL_FLAG(absl::Duration, shutdown_timeout, absl::Seconds(30),
          "on SIGTERM: how long requests in flight may take to finish (then UNAVAILABLE)");
ABSL_FLAG(absl::Duration, engine_stall_timeout, absl::Seconds(60),
          "a step running longer than this makes the worker not ready");
ABSL_FLAG(absl::Duration, engine_watchdog_timeout, absl::Seconds(600),
          "a step running longer than this means a rank is stuck: the worker exits with status 3 "
          "so that its supervisor restarts it; 0 = off; at least --engine-stall-timeout");
ABSL_FLAG(int, debug_stall_rank, -1,
          "fault injection for tests: this tensor-parallel rank stops making progress at the "
          "first step, for good (see --engine-watchdog-timeout); -1 = none");
ABSL_FLAG(int, max_failed_steps, 3,
          "this many failed engine steps in a row make the worker not ready until restarted");
ABSL_FLAG(absl::Duration, debug_step_delay, absl::ZeroDuration(),
          "fault injection for tests: each engine step with work first sleeps this long (a slow "
          "or stalled engine; see --engine-stall-timeout)");
ABSL_FLAG(int, port, 0, "gRPC port; 0 = any free port (see --ready-file)");
ABSL_FLAG(int, tensor_parallel_size, 1, "tensor-parallel ranks (threads; cores shared among them)");
ABSL_FLAG(std::string, ucx_tls, "", "UCX transports for KV transfer (e.g. tcp or sm,tcp); "
                                    "empty = UCX's default");
ABSL_FLAG(std::string, ready_file, "", "written with host:port once the worker serves");
ABSL_FLAG(std::string, router, "", "the router's host:port to register with (empty: none)");
ABSL_FLAG(estuary::process::ByteSize, kv_cache_memory,
          estuary::process::ByteSize{int64_t{256} << 20},
          "KV pool size over all TP ranks: bytes, or with a unit (KiB, MiB, GiB, KB, MB, GB); the "
          "worker logs the pages, tokens and concurrency this gives");
ABSL_FLAG(int64_t, kv_cache_bytes, 0,
          "older spelling of --kv-cache-memory in plain bytes; when > 0 it is used instead");
ABSL_FLAG(double, gpu_memory_utilization, 0,
          "CUDA devices only: share of the GPU's memory for weights and KV pool; 0 = off "
          "(--kv-cache-memory sizes the pool)");
ABSL_FLAG(int, max_model_len, 0,
          "prompt + generated tokens per sequence at most (vLLM's name); 0 = the model's context "
          "length; above it: refused");
ABSL_FLAG(std::string, dtype, "",
          "weight dtype at load: f32 or bf16 (default: the file's)");
ABSL_FLAG(int, block_size, 16, "token slots per KV page (prefill and decode must agree)");
ABSL_FLAG(int, max_num_seqs, 64, "sequences admitted at once");
ABSL_FLAG(int, max_num_batched_tokens, 512, "prompt tokens per forward step");
ABSL_FLAG(int, max_waiting_requests, 256,
          "requests waiting beyond --max-num-seqs at most (queued, reserved); beyond: "
          "RESOURCE_EXHAUSTED with a retry hint, and the router places the request elsewhere");
ABSL_FLAG(std::string, device, "cpu",
          "where the engine runs: cpu, or cuda / cuda:N (estuary-decode in a CUDA build)");
ABSL_FLAG(std::string, kv_transport, "ucx",
          "KV page transport: ucx (host memory) or nccl (GPU memory; needs --device cuda)");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics HTTP port on --host; -1 = off, 0 = any free port");

namespace estuary::worker {

WorkerProcessOptions WorkerProcessOptionsFromFlags() {
  WorkerProcessOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  options.model_id = absl::GetFlag(FLAGS_model_id);
  if (options.model_id.empty()) options.model_id = ::estuary::DefaultModelId(options.model);
  options.host = absl::GetFlag(FLAGS_host);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  if (const char* pod_ip = std::getenv("POD_IP"); pod_ip != nullptr) options.pod_ip = pod_ip;
  options.shutdown_timeout = absl::GetFlag(FLAGS_shutdown_timeout);
  options.engine_stall_timeout = absl::GetFlag(FLAGS_engine_stall_timeout);
  options.max_failed_steps = absl::GetFlag(FLAGS_max_failed_steps);
  options.debug_step_delay = absl::GetFlag(FLAGS_debug_step_delay);
  options.engine_watchdog_timeout = absl::GetFlag(FLAGS_engine_watchdog_timeout);
  options.debug_stall_rank = absl::GetFlag(FLAGS_debug_stall_rank);
  options.port = absl::GetFlag(FLAGS_port);
  options.tp_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  options.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
  options.ready_file = absl::GetFlag(FLAGS_ready_file);
  options.router = absl::GetFlag(FLAGS_router);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.device = absl::GetFlag(FLAGS_device);
  options.kv_transport = absl::GetFlag(FLAGS_kv_transport);
  options.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  options.dtype = absl::GetFlag(FLAGS_dtype);
  // A negative --max-waiting-requests becomes 0 in flight, which the validation refuses.
  const int waiting = absl::GetFlag(FLAGS_max_waiting_requests);
  options.max_requests_in_flight = waiting < 0 ? 0 : absl::GetFlag(FLAGS_max_num_seqs) + waiting;
  return options;
}

double GpuMemoryUtilizationFlag() { return absl::GetFlag(FLAGS_gpu_memory_utilization); }

absl::StatusOr<int64_t> KvCacheBytesFromFlags(const WorkerProcessOptions& options) {
  ESTUARY_ASSIGN_OR_RETURN(const Device device, WorkerDevice(options));
  const double utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  if (utilization != 0) {
    if (device.is_cpu()) {
      return absl::InvalidArgumentError(
          "--gpu-memory-utilization applies to a CUDA device (--device cuda); on the CPU size the "
          "KV pool with --kv-cache-memory (e.g. 2GiB)");
    }
    if (!(utilization > 0 && utilization <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpu-memory-utilization = ", utilization, " must be in (0, 1]"));
    }
    return int64_t{0};  // sized on the device, after the weights (GpuMemoryUtilizationFlag)
  }
  const int64_t legacy = absl::GetFlag(FLAGS_kv_cache_bytes);
  if (legacy < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-bytes = ", legacy, " must be > 0 (or 0: use --kv-cache-memory)"));
  }
  const int64_t bytes = legacy > 0 ? legacy : absl::GetFlag(FLAGS_kv_cache_memory).bytes;
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-memory = ", process::FormatByteSize(bytes), " must be > 0"));
  }
  return bytes;
}

}  // namespace estuary::worker
