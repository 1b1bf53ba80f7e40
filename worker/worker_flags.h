#pragma once
// The flags every worker binary takes (--model, --port, --tensor-parallel-size, ...), defined
// once here and read into WorkerProcessOptions (with $POD_IP, which main may read).

#include "absl/flags/declare.h"
#include "absl/time/time.h"
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
ABSL_DECLARE_FLAG(int, block_size);
ABSL_DECLARE_FLAG(int, max_num_seqs);
ABSL_DECLARE_FLAG(int, max_num_batched_tokens);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, kv_transport);
ABSL_DECLARE_FLAG(std::string, advertise_address);
ABSL_DECLARE_FLAG(absl::Duration, shutdown_timeout);
ABSL_DECLARE_FLAG(absl::Duration, engine_stall_timeout);
ABSL_DECLARE_FLAG(int, max_failed_steps);

namespace estuary::worker {

WorkerProcessOptions WorkerProcessOptionsFromFlags();

}  // namespace estuary::worker
