#pragma once
// The flags every worker binary takes (--model, --port, --tensor-parallel-size, ...), defined
// once here and read into WorkerProcessOptions (with $POD_IP, which main may read), and the
// engine sizing both roles share (KvSizingFromFlags). Which flags each binary accepts:
// cli/command_tables.h.

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "process/byte_size.h"
#include "worker/worker_process.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, model_id);
ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(int, tensor_parallel_size);
ABSL_DECLARE_FLAG(std::string, ucx_tls);
ABSL_DECLARE_FLAG(std::string, ready_file);
ABSL_DECLARE_FLAG(std::string, router);
ABSL_DECLARE_FLAG(int64_t, kv_cache_bytes);
ABSL_DECLARE_FLAG(estuary::process::ByteSize, kv_cache_memory);
ABSL_DECLARE_FLAG(double, gpu_memory_utilization);
ABSL_DECLARE_FLAG(int, max_model_len);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(int, block_size);
ABSL_DECLARE_FLAG(int, max_num_seqs);
ABSL_DECLARE_FLAG(int, max_num_batched_tokens);
ABSL_DECLARE_FLAG(int, max_waiting_requests);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, kv_transport);
ABSL_DECLARE_FLAG(std::string, advertise_address);
ABSL_DECLARE_FLAG(absl::Duration, shutdown_timeout);
ABSL_DECLARE_FLAG(absl::Duration, engine_stall_timeout);
ABSL_DECLARE_FLAG(int, max_failed_steps);
ABSL_DECLARE_FLAG(absl::Duration, debug_step_delay);
ABSL_DECLARE_FLAG(absl::Duration, engine_watchdog_timeout);
ABSL_DECLARE_FLAG(int, debug_stall_rank);

namespace estuary::worker {

WorkerProcessOptions WorkerProcessOptionsFromFlags();

// The KV pool's bytes over all TP ranks: --kv-cache-bytes when set (the older spelling, plain
// bytes), else --kv-cache-memory. INVALID_ARGUMENT for a size <= 0, and for
// --gpu-memory-utilization off a CUDA device.
// 0 with --gpu-memory-utilization (the engine sizes the pool on the device; see
// GpuMemoryUtilizationFlag).
absl::StatusOr<int64_t> KvCacheBytesFromFlags(const WorkerProcessOptions& options);
// --gpu-memory-utilization (0: off), for the engines' options; checked by KvCacheBytesFromFlags.
double GpuMemoryUtilizationFlag();
}  // namespace estuary::worker
